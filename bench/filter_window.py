"""The filter's first limit at scale, before and after: shipping selected commits one at a time
(`mining.publish_window=1`, what the filter did before) vs a bounded window (default 64).

Usage: python bench/filter_window.py [--repos 20] [--rounds 3] [--work DIR]

One filter (`services/filter/handlers.on_repo_found`, the handler's plain logic) against a 3-node
JetStream cluster with R=3 streams and KV (bench/scale_cluster.py), on the generated repositories
of bench/scale.py (generated if missing). Rounds alternate the two settings on fresh repositories
so machine load hits both alike; prints wall and CPU milliseconds per repository and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import load_or_make_repos
from scale_cluster import Cluster

from cppperf.services.filter.handlers import on_repo_found
from cppperf.services.filter.links import LinkResolver
from cppperf.shared import messages as m
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import load_settings
from cppperf.shared.store import Store


async def measure(ctx: ServiceContext, repos: list[Path]) -> tuple[float, float]:
    """Wall and CPU (this process) milliseconds per repository."""
    t0, c0 = time.perf_counter(), time.process_time()
    for path in repos:
        await on_repo_found(ctx, m.RepoFound(repo=f"local/{path.name}", url=str(path)), LinkResolver())
    n = len(repos)
    return (time.perf_counter() - t0) * 1000 / n, (time.process_time() - c0) * 1000 / n


async def main(args: argparse.Namespace) -> None:
    work = Path(args.work)
    needed = 2 * args.rounds * args.repos
    truth = load_or_make_repos(work / "repos", max(needed, 100), 0)
    paths = [Path(t.path) for t in truth][-needed:]  # the scale runs use the first ones
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="filter-window-"))).start()
    results: dict[int, list[tuple[float, float]]] = {1: [], args.window: []}
    try:
        base = load_settings(env={"CPPPERF_BUS_REPLICAS": "3"})
        bus = await cluster.ready(base.bus)
        store = await Store.open(bus.js, replicas=3)
        chunks = [paths[i : i + args.repos] for i in range(0, needed, args.repos)]
        for r in range(args.rounds):
            for j, window in enumerate((1, args.window) if r % 2 == 0 else (args.window, 1)):
                settings = load_settings(
                    env={"CPPPERF_BUS_REPLICAS": "3", "CPPPERF_MINING_PUBLISH_WINDOW": str(window)}
                )
                ctx = ServiceContext(settings=settings, bus=bus, store=store)
                wall, cpu = await measure(ctx, chunks[2 * r + j])
                results[window].append((wall, cpu))
                print(f"round {r + 1} window {window:>3}: {wall:7.1f} ms/repo wall, {cpu:6.1f} ms/repo CPU")
        await bus.close()
    finally:
        cluster.stop()
    before_wall = statistics.median(w for w, _ in results[1])
    after_wall = statistics.median(w for w, _ in results[args.window])
    before_cpu = statistics.median(c for _, c in results[1])
    after_cpu = statistics.median(c for _, c in results[args.window])
    print(
        f"\nmedian of {args.rounds}: window 1 → {args.window}: wall {before_wall:.0f} → {after_wall:.0f} ms/repo "
        f"(**{before_wall / after_wall:.2f}×** faster), CPU {before_cpu:.0f} → {after_cpu:.0f} ms/repo "
        f"({before_cpu / after_cpu:.2f}× less)"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repos", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "cppperf-scale"))
    asyncio.run(main(ap.parse_args()))
