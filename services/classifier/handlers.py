"""The classifier's handler, without a broker: `commit.selected` → prefilter + vote →
`commit.classified`; answers are cached in the `cache` bucket (`StoreCache`), so a redelivered
commit is never asked again."""

from __future__ import annotations

from typing import Any

from cppperf.services.classifier.service import Classifier
from cppperf.shared import messages as m
from cppperf.shared.buckets import CACHE, COMMITS
from cppperf.shared.domain import Stage
from cppperf.shared.ports import Records, StageContext


class StoreCache:
    """The classifier's answer cache in the `cache` bucket."""

    def __init__(self, store: Records) -> None:
        self.store = store

    async def get(self, key: str) -> dict[str, Any] | None:
        return await self.store.get(CACHE, key)

    async def put(self, key: str, value: dict[str, Any]) -> None:
        await self.store.put(CACHE, key, value)


async def on_selected(ctx: StageContext, classifier: Classifier, commit: m.CommitSelected) -> bool:
    """Classify one commit; its label."""
    diff = await ctx.store.resolve_text(commit.diff, commit.diff_ref)
    result = await classifier.classify(commit, diff)
    await ctx.bus.publish(m.COMMIT_CLASSIFIED, result)  # before the store marks it: a crash re-publishes
    await ctx.store.update(
        COMMITS.name,
        commit.id,
        repo=commit.repo,  # complete even when this record is written before the filter's
        sha=commit.sha,
        stage=Stage.CLASSIFIED,
        label=result.label,
        backend=result.backend,
        phase=result.phase,
        score=result.score,
    )
    return result.label
