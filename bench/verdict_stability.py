"""Do verdicts hold on a busy build node? Repeated builds under a build node's load, per metric.

Usage: python bench/verdict_stability.py [--k 10] [--runs 31] [--loops-per-core 3] [--no-load]
                                         [--no-replica] [--budget-min 25] [--json]

Load (the issue's "build node"): `--loops-per-core` × cores compile loops (`g++ -O2` on a real,
template-heavy translation unit of libstdc++: <regex>, <map>, <algorithm>, iostreams) and a second
cppperf replica proving the demo's speed-up over and over at the same time (its own process, the
same host-wide lease directory: with one timing core the replicas take turns on it).

Scenarios, each built and proved from scratch K times (interleaved: a, b, c, a, b, c, …):
  (a) the demo's 2× speed-up of `spin` (expected: improved),
  (b) a planted 10 % speed-up in one test (`work`) of a generated repo (expected: improved),
  (c) A/A: a commit against itself (expected: not flagged).
Per metric (cpu, wall) the same runs are decided again offline on that metric (no confirmation
re-runs, so both metrics see identical samples); `builder` is the builder's own verdict with the
default settings (cpu, confirmation). Printed: detection rate, A/A false positives, median CI
width of the target test's ratio (95 % bootstrap), and wall/CPU stretch (how loaded the core was).
Targets (default metric, under load): (a) 10/10, (b) ≥ 9/10, (c) 0 flagged.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cppperf.demo import DemoRepo, create_demo_repo
from cppperf.services.builder.instance import InstanceResult, prove
from cppperf.services.filter.links import LinkResolver
from cppperf.services.filter.select import to_message
from cppperf.services.filter.walk import commit_details, iter_commits
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.engine.leases import lease_dir as lease_dir_of
from cppperf.shared.engine.sandbox import mount_namespace_available
from cppperf.shared.engine.stats import compare_all, verdict
from cppperf.shared.messages import instance_id
from cppperf.shared.settings import BuilderSettings, load_settings

HEAVY_TU = """\
#include <algorithm>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

std::map<std::string, int> count_words(const std::string& text) {
  std::map<std::string, int> out;
  std::regex word("[A-Za-z]+");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator(); ++it)
    ++out[it->str()];
  return out;
}

int main(int argc, char** argv) {
  std::ostringstream all;
  for (int i = 1; i < argc; ++i) all << argv[i] << ' ';
  auto counts = count_words(all.str());
  std::vector<std::pair<std::string, int>> v(counts.begin(), counts.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second > b.second; });
  std::unordered_map<int, std::vector<std::string>> by;
  for (auto& [w, n] : v) by[n].push_back(w);
  for (auto& [w, n] : v) std::cout << w << ' ' << n << '\\n';
  return static_cast<int>(by.size());
}
"""

WORK_CPP = """\
#include "work.h"
static volatile unsigned long long sink;
unsigned long long work(unsigned long long iters) {{
  unsigned long long x = 88172645463325252ull;
  for (unsigned long long i = 0; i < {loop}; ++i) {{ x ^= x << 13; x ^= x >> 7; x ^= x << 17; sink = x; }}
  return x | 1;
}}
unsigned long long steady(unsigned long long iters) {{
  unsigned long long x = 2463534242ull;
  for (unsigned long long i = 0; i < iters; ++i) {{ x ^= x << 7; x ^= x >> 9; sink = x; }}
  return x | 1;
}}
"""

PLANTED_FILES = {
    "CMakeLists.txt": """\
