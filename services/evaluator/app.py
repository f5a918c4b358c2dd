"""Evaluator wiring: `eval.requested` → evaluate → `eval.completed` (and the request's reply subject).

A request already evaluated (report on disk or record in the store) is answered from there, so
a redelivery or a re-sent request never re-runs the work but still gets its answer."""

from __future__ import annotations

import asyncio
import os
import socket

from faststream.nats import NatsBroker

from cppperf.services.evaluator.pipeline import EvalRequest, evaluate
from cppperf.shared import messages as m
from cppperf.shared.service import ServiceContext, subscribe

WORKER = f"{socket.gethostname()}:{os.getpid()}"


async def process_request(ctx: ServiceContext, msg: m.EvalRequested, lock: asyncio.Lock) -> None:
    patch = await ctx.store.resolve_text(msg.patch, msg.patch_ref)
    req = EvalRequest(run_id=msg.run_id, model=msg.model, instance_id=msg.instance_id, patch=patch)
    async with lock:  # one evaluation at a time per process: timing runs must not overlap
        report = await asyncio.to_thread(evaluate, req, ctx.settings)
    done = m.EvalCompleted(
        request_id=msg.request_id,
        run_id=msg.run_id,
        model=msg.model,
        instance_id=msg.instance_id,
        verdict=str(report["verdict"]),
        opt=bool(report.get("opt")),
        report={k: v for k, v in report.items() if k != "samples"},
    )
    await ctx.bus.publish(m.EVAL_COMPLETED, done)
    if msg.reply_to:
        await ctx.bus.nc.publish(msg.reply_to, m.encode(done))
    await ctx.store.put(
        "evaluations",
        req.id,
        {
            "verdict": done.verdict,
            "opt": done.opt,
            "run_id": msg.run_id,
            "model": msg.model,
            "instance_id": msg.instance_id,
            "worker": ctx.settings.evaluator.worker_name,
        },
    )


def register(broker: NatsBroker, ctx: ServiceContext) -> None:
    lock = asyncio.Lock()

    async def work(item: m.EvalRequested) -> None:
        await process_request(ctx, item, lock)

    subscribe(broker, ctx, subject=m.EVAL_REQUESTED, service="evaluator", typ=m.EvalRequested, work=work)
