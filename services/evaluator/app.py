"""Evaluator wiring: `eval.requested` to `handlers.on_request`, agents served in turn
(`shared.fair`: one consumer per agent, least recently served first), one evaluation at a time
per process (timing runs must not overlap); and the agents' API `eval.api.<agent>.*` (`gateway.answer`), a core
NATS queue subscription shared by the evaluator replicas, answered while an evaluation runs. `validate.requested` (gold validation: two evaluations) goes to
`handlers.on_validate`, in turn with the agents' evaluations (one lock per process)."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from faststream.message import StreamMessage
from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage

from cppperf.services.evaluator import gateway
from cppperf.services.evaluator.handlers import (
    EvaluatorOps,
    PipelineOps,
    ValidatorOps,
    on_request,
    on_validate,
)
from cppperf.shared import messages as m
from cppperf.shared.fair import FairQueue, subscribe_fair
from cppperf.shared.service import ServiceContext, subscribe


async def raw_body(msg: StreamMessage[Any]) -> bytes:
    """An agent's request as it came: only `gateway.answer` decodes it."""
    return msg.body


class Ops(EvaluatorOps, ValidatorOps, Protocol):
    """Both halves of the evaluator's slow work (tests pass a stand-in)."""


def register(broker: NatsBroker, ctx: ServiceContext, *, ops: Ops | None = None) -> FairQueue:
    work: Ops = ops or PipelineOps(ctx.settings)
    one_at_a_time = asyncio.Lock()  # an evaluation and a validation never build or time together

    async def on_message(item: m.EvalRequested) -> None:  # the scheduler runs one at a time
        async with one_at_a_time:
            await on_request(ctx, work, item)

    async def on_validate_message(item: m.ValidateRequested) -> None:
        async with one_at_a_time:
            await on_validate(ctx, work, item)

    subscribe(
        broker,
        ctx,
        subject=m.VALIDATE_REQUESTED,
        service="evaluator",
        typ=m.ValidateRequested,
        work=on_validate_message,
    )

    fair = subscribe_fair(
        ctx, subject=m.EVAL_REQUESTED, service="evaluator", typ=m.EvalRequested, work=on_message
    )

    rate = ctx.settings.evaluator.agent_api_rate
    gate = gateway.RateGate(rate) if rate > 0 else None  # 0: no limit

    async def on_agent(msg: NatsMessage) -> None:
        raw = msg.raw_message
        reply = await gateway.answer(ctx, raw.subject, raw.data, gate)
        if raw.reply:  # NATS's reply subject: back into the asker's own account, whatever the body says
            await raw.respond(m.encode(reply))

    # no_reply: FastStream would publish a second (empty) response, which `allow_responses` refuses;
    # decoder: the body stays bytes for `gateway.answer` (FastStream's own decoder would parse the
    # agent's bytes as JSON or text first and fail on deep nesting or a lying content-type header,
    # leaving the agent without an answer)
    broker.subscriber(f"{m.EVAL_API}.*.*", queue="evaluator-api", no_reply=True, decoder=raw_body)(on_agent)
    return fair  # `run_services` closes it on the way out
