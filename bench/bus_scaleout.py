"""Scale-out of one durable work queue: 1 worker process vs 4, sleep-bound jobs.

Usage: python bench/bus_scaleout.py [--jobs 200] [--sleep 0.05] [--workers 4] [--json]

Each worker is a separate process running the services' own subscriber (`shared.service.subscribe`,
FastStream pull consumer, manual acks, heartbeats). Prints jobs/s for 1 and N workers, the ratio
(target ≥ 3.6× for 4), and the median publish→handle latency on an idle queue (target < 5 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats
from faststream.nats import NatsBroker

from cppperf.shared import messages as m
from cppperf.shared.bus import Bus
from cppperf.shared.embedded import EmbeddedNats
from cppperf.shared.service import ServiceContext, subscribe
from cppperf.shared.settings import load_settings
from cppperf.shared.store import Store

DONE = "bench.done"


async def worker(url: str, sleep: float) -> None:
    settings = load_settings(env={})
    bus = await Bus.connect(url, settings.bus)
    ctx = ServiceContext(settings=settings, bus=bus, store=await Store.open(bus.js))

    async def work(item: m.RepoFound) -> None:
        handled = time.time_ns()
        await bus.nc.publish(
            DONE, json.dumps({"id": item.repo, "pub": int(item.url), "got": handled}).encode()
        )
        await asyncio.sleep(sleep)

    broker = NatsBroker(url, logger=None)
    subscribe(broker, ctx, subject=m.REPO_FOUND, service="bench", typ=m.RepoFound, work=work)
    await broker.start()
    await bus.nc.publish(DONE, b'{"ready": true}')
    await asyncio.Event().wait()


async def run(url: str, n_workers: int, jobs: int, sleep: float, tag: str) -> dict[str, float]:
    nc = await nats.connect(url)
    done: asyncio.Queue[dict[str, int]] = asyncio.Queue()

    async def on_done(msg: nats.aio.msg.Msg) -> None:
        await done.put(json.loads(msg.data))

    await nc.subscribe(DONE, cb=on_done)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", url, "--sleep", str(sleep)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n_workers)
    ]
    try:
        ready = 0
        while ready < n_workers:
            ready += bool((await asyncio.wait_for(done.get(), 60)).get("ready"))
        bus = await Bus.connect(url, load_settings(env={}).bus)
        # idle latency: one job at a time
        lat = []
        for i in range(30):
            await bus.publish(m.REPO_FOUND, m.RepoFound(repo=f"{tag}/lat{i}", url=str(time.time_ns())))
            d = await asyncio.wait_for(done.get(), 30)
            lat.append((d["got"] - d["pub"]) / 1e6)
            await asyncio.sleep(sleep * 1.5)
        # throughput
        t0 = time.perf_counter()
        for i in range(jobs):
            await bus.publish(m.REPO_FOUND, m.RepoFound(repo=f"{tag}/job{i}", url=str(time.time_ns())))
        for _ in range(jobs):
            await asyncio.wait_for(done.get(), 120)
        while not await bus.drained():
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - t0
        await bus.close()
        return {
            "workers": n_workers,
            "jobs_per_s": round(jobs / elapsed, 1),
            "median_latency_ms": round(statistics.median(lat), 2),
        }
    finally:
        for p in procs:
            p.kill()
            p.wait()
        await nc.close()


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as d, EmbeddedNats(Path(d)) as server:
        bus = await Bus.connect(server.url, load_settings(env={}).bus)
        await bus.provision()
        await bus.close()
        one = await run(server.url, 1, args.jobs, args.sleep, "one")
        many = await run(server.url, args.workers, args.jobs, args.sleep, "many")
    return {
        "one": one,
        "many": many,
        "ratio": round(many["jobs_per_s"] / one["jobs_per_s"], 2),
        "jobs": args.jobs,
        "sleep_s": args.sleep,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--sleep", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", metavar="URL")
    args = ap.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker, args.sleep))
        return
    res = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(res))
        return
    one, many = res["one"], res["many"]
    print(f"{'workers':>8} {'jobs/s':>10} {'median publish→handle':>24}")
    for r in (one, many):
        print(f"{r['workers']:>8} {r['jobs_per_s']:>10} {r['median_latency_ms']:>21} ms")  # type: ignore[index]
    print(
        f"scale-out ratio {res['ratio']}× (target ≥ 3.6× for 4 workers; {res['jobs']} jobs × {res['sleep_s']} s)"
    )


if __name__ == "__main__":
    main()
