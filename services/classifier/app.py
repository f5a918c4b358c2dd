"""Classifier wiring: `commit.selected` (in batches) → prefilter + vote → `commit.classified`."""

from __future__ import annotations

from typing import Any

from faststream.nats import NatsBroker

from cppperf.services.classifier.service import Classifier
from cppperf.shared import messages as m
from cppperf.shared.service import ServiceContext, subscribe
from cppperf.shared.store import Store


class StoreCache:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def get(self, key: str) -> dict[str, Any] | None:
        return await self.store.get("cache", key)

    async def put(self, key: str, value: dict[str, Any]) -> None:
        await self.store.put("cache", key, value)


async def process_commit(ctx: ServiceContext, classifier: Classifier, commit: m.CommitSelected) -> None:
    diff = await ctx.store.resolve_text(commit.diff, commit.diff_ref)
    result = await classifier.classify(commit, diff)
    await ctx.store.update(
        "commits",
        commit.id,
        repo=commit.repo,  # complete even when this record is written before the filter's
        sha=commit.sha,
        stage="classified",
        label=result.label,
        backend=result.backend,
        phase=result.phase,
        score=result.score,
    )
    await ctx.bus.publish(m.COMMIT_CLASSIFIED, result)


def register(broker: NatsBroker, ctx: ServiceContext, *, classifier: Classifier | None = None) -> Classifier:
    clf = classifier or Classifier.create(ctx.settings.classifier, StoreCache(ctx.store))
    subscribe(
        broker,
        ctx,
        subject=m.COMMIT_SELECTED,
        service="classifier",
        typ=m.CommitSelected,
        work=lambda item: process_commit(ctx, clf, item),
        batch_size=ctx.settings.classifier.batch_size,
    )
    return clf
