"""Which CppPerf-DB instances can grade agents: proven by tests alone vs with the new oracles.

Usage:
    python bench/oracle_coverage.py --clone google/snappy=clones/google+snappy.git … \\
        [--ids SHA_PREFIX …] [--per-repo 2] [--runs 11] [--eval-runs 11] [--out DIR] \\
        [--submodule-mirror URL=GIT_DIR …] [--configs tests oracles exact] [--markdown] \\
        [--index …/cppperf-db/index.jsonl] [--report --with-rows OTHER_OUT/results.jsonl …]

Per selected instance (ids from the index in the order given, repositories from the local clones
given — `git clone --bare` copies of fetched snapshots; nothing is fetched here) the builder proves
the commit against its parent three ways (issue 27):

- `tests`   — today's way: default profile, `cpu` metric, every CTest test decides
              (`builder.coverage=false`, `builder.benchmarks=false`);
- `oracles` — the new oracles on `cpu`: `builder.coverage=true` (the tests that run the change
              decide, the others are A/A controls) and `builder.benchmarks=true` (the project's
              Google Benchmark executables are workloads);
- `exact`   — `builder.metric=cachegrind` with coverage (exact instruction counts; benchmarks are
              skipped under Cachegrind by design).

Every configuration that proves the instance `improved` is then gold-validated
(services/evaluator/gold.py) with the settings its proof used: the expert patch must score `opt`,
a comment-only patch must not → `oracle` ctest|benchmark|both|none. An oracle counts only when the
proof's coverage controls did not move (`coverage.suspect` false).

One row per (instance, configuration) goes to `OUT/results.jsonl` as soon as it is done; a re-run
skips the rows there (`--redo` repeats them), so an interrupted run resumes. Prints the table
(`--markdown` for the README) and the summary: proven by tests alone N, with the new oracles M,
M/N, and the share of instances with an oracle beside the paper's 10 % (35/347).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAPER_ORACLE_SHARE = 35 / 347
CONFIGS: dict[str, dict[str, Any]] = {
    "tests": {"coverage": False, "benchmarks": False, "metric": "cpu"},
    "oracles": {"coverage": True, "benchmarks": True, "metric": "cpu"},
    "exact": {"coverage": True, "benchmarks": False, "metric": "cachegrind"},
}
NEW = ("oracles", "exact")


def settings_for(config: str, args: argparse.Namespace, mirrors: dict[str, str]) -> Any:
    from cppperf.shared.settings import load_settings

    return load_settings(
        env={},
        out_dir=str(args.out / "out" / config),
        builder={
            **CONFIGS[config],
            "runs": args.runs,
            "jobs": args.jobs,
            "work_dir": str(args.out / "work"),
            "commit_images": False,
            "submodule_mirrors": mirrors,
            "submodule_cache": str(args.out / "submodules"),
            "build_timeout": args.build_timeout,
            "test_timeout": args.test_timeout,
        },
        evaluator={"runs": args.eval_runs, "runs_dir": str(args.out / "runs" / config)},
        mining={"mirror_dir": str(args.out / "mirrors")},
    )


def prove(
    entry: dict[str, Any],
    clone: Path,
    config: str,
    args: argparse.Namespace,
    mirrors: dict[str, str],
    validate: bool = True,
) -> dict[str, Any]:
    """One configuration's proof of one instance, then its gold validation when `improved` (and
    `validate`: not when another configuration's proof already has a clean oracle,
    `--validate first`)."""
    import msgspec

    from cppperf.cli.build import _commit_from_repo
    from cppperf.services.builder.service import build_patch
    from cppperf.services.evaluator.gold import gold_validation
    from cppperf.shared.domain import to_json_dict

    settings = settings_for(config, args, mirrors)
    row: dict[str, Any] = {"id": instance_key(entry), "config": config}
    t0 = time.perf_counter()
    try:
        # the index's parent: a merge commit (CppPerf-DB has some) is compared with the one it names
        commit = _commit_from_repo(clone, entry["new_sha"], entry.get("old_sha"))
        commit = msgspec.structs.replace(commit, repo=entry["repo"], url=str(clone))
        built = build_patch(
            commit, clone, settings.builder, work_dir=args.out / "work", out_dir=Path(settings.out_dir)
        )
    except Exception as exc:  # an infrastructure failure is a row of the table, not the end of the run
        (args.out / "tracebacks.log").open("a").write(f"== {row['id']} {config}\n{traceback.format_exc()}\n")
        return {**row, "verdict": "error", "why": f"{type(exc).__name__}: {exc}"[:300], "prove_s": 0.0}
    record = to_json_dict(built.record)  # the record as its file holds it
    row.update(summarise(record["cppperf"]), prove_s=round(time.perf_counter() - t0, 1))
    if row["verdict"] != "improved":
        return row
    if not validate:
        return {**row, "oracle": "skipped", "why": "not validated: an earlier configuration has an oracle"}
    t1 = time.perf_counter()
    try:
        block = gold_validation(built.record, settings)
    except Exception as exc:
        (args.out / "tracebacks.log").open("a").write(
            f"== {row['id']} {config} validate\n{traceback.format_exc()}\n"
        )
        return {**row, "oracle": "error", "why": f"validate: {type(exc).__name__}: {exc}"[:300]}
    return {**row, **validation_columns(block), "validate_s": round(time.perf_counter() - t1, 1)}


def validation_columns(block: Any) -> dict[str, Any]:
    """The table's columns of one gold validation (a `domain.Validation`)."""
    return {
        "oracle": str(block.oracle),
        "gold": block.gold.verdict,
        "null": block.null.verdict,
        "gold_speedup": block.gold.gm_speedup_agent,
        "why": block.why,
    }


