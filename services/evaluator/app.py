"""Evaluator wiring: `eval.requested` to `handlers.on_request`, agents served in turn
(`shared.fair`: one consumer per agent, least recently served first), one evaluation at a time
per process (timing runs must not overlap); and the agents' API `eval.api.<agent>.*`
(`api.AgentApi`: a core NATS queue subscription shared by the evaluator replicas, answered by
`gateway.answer` while an evaluation runs). `validate.requested` (gold validation: two evaluations)
goes to `handlers.on_validate`, in turn with the agents' evaluations (one lock per process)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from faststream.nats import NatsBroker

from cppperf.services.evaluator import gateway
from cppperf.services.evaluator.api import QUEUE as API_QUEUE
from cppperf.services.evaluator.api import AgentApi
from cppperf.services.evaluator.handlers import (
    EvaluatorOps,
    PipelineOps,
    ValidatorOps,
    on_request,
    on_validate,
)
from cppperf.services.evaluator.pipeline import remove_stale_workspaces
from cppperf.shared import messages as m
from cppperf.shared.fair import FairQueue, subscribe_fair
from cppperf.shared.service import ServiceContext, subscribe
from cppperf.shared.settings import Settings


class Ops(EvaluatorOps, ValidatorOps, Protocol):
    """Both halves of the evaluator's slow work (tests pass a stand-in)."""


class Wired:
    """What `register` started: the agents' work queues and their API (closed on the way out)."""

    def __init__(self, fair: FairQueue, api: AgentApi, settings: Settings) -> None:
        self.fair = fair
        self.api = api
        self.settings = settings

    async def startup(self) -> None:
        # before consuming: workspaces of evaluations whose evaluator died (their lock not held)
        await asyncio.to_thread(remove_stale_workspaces, self.settings)
        await self.api.subscribed()  # `run_services` starts consuming once agents can be answered

    async def close(self) -> None:
        await self.api.close()  # no new requests first, then the work
        await self.fair.close()


def register(broker: NatsBroker, ctx: ServiceContext, *, ops: Ops | None = None) -> Wired:
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

    api = AgentApi(ctx, gate)
    ctx.liveness.check("evaluator", API_QUEUE, api.problem)  # its own connection: in the heartbeat
    api.start()
    return Wired(fair, api, ctx.settings)  # `run_services` closes both on the way out
