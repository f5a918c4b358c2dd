"""Classifier wiring: `commit.selected` (in batches) to `handlers.on_selected`."""

from __future__ import annotations

from faststream.nats import NatsBroker

from cppperf.services.classifier.handlers import StoreCache, on_selected
from cppperf.services.classifier.service import Classifier
from cppperf.shared import messages as m
from cppperf.shared.service import ServiceContext, subscribe


async def _work(ctx: ServiceContext, clf: Classifier, item: m.CommitSelected) -> None:
    await on_selected(ctx, clf, item)


def register(broker: NatsBroker, ctx: ServiceContext, *, classifier: Classifier | None = None) -> Classifier:
    clf = classifier or Classifier.create(ctx.settings.classifier, StoreCache(ctx.store))
    subscribe(
        broker,
        ctx,
        subject=m.COMMIT_SELECTED,
        service="classifier",
        typ=m.CommitSelected,
        work=lambda item: _work(ctx, clf, item),
        batch_size=ctx.settings.classifier.batch_size,
    )
    return clf
