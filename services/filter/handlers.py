"""The filter's handler, without a broker: `repo.found` → structural walk → `commit.selected` (one
per selected commit, its diff by `diff_ref` in the object store when large). A history already
walked at the same head is skipped; a commit already in the `commits` bucket is not re-published."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import msgspec

from cppperf.services.filter.links import GitHubLinkResolver, LinkResolver, Reference
from cppperf.services.filter.select import scan_repository
from cppperf.services.filter.sink import WindowedSink
from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.buckets import CACHE, COMMITS, REPOS
from cppperf.shared.domain import CommitState, RepoState, Stage
from cppperf.shared.github import GitHubClient
from cppperf.shared.mirror import ensure_local, rev_parse
from cppperf.shared.ports import StageContext
from cppperf.shared.rules import Rules
from cppperf.shared.service import call_soon_from_thread

Outcome = Literal["already-walked", "walked"]


async def on_repo_found(ctx: StageContext, found: m.RepoFound, resolver: LinkResolver) -> Outcome:
    path: Path = await asyncio.to_thread(ensure_local, found.url, found.repo, ctx.settings.mirror_dir())
    head = await asyncio.to_thread(rev_parse, path)
    prior = await buckets.get(ctx.store, REPOS, found.repo) or RepoState()
    if prior.filter is not None and prior.filter.head == head:
        return "already-walked"  # a redelivery or a repeated repo.found
    loop = asyncio.get_running_loop()

    async def publish(c: m.CommitSelected) -> None:
        diff, ref = await ctx.store.inline_or_ref(f"diff/{c.id}", c.diff)
        if ref:
            c = msgspec.structs.replace(c, diff=diff, diff_ref=ref)
        # Store before publish, and only if absent: a classifier's label is never overwritten
        # (bench/scale.py found a plain put overwriting it on a busy cluster), and a crash between
        # the two re-publishes on the next walk (the stable id drops a duplicate).
        state = CommitState(stage=Stage.SELECTED, repo=c.repo, sha=c.sha)
        await buckets.create(ctx.store, COMMITS, c.id, state)
        rec = await buckets.get(ctx.store, COMMITS, c.id)
        if rec is not None and rec.stage == Stage.SELECTED:  # not yet past the filter
            await ctx.bus.publish(m.COMMIT_SELECTED, c)

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
        REPOS.name,
        found.repo,
        stage=Stage.FILTERED,
        url=found.url,
        filter={**summary.as_dict(), "head": head},
    )
    return "walked"


def github_resolver(ctx: StageContext, client: GitHubClient, loop: asyncio.AbstractEventLoop) -> LinkResolver:
    async def fetch(ref: Reference) -> dict[str, Any] | None:
        key = f"issue/{ref.repo}#{ref.number}"
        cached = await ctx.store.get(CACHE, key)
        if cached is not None:
            data: dict[str, Any] | None = cached.get("data")
            return data
        fresh = await client.issue(ref.repo, ref.number)
        await ctx.store.put(CACHE, key, {"data": fresh})
        return fresh

    return GitHubLinkResolver(lambda ref: call_soon_from_thread(loop, fetch(ref)))
