"""Stopping background tasks without hanging: Python 3.11's `asyncio.wait_for` (inside nats-py's
requests) can swallow a cancellation that races with its result, so `task.cancel(); await task`
may wait for ever on a loop that keeps running. Loops here stop on an event, and stopping waits
a bounded time."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(
    task: asyncio.Task[Any], stop: asyncio.Event | None = None, *, within: float = 5.0
) -> None:
    """Ask `task` to end (`stop` set, then cancel), waiting at most `within` seconds."""
    if stop is not None:
        stop.set()
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait({task}, timeout=within)
    if task.done() and not task.cancelled():
        with contextlib.suppress(Exception):
            task.result()


async def sleep_unless(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`; True at once when `stop` is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()
