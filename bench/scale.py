"""Scale run: thousands of generated repositories through crawler → filter → classifier on a
3-node JetStream cluster (R=3 streams and KV), 2 replicas per service, one process each.

Usage:
  python bench/scale.py run --repos 1000 [--fault] [--work /tmp/cppperf-scale] [--out RESULT.json]
  python bench/scale.py report RESULT.json... [--plot docs/scale.png]   # README table + plot

`run` generates the repositories once under `--work/repos` (`bench/scale_repos.py`, git
fast-import; reused by later runs), starts the cluster and the services (`cppperf serve filter`,
`cppperf serve classifier` ×2 each; two crawler processes `cppperf serve crawler`, each given half
of the repositories; `mining.validate_latest=false`, the documented short-circuit that publishes
`repo.found` instead of `repo.candidate`, so no builder runs), and watches:
- per stage: throughput, latency from entering the stage's queue to its output (p50/p99; an
  observer's core subscription on each subject sees every publish), per-item service time from
  the replicas' own `handled` log lines;
- peak RSS (`VmHWM`) of every process, the peak size of every stream, KV bucket sizes at the end;
- the funnel, checked exactly against the generator's ground truth: every commit scanned once,
  rejected for the rule the generator broke or selected; every selected commit classified once
  (one message on `commit.classified` per commit id; duplicates are counted and must be 0).
`--fault` kills one NATS node (SIGKILL) and one filter replica mid-way and checks the same funnel.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec
import nats
from nats.js import api as js_api
from nats.js.errors import ServiceUnavailableError
from scale_cluster import Cluster, Proc, start_service
from scale_repos import RepoTruth, make_repos

from cppperf.shared import messages as m
from cppperf.shared.bus import Bus
from cppperf.shared.settings import load_settings
from cppperf.shared.store import Store, decode_key

STREAMS = ["REPO_FOUND", "COMMIT_SELECTED", "COMMIT_CLASSIFIED", "DLQ"]
KV = ["repos", "commits", "cache"]


# ------------------------------------------------------------------------------------------ repos
def load_or_make_repos(root: Path, n: int, seed: int) -> list[RepoTruth]:
    """The first `n` repositories under `root`, generating what is missing (truth kept in JSON)."""
    truth_file = root / "truth.json"
    have: list[RepoTruth] = []
    if truth_file.exists():
        have = [
            RepoTruth(path=t["path"], commits=t["commits"], outcomes=Counter(t["outcomes"]))
            for t in json.loads(truth_file.read_text())
        ]
    if len(have) < n:
        print(f"generating {n} repositories under {root} …", flush=True)
        t0 = time.monotonic()
        if root.exists():
            shutil.rmtree(root)
        have = make_repos(root, n, seed=seed)
        truth_file.write_text(
            json.dumps([{"path": t.path, "commits": t.commits, "outcomes": dict(t.outcomes)} for t in have])
        )
        print(f"  {n} repos, {sum(t.commits for t in have)} commits in {time.monotonic() - t0:.0f} s")
    return have[:n]


# ------------------------------------------------------------------------------------------ observer
@dataclass
class Observer:
    """Arrival time of every publish on the pipeline's subjects (core subscription: sees each
    publish once, including duplicates JetStream drops, so redone work is visible too)."""

    found: dict[str, float] = field(default_factory=dict)
    selected: dict[str, float] = field(default_factory=dict)
    classified: dict[str, float] = field(default_factory=dict)
    filtered: dict[str, float] = field(default_factory=dict)
    republished: Counter[str] = field(default_factory=Counter)

    async def attach(self, nc: nats.NATS) -> None:
        def recorder(book: dict[str, float], subject: str) -> Any:
            async def cb(msg: Any) -> None:
                key = (msg.headers or {}).get("Nats-Msg-Id", "")
                if key in book:
                    self.republished[subject] += 1
                else:
                    book[key] = time.time()

            return cb

        async def on_repo_put(msg: Any) -> None:
            if b'"filtered"' in msg.data:
                repo = decode_key(msg.subject.removeprefix("$KV.repos."))
                self.filtered.setdefault(repo, time.time())

        limits = {"pending_msgs_limit": 2_000_000, "pending_bytes_limit": 1 << 30}
        await nc.subscribe(m.REPO_FOUND, cb=recorder(self.found, m.REPO_FOUND), **limits)
        await nc.subscribe(m.COMMIT_SELECTED, cb=recorder(self.selected, m.COMMIT_SELECTED), **limits)
        await nc.subscribe(m.COMMIT_CLASSIFIED, cb=recorder(self.classified, m.COMMIT_CLASSIFIED), **limits)
        await nc.subscribe("$KV.repos.>", cb=on_repo_put, **limits)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def handled_gaps(log: Path) -> list[float]:
    """Seconds between consecutive `handled` lines of one replica (its per-item service time
    while it is busy)."""
    times = []
    for line in log.read_text(errors="replace").splitlines():
        if '"handled"' in line:
            try:
                times.append(datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp())
            except (ValueError, KeyError):
                continue
    return [b - a for a, b in itertools.pairwise(times)]


# ------------------------------------------------------------------------------------------ reading
async def read_last_per_subject(bus: Bus, stream: str, subjects: str) -> list[Any]:
    """Every current message of a stream (last per subject for KV), read with one ephemeral
    ordered pull consumer in large batches."""
    info = await bus.js.stream_info(stream)
    if not info.state.messages:
        return []
    sub = await bus.js.pull_subscribe(
        subjects,
        stream=stream,
        config=js_api.ConsumerConfig(
            ack_policy=js_api.AckPolicy.NONE,
            deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT
            if stream.startswith("KV_")
            else js_api.DeliverPolicy.ALL,
            inactive_threshold=60.0,
        ),
    )
    try:
        return await fetch_all(sub, 4096)
    finally:
        await sub.unsubscribe()


async def fetch_all(sub: Any, batch_size: int, *, ack: bool = False) -> list[Any]:
    """Fetch until the consumer has nothing pending; a busy cluster may answer a fetch with a
    timeout or 503 (no consumer leader yet): retry those rather than stop short."""
    out: list[Any] = []
    failures = 0
    while True:
        try:
            batch = await sub.fetch(batch_size, timeout=5.0)
        except (TimeoutError, nats.errors.TimeoutError, ServiceUnavailableError):
            batch = []
            failures += 1
        out.extend(batch)
        for msg in batch if ack else []:
            await msg.ack()
        info = await sub.consumer_info()
        if info.num_pending == 0 and (not ack or not info.num_ack_pending):
            return out
        if failures > 20:
            raise RuntimeError(f"could not read the stream: {info.num_pending} messages left")
        if not batch:
            await asyncio.sleep(1.0)


async def drain_output(bus: Bus) -> list[Any]:
    """Every `commit.classified` message, through the builder's durable consumer (a work-queue
    stream admits no second reader); acked as read: the run is over and no builder runs."""
    sub = await bus.js.pull_subscribe_bind("builder", stream="COMMIT_CLASSIFIED")
    try:
        return await fetch_all(sub, 256, ack=True)
    finally:
        await sub.unsubscribe()


class _Classified(msgspec.Struct):
    label: bool


async def check_funnel(bus: Bus, truth: list[RepoTruth]) -> dict[str, Any]:
    """Compare the store and the output stream with the generator's ground truth, exactly."""
    repos = {
        decode_key(r.subject.removeprefix("$KV.repos.")): msgspec.json.decode(r.data)
        for r in await read_last_per_subject(bus, "KV_repos", "$KV.repos.>")
        if r.data
    }
    commits = [
        msgspec.json.decode(r.data)
        for r in await read_last_per_subject(bus, "KV_commits", "$KV.commits.>")
        if r.data
    ]
    out_msgs = await drain_output(bus)
    ids = Counter((r.headers or {}).get("Nats-Msg-Id", "") for r in out_msgs)
    positives = sum(msgspec.json.decode(r.data, type=_Classified).label for r in out_msgs)
    dlq = (await bus.js.stream_info("DLQ")).state.messages

    expected = Counter[str]()
    observed = Counter[str]()
    mismatched_repos = []
    for t in truth:
        repo_id = "local/" + Path(t.path).name
        rec = repos.get(repo_id, {})
        f = rec.get("filter") or {}
        got = Counter(
            {
                "selected": int(f.get("selected", 0)),
                **{k: int(v) for k, v in (f.get("rejected") or {}).items()},
            }
        )
        expected.update(t.outcomes)
        observed.update(got)
        if rec.get("stage") != "filtered" or int(f.get("scanned", -1)) != t.commits or +got != +t.outcomes:
            mismatched_repos.append(repo_id)
    n_selected = expected["selected"]
    result = {
        "repos": len(truth),
        "commits": sum(t.commits for t in truth),
        "scanned": sum(
            int((repos.get("local/" + Path(t.path).name, {}).get("filter") or {}).get("scanned", 0))
            for t in truth
        ),
        "expected": dict(expected),
        "observed": dict(observed),
        "mismatched_repos": mismatched_repos[:20],
        "n_mismatched_repos": len(mismatched_repos),
        "selected_expected": n_selected,
        "commit_records": len(commits),
        "commit_records_classified": sum("label" in c for c in commits),
        "classified_messages": len(out_msgs),
        "classified_unique": len(ids),
        "classified_duplicates": len(out_msgs) - len(ids),
        "positives": positives,
        "dead_letters": dlq,
    }
    result["exact"] = (
        not mismatched_repos
        and result["scanned"] == result["commits"]
        and len(commits) == n_selected
        and result["commit_records_classified"] == n_selected
        and len(out_msgs) == len(ids) == n_selected
        and dlq == 0
    )
    return result


