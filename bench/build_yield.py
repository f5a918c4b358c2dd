"""Build yield on CppPerf-DB instances: how many of the paper's instances cppperf builds and runs.

Usage:
    python bench/build_yield.py --clone google/snappy=~/src/snappy --clone zeux/pugixml=~/src/pugixml \\
        [--per-repo 2] [--ids SHA_PREFIX …] [--backend local|docker|both] [--runs 3] [--out DIR] \\
        [--submodule-mirror URL=GIT_DIR …] [--index …/cppperf-db/index.jsonl]

Every one of CppPerf-DB's instances built and passed its tests in the paper's pipeline (yield
100 %). For each selected instance (ids from the index; the repositories from the local clones
given, never fetched by this script) the builder proves the commit against its parent with a
few rounds only (`--runs 3 --warmup 0`: every test three times per side, the fewest the
settings allow, one run per sample; a build-and-test check, not a timing claim; no core
pinning), on the local backend and, where a container engine answers, the docker backend.
Prints per instance the verdict or the rejection category with its first error line, then the
yield per backend beside the paper's.
Results go to `OUT/results.jsonl`; a re-run skips what is there (`--redo` to repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from cppperf.cli.build import _commit_from_repo
from cppperf.services.builder.service import build_patch
from cppperf.shared.settings import load_settings

DEFAULT_INDEX = Path(__file__).resolve().parents[2] / "shared" / "data" / "cppperf-db" / "index.jsonl"
PASSING = {"improved", "not-improved", "regressed", "unchanged-binaries"}


def select(index: Path, clones: dict[str, Path], per_repo: int, ids: list[str]) -> list[dict[str, Any]]:
    """Index entries of the cloned repositories: the given ids, or `per_repo` spread over time."""
    entries = [json.loads(line) for line in index.read_text().splitlines() if line.strip()]
    chosen: list[dict[str, Any]] = []
    for repo in clones:
        mine = sorted((e for e in entries if e["repo"] == repo), key=lambda e: e["date"])
        if ids:
            mine = [e for e in mine if any(e["new_sha"].startswith(i) for i in ids)]
        elif per_repo and len(mine) > per_repo:
            step = (len(mine) - 1) / max(per_repo - 1, 1)
            mine = [mine[round(i * step)] for i in range(per_repo)] if per_repo > 1 else mine[:1]
        chosen += mine
    if ids:  # in the order given (the first ones first when a run is cut short)
        chosen.sort(key=lambda e: next(n for n, i in enumerate(ids) if e["new_sha"].startswith(i)))
    return chosen


def prove_one(
    entry: dict[str, Any], clone: Path, backend: str, args: argparse.Namespace, mirrors: dict[str, str]
) -> dict[str, Any]:
    work = args.out / "work"
    settings = load_settings(
        env={},
        builder={
            "backend": backend,
            "runs": args.runs,
            "warmup": args.warmup,
            "early_stop": False,
            "confirm": False,
            "jobs": args.jobs,
            "work_dir": str(work),
            "commit_images": False,
            "submodule_mirrors": mirrors,
            "submodule_cache": str(args.out / "submodules"),
            "build_timeout": args.build_timeout,
            "test_timeout": args.test_timeout,
            "pin_cpu": False,  # no timing claim here: let tests use any core
            # one run per sample: no repeats of short tests up to the timing floor (a project
            # registering hundreds of millisecond gtest cases, cpp-peglib, ran each ~17 times)
            "sample_floor": 0.0,
            "cpuset": args.cpuset,
        },
    )
    t0 = time.perf_counter()
    try:
        # the index's parent: a merge commit (CppPerf-DB has some) is compared with the one it names
        commit = _commit_from_repo(clone, entry["new_sha"], entry.get("old_sha"))
        commit = msgspec.structs.replace(commit, repo=entry["repo"])
        built = build_patch(commit, clone, settings.builder, work_dir=work, out_dir=args.out / backend)
    except Exception as exc:  # an infrastructure failure is a row of the table, not the end of the run
        return {"verdict": "error", "category": type(exc).__name__, "line": str(exc)[:200], "seconds": 0}
    c = built.record["cppperf"]
    lines = c.get("failure_lines") or []
    return {
        "verdict": c["verdict"],
        "category": c["failure_category"],
        "step": c.get("failure_step", ""),
        "line": (lines[0] if lines else c["failure_detail"][:200]).replace("\n", " "),
        "build_types": [
            " ".join(filter(None, (a["build_type"], a.get("profile_change", ""))))
            for a in c.get("attempts", [])
        ],
        "tests": len(c["tests"]) or len(c.get("samples", {})),
        "gcc": c.get("environment", {}).get("compiler_version", ""),
        "tried": c.get("tried", []),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def engine_reachable() -> bool:
    from cppperf.shared.engine.backends import docker_client
    from cppperf.shared.errors import CppPerfError

    try:
        docker_client(load_settings().builder)
    except CppPerfError:
        return False
    return True


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clone", action="append", default=[], help="OWNER/NAME=PATH of a local clone")
    ap.add_argument("--index", type=Path, default=DEFAULT_INDEX)
    ap.add_argument("--per-repo", type=int, default=2)
    ap.add_argument("--ids", nargs="*", default=[], help="sha prefixes of the instances to take")
    ap.add_argument("--backend", choices=["local", "docker", "both"], default="local")
    ap.add_argument("--runs", type=int, default=3, help="rounds per side (3: the fewest the settings allow)")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cpuset", default=",".join(map(str, sorted(os.sched_getaffinity(0)))))
    ap.add_argument("--build-timeout", type=float, default=1800.0)
    ap.add_argument("--test-timeout", type=float, default=600.0)
    ap.add_argument("--submodule-mirror", action="append", default=[], help="URL=GIT_DIR")
    ap.add_argument("--out", type=Path, default=Path("build-yield"))
    ap.add_argument("--redo", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    clones = {}
    for item in args.clone:
        repo, sep, path = item.partition("=")
        if not sep or not Path(path).expanduser().is_dir():
            sys.exit(f"--clone {item}: expected OWNER/NAME=PATH of a local clone")
        clones[repo] = Path(path).expanduser().resolve()
    mirrors = dict(m.split("=", 1) for m in args.submodule_mirror if "=" in m)
    if not args.index.is_file():
        sys.exit(f"--index {args.index}: no such file")
    backends = ["local", "docker"] if args.backend == "both" else [args.backend]
    if "docker" in backends and not engine_reachable():
        if args.backend == "docker":  # asked for containers only: never a silent local run instead
            host = os.environ.get("DOCKER_HOST", "")
            sys.exit(
                f"--backend docker: no container engine reachable (DOCKER_HOST={host!r}); see README, Containers"
            )
        print("docker: no container engine reachable, local backend only", file=sys.stderr)
        backends = ["local"]
    chosen = select(args.index, clones, args.per_repo, args.ids)
    if not chosen:
        sys.exit("no index entry matches the clones given")
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.jsonl"
    done: dict[tuple[str, str], dict[str, Any]] = {}
    if results_path.exists() and not args.redo:
        for line in results_path.read_text().splitlines():
            r = json.loads(line)
            done[(r["id"], r["backend"])] = r
    rows = []
    total = len(chosen) * len(backends)
    for n, (entry, backend) in enumerate(((e, b) for e in chosen for b in backends), 1):
        iid = f"{entry['repo']}@{entry['new_sha'][:8]}"
        if (iid, backend) in done:
            rows.append(done[(iid, backend)])
            continue
        print(f"[{n}/{total}] {iid} ({entry['date'][:10]}) on {backend} …", file=sys.stderr, flush=True)
        r = {"id": iid, "date": entry["date"][:10], "backend": backend}
        r |= prove_one(entry, clones[entry["repo"]], backend, args, mirrors)
        print(f"    → {r['verdict']} {r.get('category') or ''} in {r['seconds']} s", file=sys.stderr)
        with results_path.open("a") as fh:
            fh.write(json.dumps(r) + "\n")
        rows.append(r)
    (markdown if args.markdown else report)(rows, backends)


def _outcome(r: dict[str, Any]) -> str:
    out = r["verdict"] if r["verdict"] in PASSING else f"rejected: {r.get('category')}"
    if len(r.get("build_types", [])) > 1:
        out += f" [{'→'.join(r['build_types'])}]"
    return out


def markdown(rows: list[dict[str, Any]], backends: list[str]) -> None:
    """The table and the yield per backend as Markdown."""
    print("| instance | date | backend | compiler | outcome | s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        mt = re.search(r"\) (\d+\.\d+)", r.get("gcc", ""))
        gcc = mt.group(1) if mt else "?"
        print(
            f"| `{r['id']}` | {r['date']} | {r['backend']} | GCC {gcc} | {_outcome(r)} | {r['seconds']:.0f} |"
        )
    for backend in backends:
        mine = [r for r in rows if r["backend"] == backend and r["verdict"] != "error"]
        ok = sum(r["verdict"] in PASSING for r in mine)
        repos = len({r["id"].split("@")[0] for r in mine})
        pct = 100.0 * ok / len(mine) if mine else 0.0
        print(
            f"\n**{backend}: {ok} of {len(mine)} built and passed = {pct:.0f} % over {repos} repositories (paper: 100 %)**"
        )


def report(rows: list[dict[str, Any]], backends: list[str]) -> None:
    print(f"{'instance':34} {'date':10} {'backend':7} {'outcome':34} {'s':>6}  first error line")
    for r in rows:
        outcome = r["verdict"] if r["verdict"] in PASSING else f"rejected ({r.get('category')})"
        if len(r.get("build_types", [])) > 1:
            outcome += f" [{'→'.join(r['build_types'])}]"
        line = "" if r["verdict"] in PASSING else r.get("line", "")[:90]
        print(f"{r['id']:34} {r['date']:10} {r['backend']:7} {outcome:34} {r['seconds']:>6}  {line}")
    for backend in backends:
        mine = [r for r in rows if r["backend"] == backend and r["verdict"] != "error"]
        skipped = [r for r in rows if r["backend"] == backend and r["verdict"] == "error"]
        ok = sum(r["verdict"] in PASSING for r in mine)
        repos = len({r["id"].split("@")[0] for r in mine})
        pct = 100.0 * ok / len(mine) if mine else 0.0
        print(
            f"yield {backend}: {ok}/{len(mine)} built and passing = {pct:.0f} % "
            f"over {repos} repositories (paper: 100 %)"
            + (f"; {len(skipped)} not tried (sources unavailable: see the rows)" if skipped else "")
        )


if __name__ == "__main__":
    main()
