"""Evaluator wiring: `eval.requested` to `handlers.on_request`; one evaluation at a time per process
(timing runs must not overlap); and the agents' API `eval.api.<agent>.*` (`gateway.answer`), a core
NATS queue subscription shared by the evaluator replicas, answered while an evaluation runs."""

from __future__ import annotations

import asyncio

from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage

from cppperf.services.evaluator import gateway
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

    async def on_agent(msg: NatsMessage) -> None:
        raw = msg.raw_message
        reply = await gateway.answer(ctx, raw.subject, raw.data)
        if raw.reply:  # NATS's reply subject: the asker's own inbox, whatever the body says
            await raw.respond(m.encode(reply))

    broker.subscriber(f"{m.EVAL_API}.*.*", queue="evaluator-api", no_reply=True)(on_agent)