# ------------------------------------------------------------------------------------------ run
async def stream_sizes(bus: Bus) -> dict[str, tuple[int, int]]:
    sizes = {}
    for s in STREAMS + [f"KV_{b}" for b in KV]:
        try:
            st = (await bus.js.stream_info(s)).state
            sizes[s] = (st.messages, st.bytes)
        except Exception:  # no leader for a moment (a node was killed): unknown, not empty
            sizes[s] = (-1, -1)
    return sizes


@dataclass
class Watch:
    """What the watch loop saw: per-stream peaks, a progress timeline, when the fault happened."""

    peak: dict[str, tuple[int, int]] = field(default_factory=lambda: defaultdict(lambda: (0, 0)))
    timeline: list[dict[str, float]] = field(default_factory=list)
    fault_at: float | None = None


async def watch(
    args: argparse.Namespace,
    bus: Bus,
    obs: Observer,
    cluster: Cluster,
    procs: list[Proc],
    t0: float,
    n_repos: int,
) -> Watch:
    """Sample RSS/CPU and stream sizes every second until the crawl is over and both work queues
    stay empty for 3 polls; inject the fault once 40 % of the repositories are filtered."""
    w = Watch()
    crawlers = [p for p in procs if p.name.startswith("crawler")]
    quiet = 0
    t_end = time.monotonic() + args.timeout
    while quiet < 3:
        for p in [*cluster.nodes, *procs]:
            p.sample()
        sizes = await stream_sizes(bus)
        for s, (msgs, nbytes) in sizes.items():
            w.peak[s] = (max(w.peak[s][0], msgs), max(w.peak[s][1], nbytes))
        w.timeline.append(
            {
                "t": time.time() - t0,
                "found": len(obs.found),
                "filtered": len(obs.filtered),
                "selected": len(obs.selected),
                "classified": len(obs.classified),
            }
        )
        if args.fault and w.fault_at is None and len(obs.filtered) >= 0.4 * n_repos:
            w.fault_at = time.time() - t0
            print(f"  fault at {w.fault_at:.1f} s: SIGKILL nats-3 and filter-2", flush=True)
            cluster.nodes[2].kill()
            next(p for p in procs if p.name == "filter-2").kill()
        crawled = all(c.popen.poll() is not None for c in crawlers)
        quiet = quiet + 1 if crawled and sizes["REPO_FOUND"][0] == sizes["COMMIT_SELECTED"][0] == 0 else 0
        if time.monotonic() > t_end:
            print("  timeout: the pipeline did not drain", flush=True)
            break
        if len(w.timeline) % 15 == 0:
            print("  " + " ".join(f"{k} {v:.0f}" for k, v in w.timeline[-1].items()), flush=True)
        await asyncio.sleep(1.0)
    return w


