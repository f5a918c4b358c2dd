"""Shipping a walk's selected commits with bounded concurrency and back-pressure.

The walk runs in a worker thread and finds commits much faster than they can be shipped one at a
time: each is a KV read, a JetStream publish and a KV write, three round trips to an R=3 cluster.
Waiting for all three before walking on made the filter the pipeline's first limit (bench/scale.py:
≈ 90 commits/s for two replicas). `WindowedSink` keeps up to `window` commits in flight on the
event loop and blocks the walking thread while `window` are outstanding, so memory stays bounded
whatever the history length. Each commit's own steps keep their order (check, publish, mark), so a
crash never loses a result; the first failure stops further submissions and is raised by `drain`
(the handler then naks and the repository is walked again; ids dedup what was already sent).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class WindowedSink(Generic[T]):
    """`submit` (from a worker thread) runs `handle(item)` on `loop`, at most `window` at once."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, handle: Callable[[T], Awaitable[None]], *, window: int
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._loop = loop
        self._handle = handle
        self._slots = threading.BoundedSemaphore(window)
        self._futures: list[concurrent.futures.Future[None]] = []
        self._error: BaseException | None = None
        self.submitted = 0

    def submit(self, item: T) -> None:
        """Queue `item`; blocks the calling thread while `window` items are in flight."""
        self._slots.acquire()
        if self._error is not None:
            self._slots.release()
            raise self._error
        self._futures = [f for f in self._futures if not f.done()]  # failures live in _error
        self._futures.append(asyncio.run_coroutine_threadsafe(self._run(item), self._loop))
        self.submitted += 1

    async def _run(self, item: T) -> None:
        try:
            await self._handle(item)
        except BaseException as exc:
            if self._error is None:
                self._error = exc
            raise
        finally:
            self._slots.release()

    async def drain(self) -> None:
        """Wait for everything submitted; raise the first failure, if any."""
        pending = [asyncio.wrap_future(f) for f in self._futures]
        self._futures = []
        await asyncio.gather(*pending, return_exceptions=True)
        if self._error is not None:
            raise self._error
