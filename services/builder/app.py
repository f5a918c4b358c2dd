"""Builder wiring: `repo.candidate` and `commit.classified` to the handlers in `handlers.py`.

One build or timing job per process at a time: concurrent jobs would time each other."""

from __future__ import annotations

import asyncio

from faststream.nats import NatsBroker

from cppperf.services.builder.handlers import BuilderOps, EngineOps, on_candidate, on_classified
from cppperf.shared import messages as m
from cppperf.shared.service import ServiceContext, subscribe


def register(broker: NatsBroker, ctx: ServiceContext, *, ops: BuilderOps | None = None) -> None:
    work = ops or EngineOps(ctx.settings)
    exclusive = asyncio.Lock()

    async def candidate(item: m.RepoCandidate) -> None:
        async with exclusive:
            await on_candidate(ctx, work, item)

    async def classified(item: m.CommitClassified) -> None:
        if not item.label:
            await on_classified(ctx, work, item)  # records nothing, returns at once
            return
        async with exclusive:
            await on_classified(ctx, work, item)

    subscribe(broker, ctx, subject=m.REPO_CANDIDATE, service="builder", typ=m.RepoCandidate, work=candidate)
    subscribe(
        broker, ctx, subject=m.COMMIT_CLASSIFIED, service="builder", typ=m.CommitClassified, work=classified
    )
