"""Evaluator wiring: `eval.requested` to `handlers.on_request`; one evaluation at a time per process
(timing runs must not overlap)."""

from __future__ import annotations

import asyncio

from faststream.nats import NatsBroker

from cppperf.services.evaluator.handlers import EvaluatorOps, PipelineOps, on_request
from cppperf.shared import messages as m
from cppperf.shared.service import ServiceContext, subscribe


def register(broker: NatsBroker, ctx: ServiceContext, *, ops: EvaluatorOps | None = None) -> None:
    work = ops or PipelineOps(ctx.settings)
    lock = asyncio.Lock()

    async def on_message(item: m.EvalRequested) -> None:
        async with lock:
            await on_request(ctx, work, item)

    subscribe(
        broker, ctx, subject=m.EVAL_REQUESTED, service="evaluator", typ=m.EvalRequested, work=on_message
    )