cmake_minimum_required(VERSION 3.16)
project(planted CXX)
enable_testing()
add_library(work src/work.cpp)
target_include_directories(work PUBLIC include)
add_executable(t_work tests/t_work.cpp)
target_link_libraries(t_work work)
add_test(NAME work COMMAND t_work)
add_executable(t_steady tests/t_steady.cpp)
target_link_libraries(t_steady work)
add_test(NAME steady COMMAND t_steady)
""",
    "include/work.h": "unsigned long long work(unsigned long long);\nunsigned long long steady(unsigned long long);\n",
    "tests/t_work.cpp": '#include "work.h"\nint main() { return work(60000000ull) == 0; }\n',
    "tests/t_steady.cpp": '#include "work.h"\nint main() { return steady(40000000ull) == 0; }\n',
}


def planted_repo(path: Path) -> tuple[Path, str, str]:
    """A generated repo whose second commit makes the `work` test's loop 10 % shorter."""
    repo = DemoRepo(path)
    path.mkdir(parents=True)
    repo.git("init", "-q", "-b", "main")
    base = repo.commit(
        "base",
        "Initial",
        {**PLANTED_FILES, "src/work.cpp": WORK_CPP.format(loop="iters")},
        date="2024-01-01T10:00:00+00:00",
    )
    perf = repo.commit(
        "perf",
        "Skip the last tenth of the work loop",
        {"src/work.cpp": WORK_CPP.format(loop="iters - iters / 10")},
        date="2024-01-02T10:00:00+00:00",
    )
    return path, base, perf


def commit_msg(repo: Path, sha: str, parent: str | None = None) -> Any:
    header = next(iter_commits(repo, f"{sha}^!"))
    if parent is not None:
        header = type(header)(
            header.sha, (parent,), header.date, header.author, header.message, header.changes
        )
    details = next(commit_details(repo, [header]))
    return to_message(f"local/{repo.name}", str(repo), header, details, LinkResolver())


def run_scenario(repo: Path, commit: Any, settings: BuilderSettings, work: Path, aa: bool) -> InstanceResult:
    backend = make_backend(settings, work, source=(repo, commit.sha, commit.date))
    try:
        return prove(
            instance_id(commit.repo, commit.sha),
            backend,
            settings,
            sides={"old": commit.parent, "new": commit.sha},
            repo_path=repo,
            time_identical=aa,  # A/A: identical binaries on purpose; time them anyway
        )
    finally:
        backend.cleanup()


def offline(res: InstanceResult, metric: str, settings: BuilderSettings) -> tuple[str, dict[str, float]]:
    """The verdict (our rule) and each test's CI width when `metric` decides every test."""
    meas = res.measurement
    if meas is None or meas.failure is not None:
        return res.verdict, {}
    decided = compare_all(
        {n: s.pair(metric) for n, s in meas.samples.items()},
        alpha=settings.alpha,
        min_improvement=settings.min_improvement,
        resamples=settings.bootstrap_resamples,
        seed=settings.seed,
    )
    return verdict(decided), {t.name: t.ci_high - t.ci_low for t in decided}


def start_load(loops_per_core: int, tmp: Path) -> list[subprocess.Popen[bytes]]:
    src = tmp / "heavy.cpp"
    src.write_text(HEAVY_TU)
    loop = f'while true; do g++ -O2 -c "{src}" -o /dev/null; done'
    n = loops_per_core * (os.cpu_count() or 1)
    return [subprocess.Popen(["sh", "-c", loop], start_new_session=True) for _ in range(n)]


