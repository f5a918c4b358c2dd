"""Builder wiring: `repo.candidate` and `commit.classified` to the handlers in `handlers.py`.

One build or timing job per process at a time: concurrent jobs would time each other. One build
per instance at a time across replicas: the `Claims` port (`shared/claims.py` `KvClaims` on the
`claims` KV bucket unless `register` is given another) held around the handler; a replica that
finds it claimed waits, then gets the recorded result."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from faststream.nats import NatsBroker

from cppperf.services.builder import handlers
from cppperf.services.builder.handlers import BuilderOps, EngineOps, on_candidate, on_classified_claimed
from cppperf.shared import messages as m
from cppperf.shared.claims import KvClaims
from cppperf.shared.ports import Claims
from cppperf.shared.service import ServiceContext, subscribe


@dataclass(frozen=True)
class Wired:
    """What `register` leaves the runtime: `startup` once the subscribers are wired."""

    ctx: ServiceContext
    claims: Claims

    async def startup(self) -> None:
        """Announce this worker (lease) and remove the workspaces of dead attempts."""
        await handlers.startup(self.ctx, self.claims)


def register(
    broker: NatsBroker, ctx: ServiceContext, *, ops: BuilderOps | None = None, claims: Claims | None = None
) -> Wired:
    """`claims`: the leases and workspaces (default: `KvClaims` on this context's store); `ops`:
    the slow work (default: `EngineOps`, the engine in the workspace `claims` gives)."""
    leases = claims or KvClaims(ctx.store)
    work = ops or EngineOps(ctx.settings, leases)
    exclusive = asyncio.Lock()

    async def candidate(item: m.RepoCandidate) -> None:
        async with exclusive:
            await on_candidate(ctx, work, item)

    async def classified(item: m.CommitClassified) -> None:
        await on_classified_claimed(ctx, work, leases, item, exclusive=exclusive)

    subscribe(broker, ctx, subject=m.REPO_CANDIDATE, service="builder", typ=m.RepoCandidate, work=candidate)
    subscribe(
        broker, ctx, subject=m.COMMIT_CLASSIFIED, service="builder", typ=m.CommitClassified, work=classified
    )
    return Wired(ctx, leases)
