"""Filter wiring: `repo.found` to `handlers.on_repo_found`, with the link resolver chosen here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from faststream.nats import NatsBroker

from cppperf.services.filter.handlers import github_resolver, on_repo_found
from cppperf.services.filter.links import LinkResolver
from cppperf.shared import messages as m
from cppperf.shared.github import GitHubClient
from cppperf.shared.ports import StageContext
from cppperf.shared.service import ServiceContext, subscribe


def resolver_for(
    ctx: StageContext, *, resolver: LinkResolver | None = None, github: GitHubClient | None = None
) -> Callable[[], LinkResolver]:
    """The link resolver for each message: the given one; else GitHub when a client is given or
    `github.fetch_links` is on; else references only (offline). The GitHub client is made once,
    here, and lives as long as the service: its tokens' rate-limit rest state is kept between
    messages (a client per message forgot it)."""
    if resolver is not None:
        given = resolver
        return lambda: given
    client = github or (GitHubClient(ctx.settings.github) if ctx.settings.github.fetch_links else None)
    if client is None:
        return LinkResolver
    shared_client = client
    return lambda: github_resolver(ctx, shared_client, asyncio.get_running_loop())


def register(
    broker: NatsBroker,
    ctx: ServiceContext,
    *,
    resolver: LinkResolver | None = None,
    github: GitHubClient | None = None,
) -> None:
    """Linked texts as `resolver_for` says."""
    pick = resolver_for(ctx, resolver=resolver, github=github)

    async def work(item: m.RepoFound) -> None:
        await on_repo_found(ctx, item, pick())

    subscribe(broker, ctx, subject=m.REPO_FOUND, service="filter", typ=m.RepoFound, work=work)
