"""Filter wiring: `repo.found` → structural walk → `commit.selected` (one per selected commit)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import msgspec
from faststream.nats import NatsBroker

from cppperf.services.filter.links import GitHubLinkResolver, LinkResolver, Reference
from cppperf.services.filter.rules import Rules
from cppperf.services.filter.select import scan_repository
from cppperf.services.filter.sink import WindowedSink
from cppperf.shared import messages as m
from cppperf.shared.github import GitHubClient
from cppperf.shared.mirror import ensure_local
from cppperf.shared.service import ServiceContext, call_soon_from_thread, subscribe


def _head(path: Path) -> str:
    proc = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip()


async def process_repo(ctx: ServiceContext, found: m.RepoFound, resolver: LinkResolver) -> None:
    path: Path = await asyncio.to_thread(ensure_local, found.url, found.repo, ctx.settings.mirror_dir())
    head = await asyncio.to_thread(_head, path)
    prior = await ctx.store.get("repos", found.repo) or {}
    if prior.get("filter", {}).get("head") == head:
        return  # this history was already walked: a redelivery or a repeated repo.found
    loop = asyncio.get_running_loop()

    async def publish(c: m.CommitSelected) -> None:
        diff, ref = await ctx.store.inline_or_ref(f"diff/{c.id}", c.diff)
        if ref:
            c = msgspec.structs.replace(c, diff=diff, diff_ref=ref)
        if await ctx.store.get("commits", c.id) is not None:
            return  # selected by an earlier walk (e.g. before the branch moved on)
        await ctx.bus.publish(m.COMMIT_SELECTED, c)
        # Only if absent: a classifier may already have taken the message and recorded its label
        # (bench/scale.py found a plain put overwriting it on a busy cluster).
        await ctx.store.create("commits", c.id, {"stage": "selected", "repo": c.repo, "sha": c.sha})

    # Ship commits while the walk goes on, a bounded window at a time (services/filter/sink.py).
    sink: WindowedSink[m.CommitSelected] = WindowedSink(
        loop, publish, window=max(1, ctx.settings.mining.publish_window)
    )
    try:
        summary = await asyncio.to_thread(
            scan_repository,
            path,
            repo=found.repo,
            url=found.url,
            rules=Rules.from_settings(ctx.settings.mining),
            resolver=resolver,
            emit=sink.submit,
        )
    finally:
        await sink.drain()
    await ctx.store.update(
        "repos", found.repo, stage="filtered", url=found.url, filter={**summary.as_dict(), "head": head}
    )


def github_resolver(
    ctx: ServiceContext, client: GitHubClient, loop: asyncio.AbstractEventLoop
) -> LinkResolver:
    async def fetch(ref: Reference) -> dict[str, Any] | None:
        key = f"issue/{ref.repo}#{ref.number}"
        cached = await ctx.store.get("cache", key)
        if cached is not None:
            data: dict[str, Any] | None = cached.get("data")
            return data
        fresh = await client.issue(ref.repo, ref.number)
        await ctx.store.put("cache", key, {"data": fresh})
        return fresh

    return GitHubLinkResolver(lambda ref: call_soon_from_thread(loop, fetch(ref)))


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
        await process_repo(ctx, item, pick())

    subscribe(broker, ctx, subject=m.REPO_FOUND, service="filter", typ=m.RepoFound, work=work)
