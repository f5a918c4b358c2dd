"""How often does the exact metric (`builder.metric=cachegrind`) agree with the cpu-time verdict?

Usage: python bench/exact_agreement.py [--kinds perf,noop,regression,test_touch] [--runs 11] [--json]

Proves each of the demo repository's commits (cppperf/demo.py: `perf` makes the `spin` test ~2×
faster, `noop` changes a string in `other`, `regression` makes `spin` slower, `test_touch` halves
the `other` test's own work) twice, once per metric, and prints both verdicts, each test's median
change under both, whether they agree, and the time each proof took. The cpu proofs take the
timing core (one lease at a time); the cachegrind ones none.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cppperf.demo import create_demo_repo
from cppperf.services.builder.service import build_patch
from cppperf.shared.settings import load_settings
from tests.conftest import commit_for


def prove(repo: Path, sha: str, metric: str, runs: int, tmp: Path) -> dict[str, Any]:
    s = load_settings(env={}, builder={"metric": metric, "runs": runs, "work_dir": str(tmp / "work")})
    start = time.monotonic()
    built = build_patch(commit_for(repo, sha), repo, s.builder, work_dir=tmp / "work", out_dir=tmp / "out")
    rec = built.record["cppperf"]
    return {
        "verdict": rec["verdict"],
        "changes": {t["name"]: round(t["median_change"], 4) for t in rec["tests"]},
        "seconds": round(time.monotonic() - start, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="perf,noop,regression,test_touch")
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="cppperf-exact-") as d:
        tmp = Path(d)
        demo = create_demo_repo(tmp / "demo")
        for kind in args.kinds.split(","):
            cpu = prove(demo.path, demo.shas[kind], "cpu", args.runs, tmp / f"{kind}-cpu")
            exact = prove(demo.path, demo.shas[kind], "cachegrind", args.runs, tmp / f"{kind}-cg")
            rows.append(
                {"kind": kind, "cpu": cpu, "cachegrind": exact, "agree": cpu["verdict"] == exact["verdict"]}
            )
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        c, e = r["cpu"], r["cachegrind"]
        print(
            f"{r['kind']:11} cpu {c['verdict']:13} {c['seconds']:6} s  cachegrind {e['verdict']:13} {e['seconds']:6} s  agree={r['agree']}"
        )
        for name in sorted(set(c["changes"]) | set(e["changes"])):
            print(
                f"    {name:8} median change cpu {c['changes'].get(name)!s:>8}  cachegrind {e['changes'].get(name)!s:>8}"
            )
    print(f"agree: {sum(r['agree'] for r in rows)}/{len(rows)}")


if __name__ == "__main__":
    main()