def stage_figures(
    name: str, start: dict[str, float], end: dict[str, float], items: int, unit: str, gaps: list[float]
) -> dict[str, Any]:
    """Throughput over the stage's active span, latency from entering its queue to its output,
    service time from the replicas' consecutive completions."""
    lat = [end[k] - start[k] for k in end if k in start]
    first = min(start.values(), default=0.0)
    last = max(end.values(), default=first)
    return {
        "stage": name,
        "items": items,
        "unit": unit,
        "seconds": last - first,
        "throughput": items / max(last - first, 1e-9),
        "latency_p50": pct(lat, 0.5),
        "latency_p99": pct(lat, 0.99),
        "service_p50": pct(gaps, 0.5),
        "service_p99": pct(gaps, 0.99),
    }


def service_env(args: argparse.Namespace, run_dir: Path, url: str) -> dict[str, str]:
    return {
        "CPPPERF_BUS_REPLICAS": "3",
        "CPPPERF_BUS_ACK_WAIT": str(args.ack_wait),
        "CPPPERF_NATS_URL": url,
        "CPPPERF_MINING_VALIDATE_LATEST": "false",  # the documented short-circuit: no builder
        "CPPPERF_CLASSIFIER_BACKEND": "heuristic",
        "CPPPERF_OUT_DIR": str(run_dir / "out"),
        "CPPPERF_MINING_MIRROR_DIR": str(run_dir / "mirrors"),
        "XDG_DATA_HOME": str(run_dir / "xdg"),
        "CPPPERF_LOG_LEVEL": "info",
        "CPPPERF_CONFIG": str(run_dir / "none.toml"),
        "PYTHONUNBUFFERED": "1",
        **dict(kv.split("=", 1) for kv in args.env),
    }


