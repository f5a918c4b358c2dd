"""Crawler wiring: a source, not a consumer. `submit` checks each repository and publishes
`repo.candidate` (or `repo.found` directly when `mining.validate_latest` is off or no builder runs)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from services.crawler.checks import check_repository
from services.crawler.sources import candidate_for
from shared import messages as m
from shared.errors import CppPerfError
from shared.logging import get_logger
from shared.mirror import ensure_local
from shared.service import ServiceContext

log = get_logger(__name__)


@dataclass
class SubmitReport:
    published: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)


async def submit(ctx: ServiceContext, specs: list[str], *, validate: bool) -> SubmitReport:
    report = SubmitReport()
    settings = ctx.settings
    for spec in specs:
        try:
            cand = candidate_for(spec)
        except ValueError as exc:
            report.rejected[spec] = str(exc)
            continue
        language: str | None = None
        try:
            path: Path = await asyncio.to_thread(ensure_local, cand.url, cand.repo, settings.mirror_dir())
            check = await asyncio.to_thread(check_repository, path)
            reason, language = ("" if check.ok else check.reason), check.language
        except CppPerfError as exc:
            reason = str(exc)
        if reason:
            report.rejected[cand.repo] = reason
            await ctx.store.put(
                "repos", cand.repo, {"stage": "rejected", "by": "crawler", "reason": reason, "url": cand.url}
            )
            log.info("repo_rejected", repo=cand.repo, reason=reason)
            continue
        cand = m.RepoCandidate(repo=cand.repo, url=cand.url, source=cand.source, language=language)
        await ctx.store.put(
            "repos", cand.repo, {"stage": "candidate", "url": cand.url, "source": cand.source}
        )
        if validate:
            await ctx.bus.publish(m.REPO_CANDIDATE, cand)
        else:
            await ctx.bus.publish(m.REPO_FOUND, m.RepoFound(repo=cand.repo, url=cand.url, validated=False))
        report.published.append(cand.repo)
    return report
