"""A worker process for the crash test: consumes repo.found with the project's policy; each job
writes a `started-<pid>` marker, sleeps, then records its effect once in the store.

Usage: python -m tests.worker_proc NATS_URL MARKER_DIR SLEEP_SECONDS
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from faststream.nats import NatsBroker

from cppperf.shared import messages as m
from cppperf.shared.bus import Bus
from cppperf.shared.service import ServiceContext, subscribe
from cppperf.shared.settings import load_settings
from cppperf.shared.store import Store


async def main(url: str, marker_dir: Path, sleep: float) -> None:
    settings = load_settings(env={}, bus={"ack_wait": 2.0, "max_deliver": 5, "nak_delay": 0.2})
    bus = await Bus.connect(url, settings.bus)
    store = await Store.open(bus.js)
    ctx = ServiceContext(settings=settings, bus=bus, store=store)

    async def work(item: m.RepoFound) -> None:
        if await store.get("repos", item.repo) is not None:
            return  # idempotent: effect already recorded
        (marker_dir / f"started-{os.getpid()}").write_text(item.repo)
        await asyncio.sleep(sleep)
        created = await store.create("repos", item.repo, {"effect_by": os.getpid()})
        (marker_dir / f"effect-{os.getpid()}").write_text(str(created))

    broker = NatsBroker(url, logger=None)
    subscribe(broker, ctx, subject=m.REPO_FOUND, service="filter", typ=m.RepoFound, work=work)
    await broker.start()
    (marker_dir / f"ready-{os.getpid()}").write_text("")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])))
