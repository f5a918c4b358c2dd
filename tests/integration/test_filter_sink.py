"""The filter's hot path under load: the windowed sink ships commits found by the walking thread on
the event loop with at most `window` in flight (back-pressure blocks the walker), every item
exactly once, the first failure stopping the walk and raised to the handler; and a label the
classifier records before the filter's own record survives it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from cppperf.demo import DemoRepo
from cppperf.services.filter.handlers import on_repo_found
from cppperf.services.filter.links import LinkResolver
from cppperf.services.filter.sink import WindowedSink
from cppperf.shared import messages as m
from cppperf.shared.service import ServiceContext


async def test_ships_every_item_once_with_bounded_concurrency() -> None:
    loop = asyncio.get_running_loop()
    in_flight = 0
    peak = 0
    shipped: list[int] = []

    async def ship(i: int) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.002)
        shipped.append(i)
        in_flight -= 1

    sink: WindowedSink[int] = WindowedSink(loop, ship, window=8)

    def walk() -> None:
        for i in range(200):
            sink.submit(i)

    await asyncio.to_thread(walk)
    await sink.drain()
    assert sorted(shipped) == list(range(200))
    assert 1 < peak <= 8  # concurrent, but never more than the window


async def test_window_one_is_one_at_a_time() -> None:
    loop = asyncio.get_running_loop()
    peak = in_flight = 0

    async def ship(_: int) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1

    sink: WindowedSink[int] = WindowedSink(loop, ship, window=1)
    await asyncio.to_thread(lambda: [sink.submit(i) for i in range(20)])
    await sink.drain()
    assert peak == 1 and sink.submitted == 20


async def test_first_failure_stops_the_walk_and_is_raised() -> None:
    loop = asyncio.get_running_loop()
    failed = threading.Event()

    async def ship(i: int) -> None:
        if i == 5:
            failed.set()
            raise RuntimeError("publish failed: no quorum")

    sink: WindowedSink[int] = WindowedSink(loop, ship, window=2)

    def walk() -> int:
        n = 0
        for i in range(10_000):
            sink.submit(i)
            n += 1
        return n

    with pytest.raises(RuntimeError, match="no quorum"):
        await asyncio.to_thread(walk)  # a later submit sees the failure
    assert failed.is_set() and sink.submitted < 10_000
    with pytest.raises(RuntimeError, match="no quorum"):
        await sink.drain()


async def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        WindowedSink(asyncio.get_running_loop(), lambda _: asyncio.sleep(0), window=0)


@pytest.mark.nats
async def test_a_fast_classifier_label_is_not_overwritten_by_the_filter(
    ctx: ServiceContext, demo_repo: DemoRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The classifier may record a label between the filter's publish and its own record (seen
    in bench/scale.py on a busy cluster): the filter's 'selected' record must not replace it."""
    publish = ctx.bus.publish

    async def publish_then_classify(subject: str, msg: Any, **kw: Any) -> bool:
        fresh = await publish(subject, msg, **kw)
        if subject == m.COMMIT_SELECTED:
            await ctx.store.update(
                "commits", msg.id, repo=msg.repo, sha=msg.sha, stage="classified", label=True
            )
        return fresh

    monkeypatch.setattr(ctx.bus, "publish", publish_then_classify)
    await on_repo_found(ctx, m.RepoFound(repo="local/demo", url=str(demo_repo.path)), LinkResolver())
    records = await ctx.store.all("commits")
    assert len(records) == 8
    assert all(r.get("label") is True and r["stage"] == "classified" for r in records)