def revalidate(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Gold validation once more from the proof's stored record (after a fix to the evaluator)."""
    from cppperf.services.evaluator.gold import gold_validation
    from cppperf.shared.domain import decode_record

    settings = settings_for(row["config"], args, args.mirrors)
    repo, _, sha8 = row["id"].partition("@")
    found = sorted((Path(settings.out_dir) / "instances").glob(f"{repo.replace('/', '__')}-{sha8}*.json"))
    if not found:
        return row
    t1 = time.perf_counter()
    block = gold_validation(decode_record(found[0].read_text()), settings, force=True)
    return {
        **row,
        **validation_columns(block),
        "validate_s": round(time.perf_counter() - t1, 1),
        "revalidated": True,
    }


def summarise(c: dict[str, Any]) -> dict[str, Any]:
    """The columns of one proof from the record's `cppperf` section."""
    lines = c.get("failure_lines") or []
    cov = c.get("coverage") or {}
    out: dict[str, Any] = {
        "verdict": c["verdict"],
        "category": c.get("failure_category") or "",
        "why": (lines[0] if lines else (c.get("failure_detail") or ""))[:200].replace("\n", " "),
        "proven_by": c.get("proven_by"),
        "tests": len(c.get("tests") or []),
        "improved_tests": [t["name"] for t in c.get("tests") or [] if t.get("improved")][:10],
        "benchmarks": len(c.get("benchmark_workloads") or []),
        "benchmarks_skipped": len(c.get("benchmarks_skipped") or []),
        "improved_benchmarks": list(c.get("improved_benchmarks") or [])[:10],
        "build_types": [
            " ".join(filter(None, (a.get("build_type", ""), a.get("profile_change", ""))))
            for a in c.get("attempts") or []
        ],
    }
    best = best_workload(c)
    if best is not None:
        out["best"] = best
    if cov:
        out["coverage"] = {
            "used": cov.get("used", False),
            "reason": (cov.get("reason") or "")[:200],
            "deciding": len(cov.get("deciding") or []),
            "controls": len(cov.get("controls") or []),
            "moved_controls": cov.get("moved_controls") or {},
            "suspect": bool(cov.get("suspect")),
            "seconds": cov.get("seconds", 0.0),
        }
    return out


def best_workload(c: dict[str, Any]) -> dict[str, Any] | None:
    """The deciding workload (a test coverage let decide, or a benchmark) with the lowest new/old
    ratio: how close the change came to a proof, for the table's "why not"."""
    cov = c.get("coverage") or {}
    deciding = set(cov.get("deciding") or []) if cov.get("used") else None
    stats = [t for t in c.get("tests") or [] if deciding is None or t["name"] in deciding]
    stats += list(c.get("benchmarks") or [])
    stats = [t for t in stats if t.get("ratio")]
    if not stats:
        return None
    t = min(stats, key=lambda t: float(t["ratio"]))
    return {
        "name": t["name"],
        "ratio": round(float(t["ratio"]), 4),
        "ci": [
            round(float(t.get("ci_low") or t["ratio"]), 4),
            round(float(t.get("ci_high") or t["ratio"]), 4),
        ],
        "of": len(stats),
    }


def enrich(rows: list[dict[str, Any]], outs: list[Path]) -> list[dict[str, Any]]:
    """Rows written before they carried `best` get it from their proof's stored record (under
    `OUT/out/<config>/instances/` of any OUT given); rows with it, or without a record, stay."""
    return [r if "best" in r else {**r, **stored_best(r, outs)} for r in rows]


def stored_best(row: dict[str, Any], outs: list[Path]) -> dict[str, Any]:
    if row["verdict"] not in ("improved", "not-improved", "regressed"):
        return {}
    repo, _, sha8 = row["id"].partition("@")
    for out in outs:
        found = sorted(
            (out / "out" / row["config"] / "instances").glob(f"{repo.replace('/', '__')}-{sha8}*.json")
        )
        if found:
            best = best_workload(json.loads(found[0].read_text())["cppperf"])
            return {"best": best} if best is not None else {}
    return {}


def instance_key(entry: dict[str, Any]) -> str:
    return f"{entry['repo']}@{entry['new_sha'][:8]}"


# --- the table and the summary (plain functions over rows; tests/unit/test_oracle_coverage_bench.py) ---


def counts(rows: list[dict[str, Any]], instances: list[str]) -> dict[str, Any]:
    """Per instance: proven today / with the new oracles / has a clean oracle; the totals."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["id"], {})[r["config"]] = r
    finished = [i for i in instances if all(c in by.get(i, {}) for c in CONFIGS)]
    today = [i for i in finished if by[i]["tests"]["verdict"] == "improved"]
    new = [i for i in finished if any(by[i][c]["verdict"] == "improved" for c in CONFIGS)]
    new_only = [i for i in finished if any(by[i][c]["verdict"] == "improved" for c in NEW)]
    graded = [i for i in finished if any(clean_oracle(by[i][c]) for c in CONFIGS)]
    graded_today = [i for i in finished if clean_oracle(by[i]["tests"])]
    suspect = [i for i in finished if any((by[i][c].get("coverage") or {}).get("suspect") for c in NEW)]
    return {
        "finished": finished,
        "today": today,
        "new": new,
        "new_only": new_only,
        "graded": graded,
        "graded_today": graded_today,
        "suspect": suspect,
        "repos": sorted({i.split("@")[0] for i in finished}),
    }


def clean_oracle(r: dict[str, Any]) -> bool:
    """The proof was gold-validated with an oracle and no coverage control moved."""
    return r.get("oracle") not in (None, "none", "error", "skipped") and not (r.get("coverage") or {}).get(
        "suspect"
    )


def cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run: time"
    if r["verdict"] == "error":
        return f"error ({r.get('why', '')[:60]})"
    v = r["verdict"] if r["verdict"] != "rejected" else f"rejected: {r.get('category')}"
    if r["verdict"] == "improved":
        v = f"**improved** by {r.get('proven_by')}"
    cov = r.get("coverage")
    if cov:
        v += (
            f"; cov {cov['deciding']} deciding / {cov['controls']} controls"
            + (" **suspect**" if cov["suspect"] else "")
            if cov["used"]
            else f"; cov off ({cov['reason'][:40]})"
        )
    if r.get("benchmarks"):
        v += f"; {r['benchmarks']} bench"
    best = r.get("best")
    if best and r["verdict"] != "improved":
        lo, hi = best["ci"]
        v += f"; best {best['ratio']:.3f}× [{lo:.3f}, {hi:.3f}] `{best['name'][:40]}`"
    if r.get("oracle") == "skipped":
        v += "; not validated (another has an oracle)"
    elif "oracle" in r:
        v += f"; gold → oracle **{r['oracle']}**"
    secs = r.get("prove_s", 0.0) + r.get("validate_s", 0.0)
    return f"{v} ({secs:.0f} s)" + (" ‡" if r.get("source") else "")  # ‡: an earlier run's row


def table(rows: list[dict[str, Any]], instances: list[str], dates: dict[str, str]) -> list[str]:
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["id"], {})[r["config"]] = r
    out = [
        "| instance | date | tests alone (cpu, every test) | coverage + benchmarks (cpu) | exact (cachegrind + coverage) | s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i in instances:
        mine = by.get(i, {})
        total = sum(r.get("prove_s", 0.0) + r.get("validate_s", 0.0) for r in mine.values())
        cells = " | ".join(cell(mine.get(c)) for c in CONFIGS)
        out.append(f"| `{i}` | {dates.get(i, '')} | {cells} | {total:.0f} |")
    return out


def summary(rows: list[dict[str, Any]], instances: list[str]) -> str:
    k = counts(rows, instances)
    n, m, g = len(k["today"]), len(k["new"]), len(k["graded"])
    total = len(k["finished"])
    ratio = f"{m / n:.1f}×" if n else ("∞" if m else "n/a")
    share = g / total if total else 0.0
    return (
        f"finished {total} of {len(instances)} instances over {len(k['repos'])} repositories; "
        f"proven by tests alone {n}, with the new oracles {m} (by coverage/benchmarks/exact: "
        f"{len(k['new_only'])}), ratio {ratio} (target ≥ 3×); with an oracle {g}/{total} = {share:.0%} "
        f"(tests alone: {len(k['graded_today'])}; paper {PAPER_ORACLE_SHARE:.0%}; target ≥ 30 %); "
        f"coverage suspect: {len(k['suspect'])}"
    )


def parse_args() -> argparse.Namespace:
    from bench.build_yield import DEFAULT_INDEX

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clone", action="append", default=[], help="OWNER/NAME=PATH of a local clone")
    p.add_argument("--index", type=Path, default=DEFAULT_INDEX)
    p.add_argument("--per-repo", type=int, default=2)
    p.add_argument("--ids", nargs="*", default=[], help="sha prefixes, cheapest first")
    p.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--runs", type=int, default=11, help="rounds per side on cpu (cachegrind: exact_runs)")
    p.add_argument("--eval-runs", type=int, default=11)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--build-timeout", type=float, default=3600.0)
    p.add_argument("--test-timeout", type=float, default=600.0)
    p.add_argument("--submodule-mirror", action="append", default=[], help="URL=GIT_DIR")
    p.add_argument("--out", type=Path, default=Path("oracle-coverage"))
    p.add_argument("--redo", action="store_true")
    p.add_argument(
        "--validate",
        choices=["all", "first"],
        default="all",
        help="gold-validate every configuration that proves an instance, or only until one has an oracle",
    )
    p.add_argument(
        "--revalidate",
        nargs="*",
        default=[],
        help="sha prefixes whose improved rows are gold-validated again from their stored records",
    )
    p.add_argument("--report", action="store_true", help="print the table from results.jsonl; run nothing")
    p.add_argument(
        "--with-rows",
        type=Path,
        action="append",
        default=[],
        help="another process's results.jsonl (a different --out, e.g. one per --configs): its rows join the table",
    )
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    args = p.parse_args()
    args.clones = {}
    for item in args.clone:
        repo, sep, path = item.partition("=")
        if not sep or not Path(path).expanduser().is_dir():
            sys.exit(f"--clone {item}: expected OWNER/NAME=PATH of a local clone")
        args.clones[repo] = Path(path).expanduser().resolve()
    if not args.clones:
        p.error("give at least one --clone OWNER/NAME=PATH")
    args.mirrors = dict(m.split("=", 1) for m in args.submodule_mirror if "=" in m)
    args.out = args.out.resolve()
    return args


def load_done(results: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The rows written so far, the last one per (instance, configuration)."""
    done: dict[tuple[str, str], dict[str, Any]] = {}
    if results.is_file():
        for line in results.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["id"], r["config"])] = r
    return done