async def start_services(args: argparse.Namespace, run_dir: Path, env: dict[str, str]) -> list[Proc]:
    """Filter and classifier replicas, once each says it runs (`cppperf serve` prints it)."""
    py = Path(sys.executable)
    procs = [
        start_service(f"{service}-{r}", service, env, run_dir / "logs", python_bin=py)
        for service in ("filter", "classifier")
        for r in range(1, args.replicas + 1)
    ]
    deadline = time.monotonic() + 180
    while not all("running" in p.log.read_text(errors="replace") for p in procs):
        if time.monotonic() > deadline or any(p.popen.poll() is not None for p in procs):
            raise RuntimeError(f"services did not start: see {run_dir / 'logs'}")
        await asyncio.sleep(0.5)
    return procs


def start_crawlers(
    args: argparse.Namespace, run_dir: Path, env: dict[str, str], truth: list[RepoTruth]
) -> list[Proc]:
    """Crawler replica r gets every r-th repository through its own cppperf.toml."""
    crawlers = []
    for r in range(args.replicas):
        conf = run_dir / f"crawler-{r + 1}.toml"
        conf.write_text("[mining]\nrepos = " + json.dumps([t.path for t in truth[r :: args.replicas]]) + "\n")
        crawlers.append(
            start_service(
                f"crawler-{r + 1}",
                "crawler",
                {**env, "CPPPERF_CONFIG": str(conf)},
                run_dir / "logs",
                python_bin=Path(sys.executable),
            )
        )
    return crawlers


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    truth = load_or_make_repos(work / "repos", max(args.repos, args.generate), args.seed)[: args.repos]
    run_dir = work / f"run-{args.tag or args.repos}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "none.toml").write_text("# no settings file: the services read only the environment\n")
    cluster = Cluster(run_dir / "nats").start()
    procs: list[Proc] = []
    try:
        bus = await cluster.ready(load_settings(env={"CPPPERF_BUS_REPLICAS": "3"}).bus)
        await Store.open(bus.js, replicas=3)
        env = service_env(args, run_dir, cluster.url)
        procs = await start_services(args, run_dir, env)
        nc = await nats.connect(cluster.node_url(0), max_reconnect_attempts=-1)
        obs = Observer()
        await obs.attach(nc)
        t0 = time.time()
        procs += start_crawlers(args, run_dir, env, truth)
        w = await watch(args, bus, obs, cluster, procs, t0, len(truth))
        wall = time.time() - t0
        for p in [*cluster.nodes, *procs]:
            p.sample()
        final_sizes = await stream_sizes(bus)
        funnel = await check_funnel(bus, truth)
        await nc.close()
        await bus.close()
    finally:
        for p in procs:
            p.stop()
        cluster.stop()
    every = [*cluster.nodes, *procs]
    disk = {
        n.name: sum(f.stat().st_size for f in (run_dir / "nats" / f"n{i + 1}").rglob("*") if f.is_file())
        for i, n in enumerate(cluster.nodes)
    }
    logs = run_dir / "logs"
    # The crawler is a source: its service time is the gap between one replica's consecutive publishes.
    crawl_gaps = []
    for r in range(args.replicas):
        ts = sorted(obs.found.get("local/" + Path(t.path).name, t0) for t in truth[r :: args.replicas])
        crawl_gaps += [b - a for a, b in itertools.pairwise(ts)]
    crawl = stage_figures("crawler", {}, {}, len(obs.found), "repos", crawl_gaps)
    found_last = max(obs.found.values(), default=t0)
    crawl.update(
        seconds=found_last - t0,
        throughput=len(obs.found) / max(found_last - t0, 1e-9),
        latency_p50=crawl["service_p50"],
        latency_p99=crawl["service_p99"],
    )
    stages = [
        crawl,
        stage_figures(
            "filter",
            obs.found,
            obs.filtered,
            funnel["scanned"],
            "commits",
            [g for log in sorted(logs.glob("filter-*.log")) for g in handled_gaps(log)],
        ),
        stage_figures(
            "classifier",
            obs.selected,
            obs.classified,
            funnel["classified_messages"],
            "commits",
            [g for log in sorted(logs.glob("classifier-*.log")) for g in handled_gaps(log)],
        ),
    ]
    rss: dict[str, int] = defaultdict(int)
    cpu: dict[str, float] = defaultdict(float)
    for p in every:
        key = p.name.rsplit("-", 1)[0]
        rss[key] = max(rss[key], p.peak_kib)
        cpu[key] += p.cpu_seconds
    for s in stages:  # CPU per item: robust to a busy shared machine, unlike wall-clock rates
        s["cpu_seconds"] = cpu[s["stage"]]
        s["cpu_ms_per_item"] = 1000 * cpu[s["stage"]] / max(s["items"], 1)
    return {
        "repos": args.repos,
        "tag": args.tag,
        "fault": args.fault,
        "fault_at": w.fault_at,
        "wall_seconds": wall,
        "replicas": args.replicas,
        "env": args.env,
        "stages": stages,
        "peak_rss_mib": {k: v / 1024 for k, v in rss.items()},
        "peak_rss_per_process_mib": {p.name: p.peak_kib / 1024 for p in every},
        "cpu_seconds": dict(cpu),
        "nats_cpu_ms_per_commit": 1000 * cpu["nats"] / max(funnel["commits"], 1),
        "stream_peak": {s: {"messages": v[0], "bytes": v[1]} for s, v in w.peak.items()},
        "stream_final": {s: {"messages": v[0], "bytes": v[1]} for s, v in final_sizes.items()},
        "nats_disk_bytes": disk,
        "republished": dict(obs.republished),
        "funnel": funnel,
        "timeline": w.timeline[:: max(1, len(w.timeline) // 300)],
    }


def label(r: dict[str, Any]) -> str:
    return str(r.get("tag") or r["repos"])


def print_summary(r: dict[str, Any]) -> None:
    f = r["funnel"]
    print(
        f"\n{label(r)}: {r['repos']} repos, {f['commits']} commits, {f['selected_expected']} selected, "
        f"{f['positives']} positive; wall {r['wall_seconds']:.1f} s; funnel exact: {f['exact']}"
    )
    for s in r["stages"]:
        print(
            f"  {s['stage']:<10} {s['items']:>7} {s['unit']:<7} {s['throughput']:8.1f}/s  "
            f"latency p50 {s['latency_p50']:.3f} s p99 {s['latency_p99']:.3f} s  "
            f"service p50 {s['service_p50'] * 1000:.1f} ms p99 {s['service_p99'] * 1000:.1f} ms  "
            f"CPU {s.get('cpu_ms_per_item', 0):.2f} ms/{s['unit'][:-1]}"
        )
    print("  peak RSS MiB: " + ", ".join(f"{k} {v:.0f}" for k, v in r["peak_rss_mib"].items()))
    print(
        "  stream peak: "
        + ", ".join(
            f"{k} {v['messages']} msgs/{v['bytes'] / 1e6:.1f} MB" for k, v in r["stream_peak"].items()
        )
    )
    if r.get("republished"):
        print(f"  re-published (dropped by dedup): {r['republished']}")
    if not f["exact"]:
        print("  FUNNEL MISMATCH: " + json.dumps({k: v for k, v in f.items() if k != "mismatched_repos"}))


def report(paths: list[Path], plot: Path | None) -> None:
    runs = [json.loads(p.read_text()) for p in paths]
    runs.sort(key=lambda r: (r["fault"], "before" not in label(r), r["repos"]))
    print(
        "| run | commits (selected → positive) | stage | throughput | latency p50 / p99 | service p50 / p99 "
        "| CPU per item | peak RSS MiB | funnel exact |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in runs:
        f = r["funnel"]
        for i, s in enumerate(r["stages"]):
            head = (
                f"| {label(r)} | {f['commits']} ({f['selected_expected']} → {f['positives']}) "
                if i == 0
                else "| | "
            )
            exact = ("yes" if f["exact"] else "**NO**") if i == 0 else ""
            print(
                f"{head}| {s['stage']} | {s['throughput']:.1f} {s['unit']}/s "
                f"| {s['latency_p50']:.2f} / {s['latency_p99']:.2f} s "
                f"| {s['service_p50'] * 1000:.0f} / {s['service_p99'] * 1000:.0f} ms "
                f"| {s.get('cpu_ms_per_item', 0):.2f} ms | {r['peak_rss_mib'].get(s['stage'], 0):.0f} | {exact} |"
            )
    print()
    print(
        "| run | wall s | NATS: peak RSS MiB, CPU ms/commit | COMMIT_SELECTED peak msgs / MB "
        "| COMMIT_CLASSIFIED msgs / MB | KV repos / commits / cache MB | disk per NATS node MB | re-published |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        sp, sf = r["stream_peak"], r["stream_final"]
        disk = max(r["nats_disk_bytes"].values()) / 1e6
        print(
            f"| {label(r)} | {r['wall_seconds']:.0f} "
            f"| {r['peak_rss_mib'].get('nats', 0):.0f}, {r.get('nats_cpu_ms_per_commit', 0):.2f} "
            f"| {sp['COMMIT_SELECTED']['messages']} / {sp['COMMIT_SELECTED']['bytes'] / 1e6:.1f} "
            f"| {sf['COMMIT_CLASSIFIED']['messages']} / {sf['COMMIT_CLASSIFIED']['bytes'] / 1e6:.1f} "
            f"| {sf['KV_repos']['bytes'] / 1e6:.1f} / {sf['KV_commits']['bytes'] / 1e6:.1f} / {sf['KV_cache']['bytes'] / 1e6:.1f} "
            f"| {disk:.0f} | {sum(r.get('republished', {}).values())} |"
        )
    base = sizes_only(runs)
    if len(base) >= 2:
        print("\ngrowth between sizes (×commits → ×CPU per stage, ×peak RSS per service):")
        for a, b in itertools.pairwise(base):
            cr = b["funnel"]["commits"] / a["funnel"]["commits"]
            cpu = [
                f"{k} ×{b['cpu_seconds'][k] / max(a['cpu_seconds'][k], 1e-9):.1f}"
                for k in ("filter", "classifier", "nats")
            ]
            rss = [
                f"{k} ×{b['peak_rss_mib'][k] / max(a['peak_rss_mib'][k], 1e-9):.2f}"
                for k in ("filter", "classifier", "crawler", "nats")
            ]
            print(f"  {label(a)} → {label(b)}: commits ×{cr:.1f}; CPU {', '.join(cpu)}; RSS {', '.join(rss)}")
    if plot:
        make_plot(base, plot)
        print(f"\nplot: {plot}")


def sizes_only(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plain runs of each size (no fault, no before-the-fix baseline), smallest first."""
    return sorted((r for r in runs if not r["fault"] and "before" not in label(r)), key=lambda r: r["repos"])


def make_plot(base: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commits = [r["funnel"]["commits"] for r in base]
    color = {"filter": "tab:blue", "classifier": "tab:orange", "nats": "tab:green", "crawler": "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for svc in ("filter", "classifier", "nats", "crawler"):
        ax.plot(
            commits,
            [r["cpu_seconds"].get(svc, 0) for r in base],
            "o-",
            color=color[svc],
            label=f"{svc} CPU s",
        )
    ax.plot(commits, [r["wall_seconds"] for r in base], "s--", color="black", label="wall s (shared machine)")
    lo, hi = commits[0], commits[-1]
    ref = base[0]["cpu_seconds"]["nats"]
    ax.plot([lo, hi], [ref, ref * hi / lo], ":", color="grey", label="linear")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("commits")
    ax.set_title("cost vs work (all replicas)")
    ax.legend(fontsize=8)
    ax = axes[1]
    for stage in ("filter", "classifier"):
        ax.plot(
            commits,
            [next(s["cpu_ms_per_item"] for s in r["stages"] if s["stage"] == stage) for r in base],
            "o-",
            color=color[stage],
            label=f"{stage} (per {'scanned' if stage == 'filter' else 'selected'} commit)",
        )
    ax.plot(
        commits,
        [r["nats_cpu_ms_per_commit"] for r in base],
        "o-",
        color=color["nats"],
        label="NATS ×3 (per commit)",
    )
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("commits")
    ax.set_title("CPU ms per commit (flat = linear cost)")
    ax.legend(fontsize=8)
    ax = axes[2]
    for svc in ("crawler", "filter", "classifier", "nats"):
        ax.plot(commits, [r["peak_rss_mib"].get(svc, 0) for r in base], "o-", color=color[svc], label=svc)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("commits")
    ax.set_title("peak RSS per process, MiB (flat = bounded)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--repos", type=int, default=100)
    r.add_argument("--generate", type=int, default=0, help="generate this many repos (reused by later runs)")
    r.add_argument("--fault", action="store_true")
    r.add_argument("--tag", default="", help="names the run dir and result (default: the size)")
    r.add_argument("--replicas", type=int, default=2)
    r.add_argument("--ack-wait", type=float, default=20.0)
    r.add_argument("--timeout", type=float, default=3600.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for the services")
    r.add_argument(
        "--work",
        default=os.environ.get("CPPPERF_SCALE_WORK", str(Path(tempfile.gettempdir()) / "cppperf-scale")),
    )
    r.add_argument("--out", default="")
    p = sub.add_parser("report")
    p.add_argument("results", nargs="+", type=Path)
    p.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    if args.cmd == "report":
        report(args.results, args.plot)
        return
    result = asyncio.run(run(args))
    out = Path(args.out or Path(args.work) / f"result-{args.tag or args.repos}.json")
    out.write_text(json.dumps(result, indent=1, default=str))
    print_summary(result)
    print(f"result: {out}")


if __name__ == "__main__":
    main()
