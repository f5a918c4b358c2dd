"""Which CppPerf-DB instances can grade agents: proven by tests, then gold-validated.

Usage:
    python bench/oracle_coverage.py --clone google/snappy=~/src/snappy --clone fmtlib/fmt=~/src/fmt \\
        [--per-repo 2] [--ids SHA_PREFIX …] [--runs 31] [--eval-runs 21] [--out DIR] \\
        [--index …/cppperf-db/index.jsonl]

Per selected instance (ids from the index, repositories from the local clones given — clones of
fetched snapshots; nothing is fetched here): the builder proves the commit against its parent with
the default protocol (today's way: every CTest test timed), then, when it is `improved`, the
evaluator's gold validation (services/evaluator/gold.py): the expert patch must score `opt`, a
comment-only patch must not. Prints per instance the verdict, the oracle and the seconds each
step took, then the share proven and the share with an oracle beside the paper's 10 % (35/347).
The issue's other columns — proven with coverage-selected tests, with the project's benchmarks,
with an exact instruction count — need those parts of the builder: until they land the table says
`n/a` for them. Results go to `OUT/results.jsonl`; a re-run skips what is there (`--redo`).
Takes hours for 15 instances on 2 cores (a full proof plus two evaluations each).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from bench.build_yield import DEFAULT_INDEX, select
from cppperf.cli.build import _commit_from_repo
from cppperf.services.builder.service import build_patch
from cppperf.services.evaluator.gold import gold_validation
from cppperf.shared.settings import load_settings

PAPER_ORACLE_SHARE = 35 / 347


def one(entry: dict[str, Any], clone: Path, args: argparse.Namespace) -> dict[str, Any]:
    settings = load_settings(
        env={},
        out_dir=str(args.out / "out"),
        builder={"runs": args.runs, "work_dir": str(args.out / "work"), "commit_images": False},
        evaluator={"runs": args.eval_runs, "runs_dir": str(args.out / "runs")},
        mining={"mirror_dir": str(args.out / "mirrors")},
    )
    row: dict[str, Any] = {"repo": entry["repo"], "sha": entry["new_sha"][:12]}
    t0 = time.perf_counter()
    try:
        commit = _commit_from_repo(clone, entry["new_sha"], entry.get("old_sha"))
        commit = msgspec.structs.replace(commit, repo=entry["repo"], url=str(clone))
        built = build_patch(
            commit, clone, settings.builder, work_dir=args.out / "work", out_dir=Path(settings.out_dir)
        )
    except Exception as exc:  # an infrastructure failure is a row of the table, not the end of the run
        return {**row, "verdict": "error", "why": f"{type(exc).__name__}: {exc}"[:200], "oracle": "none"}
    meta = built.record.cppperf
    row.update(verdict=str(meta.verdict), prove_s=round(time.perf_counter() - t0, 1))
    row.update(coverage="n/a", benchmarks="n/a", exact_metric="n/a")
    if row["verdict"] != "improved":
        return {**row, "oracle": "none", "why": meta.failure_category or ""}
    t1 = time.perf_counter()
    block = gold_validation(built.record, settings)
    return {
        **row,
        "oracle": str(block.oracle),
        "gold": block.gold.verdict,
        "null": block.null.verdict,
        "why": block.why,
        "validate_s": round(time.perf_counter() - t1, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clone", action="append", default=[], help="OWNER/NAME=PATH of a local clone")
    p.add_argument("--index", type=Path, default=DEFAULT_INDEX)
    p.add_argument("--per-repo", type=int, default=2)
    p.add_argument("--ids", nargs="*", default=[])
    p.add_argument("--runs", type=int, default=31)
    p.add_argument("--eval-runs", type=int, default=21)
    p.add_argument("--out", type=Path, default=Path("oracle-coverage"))
    p.add_argument("--redo", action="store_true")
    args = p.parse_args()
    clones = {k: Path(v).expanduser() for k, _, v in (c.partition("=") for c in args.clone)}
    if not clones:
        p.error("give at least one --clone OWNER/NAME=PATH")
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    done = (
        {}
        if args.redo or not results.is_file()
        else {r["sha"]: r for r in map(json.loads, results.read_text().splitlines())}
    )
    rows = []
    for entry in select(args.index, clones, args.per_repo, args.ids):
        row = done.get(entry["new_sha"][:12]) or one(entry, clones[entry["repo"]], args)
        if entry["new_sha"][:12] not in done:
            with results.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
        rows.append(row)
        print(json.dumps(row), flush=True)
    n = len(rows) or 1
    proven = sum(r["verdict"] == "improved" for r in rows)
    graders = sum(r["oracle"] != "none" for r in rows)
    print(
        f"proven by tests: {proven}/{len(rows)}; with an oracle: {graders}/{len(rows)} "
        f"({graders / n:.0%}; paper {PAPER_ORACLE_SHARE:.0%})"
    )


if __name__ == "__main__":
    main()