def merged(
    done: dict[tuple[str, str], dict[str, Any]], others: list[Path]
) -> dict[tuple[str, str], dict[str, Any]]:
    """This out's rows joined by other processes' `results.jsonl` (one per `--configs`, each with
    its own `--out` and workspace); a row of this out wins over another's for the same
    (instance, configuration)."""
    out = dict(done)
    for other in others:
        out.update({k: v for k, v in load_done(other).items() if k not in out})
    return out


def claim(out: Path, iid: str) -> bool:
    """Take an instance for this process (`OUT/claims/<id>` holds the pid): a second process on
    the same OUT works on other instances (they share the instance's workspace); a dead
    process's claim is taken over."""
    path = out / "claims" / iid.replace("/", "__")
    path.parent.mkdir(exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid == os.getpid():
                return True
            if pid and Path(f"/proc/{pid}").exists():
                return False
            path.unlink(missing_ok=True)  # its process is gone
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


def run(
    chosen: list[dict[str, Any]], done: dict[tuple[str, str], dict[str, Any]], args: argparse.Namespace
) -> None:
    """Every (instance, configuration) not done, in order; each row appended when it ends. Rows
    another process on the same OUT wrote meanwhile are read again before each one."""
    print(f"pid {os.getpid()}, {len(chosen)} instances, out {args.out}", file=sys.stderr, flush=True)
    results = args.out / "results.jsonl"
    for n, entry in enumerate(chosen, 1):
        iid = instance_key(entry)
        if all((iid, c) in done and not again(done[(iid, c)], entry, args) for c in args.configs):
            continue
        if not claim(args.out, iid):
            print(f"[{n}/{len(chosen)}] {iid}: another process has it", file=sys.stderr, flush=True)
            continue
        try:
            for config in args.configs:
                done.update(load_done(results) if not args.redo else {})
                key = (iid, config)
                redo = key in done and again(done[key], entry, args)
                if key in done and not redo:
                    continue
                when = time.strftime("%H:%M:%S")
                print(f"[{n}/{len(chosen)}] {iid} {config} … ({when})", file=sys.stderr, flush=True)
                if redo:
                    print("    gold validation again from the stored record", file=sys.stderr, flush=True)
                    row = revalidate(done[key], args)
                else:
                    has = any(clean_oracle(done[(iid, c)]) for c in args.configs if (iid, c) in done)
                    validate = args.validate == "all" or not has
                    row = prove(entry, args.clones[entry["repo"]], config, args, args.mirrors, validate)
                print(f"    → {json.dumps(row)}", file=sys.stderr, flush=True)
                with results.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                done[key] = row
        finally:
            (args.out / "claims" / iid.replace("/", "__")).unlink(missing_ok=True)


def again(row: dict[str, Any], entry: dict[str, Any], args: argparse.Namespace) -> bool:
    """An improved row to gold-validate once more (`--revalidate`; once: a restart does not repeat it)."""
    return (
        row["verdict"] == "improved"
        and not row.get("revalidated")
        and entry["new_sha"].startswith(tuple(args.revalidate))
    )


def main() -> None:
    from bench.build_yield import select

    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = select(args.index, args.clones, args.per_repo, args.ids)
    if not chosen:
        sys.exit("no index entry matches the clones given")
    done = {} if args.redo else load_done(args.out / "results.jsonl")
    if not args.report:
        run(chosen, done, args)
    done = merged(done, args.with_rows)  # after the run: they never mark this process's work done
    instances = [instance_key(e) for e in chosen]
    rows = enrich(list(done.values()), [args.out, *(p.parent for p in args.with_rows)])
    if args.markdown:
        print("\n".join(table(rows, instances, {instance_key(e): e["date"][:10] for e in chosen})))
    else:
        for r in rows:
            print(json.dumps(r))
    print(summary(rows, instances))


if __name__ == "__main__":
    main()