REPLICA = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bench.verdict_stability import commit_msg, run_scenario
from cppperf.shared.settings import load_settings
repo, work = Path(sys.argv[2]), Path(sys.argv[3])
s = load_settings(env={}, builder={"runs": 11, "work_dir": str(work), "lease_dir": sys.argv[4]}).builder
commit = commit_msg(repo, sys.argv[5])
n = 0
while True:
    res = run_scenario(repo, commit, s, work / "replica", aa=False)
    n += 1
    print(n, res.verdict, res.environment.leased_core, flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--runs", type=int, default=31)
    ap.add_argument("--loops-per-core", type=int, default=3)
    ap.add_argument("--no-load", action="store_true")
    ap.add_argument("--no-replica", action="store_true")
    ap.add_argument("--budget-min", type=float, default=25.0, help="stop starting new rounds after this")
    ap.add_argument("--lease-dir", default="", help="default: the host-wide builder.lease_dir")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="verdict-stability-"))
    # the host-wide lease directory: the replica and any other cppperf process here respect it
    lease_dir = Path(args.lease_dir or lease_dir_of(BuilderSettings()))
    demo = create_demo_repo(tmp / "demo", extra_kinds=False)
    planted, p_base, p_perf = planted_repo(tmp / "planted")
    s = load_settings(
        env={}, builder={"runs": args.runs, "work_dir": str(tmp / "work"), "lease_dir": str(lease_dir)}
    ).builder
    scenarios = {
        "a_demo_2x": (demo.path, commit_msg(demo.path, demo.shas["perf"]), False, "spin"),
        "b_planted_10pct": (planted, commit_msg(planted, p_perf), False, "work"),
        "c_aa": (planted, commit_msg(planted, p_base, parent=p_base), True, "work"),
    }
    del p_base
    procs: list[subprocess.Popen[bytes]] = []
    replica_log = tmp / "replica.log"
    if not args.no_load:
        procs += start_load(args.loops_per_core, tmp)
    if not args.no_replica:
        with replica_log.open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        REPLICA,
                        str(Path(__file__).resolve().parents[1]),
                        str(demo.path),
                        str(tmp / "replica-work"),
                        str(lease_dir),
                        demo.shas["perf"],
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in scenarios}
    t0 = time.monotonic()
    try:
        for i in range(args.k):
            if time.monotonic() - t0 > args.budget_min * 60:
                break
            for name, (repo, commit, aa, target) in scenarios.items():
                t = time.monotonic()
                res = run_scenario(repo, commit, s, tmp / "work" / name, aa)
                row: dict[str, Any] = {"builder": res.verdict, "seconds": round(time.monotonic() - t, 1)}
                for metric in ("cpu", "wall"):
                    v, widths = offline(res, metric, s)
                    row[metric] = v
                    row[f"{metric}_ci_width"] = widths.get(target)
                m = res.measurement
                if m is not None and target in m.samples:
                    smp = m.samples[target]
                    row["stretch"] = statistics.median(smp.wall["old"]) / statistics.median(smp.cpu["old"])
                row["leased_core"] = res.environment.leased_core
                row["load"] = res.environment.load_average_start
                rows[name].append(row)
                print(f"[{time.monotonic() - t0:6.0f}s] {i + 1} {name}: {row}", file=sys.stderr, flush=True)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    replica_runs = replica_log.read_text().splitlines() if replica_log.exists() else []
    report(rows, args, replica_runs, time.monotonic() - t0)
    shutil.rmtree(tmp, ignore_errors=True)


def report(
    rows: dict[str, list[dict[str, Any]]], args: argparse.Namespace, replica: list[str], secs: float
) -> None:
    table: dict[str, dict[str, Any]] = {}
    for name, rs in rows.items():
        k = len(rs)
        entry: dict[str, Any] = {"k": k}
        for metric in ("builder", "cpu", "wall"):
            flagged = sum(r[metric] != "not-improved" for r in rs)
            hits = sum(r[metric] == "improved" for r in rs)
            entry[metric] = f"{flagged}/{k} flagged" if name == "c_aa" else f"{hits}/{k} improved"
        for metric in ("cpu", "wall"):
            widths = [r[f"{metric}_ci_width"] for r in rs if r.get(f"{metric}_ci_width") is not None]
            entry[f"{metric}_ci_width"] = round(statistics.median(widths), 4) if widths else None
        entry["wall_over_cpu"] = (
            round(statistics.median(r["stretch"] for r in rs if "stretch" in r), 2) if rs else None
        )
        table[name] = entry
    out = {
        "runs": args.runs,
        "load": "none" if args.no_load else f"{args.loops_per_core} g++ -O2 loops per core",
        "replica_builds_meanwhile": len(replica),
        "minutes": round(secs / 60, 1),
        "mount_namespaces": mount_namespace_available(),
        "table": table,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(
        f"runs {args.runs}; load: {out['load']}; replica builds meanwhile: {len(replica)}; {out['minutes']} min"
    )
    print(
        f"{'scenario':18} {'K':>3} {'builder (cpu+confirm)':>22} {'cpu':>14} {'wall':>14} {'CI cpu':>8} {'CI wall':>8} {'wall/cpu':>8}"
    )
    for name, e in table.items():
        print(
            f"{name:18} {e['k']:>3} {e['builder']:>22} {e['cpu']:>14} {e['wall']:>14} "
            f"{e['cpu_ci_width']!s:>8} {e['wall_ci_width']!s:>8} {e['wall_over_cpu']!s:>8}"
        )


if __name__ == "__main__":
    main()
