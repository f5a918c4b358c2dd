"""Filter wiring: `repo.found` to `handlers.on_repo_found`, with the link resolver chosen here."""

from __future__ import annotations

import asyncio

from faststream.nats import NatsBroker

from cppperf.services.filter.handlers import github_resolver, on_repo_found
from cppperf.services.filter.links import LinkResolver
from cppperf.shared import messages as m
from cppperf.shared.github import GitHubClient
from cppperf.shared.service import ServiceContext, subscribe


def register(
    broker: NatsBroker,
    ctx: ServiceContext,
    *,
    resolver: LinkResolver | None = None,
    github: GitHubClient | None = None,
) -> None:
    """Linked texts: the given resolver; else GitHub when a client is given or `github.fetch_links`
    is on; else references only (offline)."""

    def pick() -> LinkResolver:
        if resolver is not None:
            return resolver
        if github is not None or ctx.settings.github.fetch_links:
            client = github or GitHubClient(ctx.settings.github)
            return github_resolver(ctx, client, asyncio.get_running_loop())
        return LinkResolver()

    async def work(item: m.RepoFound) -> None:
        await on_repo_found(ctx, item, pick())

    subscribe(broker, ctx, subject=m.REPO_FOUND, service="filter", typ=m.RepoFound, work=work)
