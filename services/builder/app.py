"""Builder wiring: `repo.candidate` and `commit.classified` to the handlers in `handlers.py`.

One build or timing job per process at a time: concurrent jobs would time each other. One build
per instance at a time across replicas: a claim in KV (`shared/claims.py`) held around the
handler; a replica that finds it claimed waits, then gets the recorded result."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from faststream.nats import NatsBroker

from cppperf.services.builder.handlers import (
    BuilderOps,
    EngineOps,
    on_candidate,
    on_classified,
    request_validation,
)
from cppperf.shared import claims
from cppperf.shared import messages as m
from cppperf.shared.logging import get_logger
from cppperf.shared.results import republish_finished
from cppperf.shared.service import ServiceContext, subscribe

log = get_logger(__name__)


async def startup(ctx: ServiceContext) -> None:
    """Announce this worker (lease) and remove the workspaces of dead attempts."""
    s = ctx.settings
    await claims.worker_lease(ctx.store, lease=s.bus.claim_lease)
    claims.own_workspace(s.work_dir(), owner=s.run_owner())
    await claims.clean_stale_workspaces(ctx.store, s.work_dir(), owner=s.run_owner())


@dataclass(frozen=True)
class Wired:
    """What `register` leaves the runtime: `startup` once the subscribers are wired."""

    ctx: ServiceContext

    async def startup(self) -> None:
        await startup(self.ctx)


def register(broker: NatsBroker, ctx: ServiceContext, *, ops: BuilderOps | None = None) -> Wired:
    work = ops or EngineOps(ctx.settings)
    exclusive = asyncio.Lock()

    async def candidate(item: m.RepoCandidate) -> None:
        async with exclusive:
            await on_candidate(ctx, work, item)

    async def classified(item: m.CommitClassified) -> None:
        if not item.label:
            await on_classified(ctx, work, item)  # records nothing, returns at once
            return
        iid = m.instance_id(item.commit.repo, item.commit.sha)
        if await republish_finished(ctx, iid):
            await request_validation(ctx, iid)  # `builder.validate_gold`, if not validated yet
            return  # finished earlier: a redelivery or a second request gets that result

        async def busy(holder: str) -> None:
            log.info("instance_claimed_elsewhere", instance=iid, holder=holder)

        lease = ctx.settings.bus.claim_lease
        async with claims.held(ctx.store, f"instance/{iid}", holder=claims.TOKEN, lease=lease, wait=busy):
            await claims.clean_stale_workspaces(  # e.g. a dead holder's
                ctx.store, ctx.settings.work_dir(), owner=ctx.settings.run_owner()
            )
            async with exclusive:
                await on_classified(ctx, work, item)

    subscribe(broker, ctx, subject=m.REPO_CANDIDATE, service="builder", typ=m.RepoCandidate, work=candidate)
    subscribe(
        broker, ctx, subject=m.COMMIT_CLASSIFIED, service="builder", typ=m.CommitClassified, work=classified
    )
    return Wired(ctx)
