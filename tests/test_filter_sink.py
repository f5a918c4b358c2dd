"""The filter's windowed sink: commits found by the walking thread are shipped on the event loop
with at most `window` in flight (back-pressure blocks the walker), every item exactly once, and
the first failure stops the walk and is raised to the handler."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cppperf.services.filter.sink import WindowedSink


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
