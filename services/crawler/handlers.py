"""The crawler's handlers (a source, not a consumer: no app.py to wire; `cppperf mine`/`serve
crawler` call these). `submit` checks each repository and publishes
`repo.candidate` (or `repo.found` directly when `mining.validate_latest` is off or no builder runs);
`crawl_search` enumerates GitHub search results and submits those with a root CMakeLists.txt."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cppperf.services.crawler.checks import check_repository
from cppperf.services.crawler.search import search_repositories
from cppperf.services.crawler.sources import candidate_for
from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.buckets import PROGRESS, REPOS
from cppperf.shared.domain import RepoState, Stage
from cppperf.shared.errors import CppPerfError
from cppperf.shared.github import GitHubClient
from cppperf.shared.logging import get_logger
from cppperf.shared.mirror import ensure_local
from cppperf.shared.ports import StageContext

log = get_logger(__name__)


@dataclass
class SubmitReport:
    published: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)


async def submit(
    ctx: StageContext, specs: list[str], *, validate: bool, repo_ids: dict[str, str] | None = None
) -> SubmitReport:
    report = SubmitReport()
    settings = ctx.settings
    for spec in specs:
        try:
            cand = candidate_for(spec)
        except ValueError as exc:
            report.rejected[spec] = str(exc)
            continue
        if repo_ids and spec in repo_ids:
            cand = m.RepoCandidate(repo=repo_ids[spec], url=cand.url, source="github")
        language: str | None = None
        try:
            path: Path = await asyncio.to_thread(ensure_local, cand.url, cand.repo, settings.mirror_dir())
            check = await asyncio.to_thread(check_repository, path)
            reason, language = ("" if check.ok else check.reason), check.language
        except CppPerfError as exc:
            reason = str(exc)
        if reason:
            report.rejected[cand.repo] = reason
            rejected = RepoState(stage=Stage.REJECTED, by="crawler", reason=reason, url=cand.url)
            await buckets.put(ctx.store, REPOS, cand.repo, rejected)
            log.info("repo_rejected", repo=cand.repo, reason=reason)
            continue
        cand = m.RepoCandidate(repo=cand.repo, url=cand.url, source=cand.source, language=language)
        # update, not put: a resumed run keeps what later stages recorded (validated head, walk)
        await ctx.store.update(REPOS.name, cand.repo, stage=Stage.CANDIDATE, url=cand.url, source=cand.source)
        if validate:
            await ctx.bus.publish(m.REPO_CANDIDATE, cand)
        else:
            await ctx.bus.publish(m.REPO_FOUND, m.RepoFound(repo=cand.repo, url=cand.url, validated=False))
        report.published.append(cand.repo)
    return report


class StoreProgress:
    """Search progress in the store's `progress` bucket, one record per query."""

    def __init__(self, ctx: StageContext, key: str) -> None:
        self.ctx = ctx
        self.key = key

    async def _get(self) -> dict[str, Any]:
        return await self.ctx.store.get(PROGRESS, self.key) or {"root": None, "done": {}}

    async def root(self) -> str | None:
        root: str | None = (await self._get())["root"]
        return root

    async def set_root(self, key: str) -> None:
        rec = await self._get()
        rec["root"] = key
        await self.ctx.store.put(PROGRESS, self.key, rec)

    async def done_slices(self) -> set[str]:
        return set((await self._get())["done"])

    async def mark_done(self, key: str, count: int) -> None:
        rec = await self._get()
        rec["done"][key] = count
        await self.ctx.store.put(PROGRESS, self.key, rec)


async def crawl_search(ctx: StageContext, client: GitHubClient, *, validate: bool) -> SubmitReport:
    """Enumerate C++ repositories with ≥ min_stars (not forks, not archived) and submit them."""
    s = ctx.settings.mining
    report = SubmitReport()
    progress = StoreProgress(ctx, f"search/cpp/{s.min_stars}")
    async for item in search_repositories(client, min_stars=s.min_stars, progress=progress):
        repo = str(item["full_name"])
        prior = await buckets.get(ctx.store, REPOS, repo)
        if prior is not None and prior.stage != Stage.REJECTED:
            continue  # known from an earlier crawl
        paths = await client.tree_paths(repo, str(item.get("default_branch") or "HEAD"))
        if "CMakeLists.txt" not in paths:
            reason = "no CMakeLists.txt at the repository root"
            report.rejected[repo] = reason
            await ctx.store.update(REPOS.name, repo, stage=Stage.REJECTED, by="crawler", reason=reason)
            continue
        sub = await submit(
            ctx, [str(item["clone_url"])], validate=validate, repo_ids={str(item["clone_url"]): repo}
        )
        report.published += sub.published
        report.rejected.update(sub.rejected)
    return report
