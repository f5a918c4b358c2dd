"""Paper's rule vs ours on the published CppPerf-DB raw per-test timings, and on A/A splits.

Usage: python bench/stats_calibration.py ../shared/data/cppperf-db/entries [--json] [--seed N]

1. Real pairs: for every entry, every test's published old/new samples → how many tests and
   instances each rule flags as improved.
2. A/A: each test's *old* samples split at random into two halves → any test flagged (improved
   or regressed) counts the instance as a false positive. Target: ours ≤ 1 % of instances.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cppperf.shared.domain import DecisionRule
from cppperf.shared.engine.stats import compare_all, verdict


def load(entries: Path) -> list[dict[str, list[tuple[list[float], list[float]]]]]:
    out = []
    for f in sorted(entries.glob("*.json")):
        d = json.loads(f.read_text())
        tests = {}
        for t in d.get("tests", {}).get("tests", []):
            old, new = t.get("old_times") or [], t.get("new_times") or []
            if len(old) >= 4 and len(new) >= 4:
                tests[t["test_name"]] = (old, new)
        out.append({"id": f.stem, "tests": tests})  # type: ignore[dict-item]
    return out  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("entries", type=Path)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resamples", type=int, default=1000)
    args = ap.parse_args()
    data = load(args.entries)
    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    res: dict[str, dict[str, Any]] = {
        rule: {
            "instances": 0,
            "instances_improved": 0,
            "tests": 0,
            "tests_improved": 0,
            "aa_instances": 0,
            "aa_instances_flagged": 0,
            "aa_tests": 0,
            "aa_tests_flagged": 0,
        }
        for rule in ("paper", "ours", "strict")
    }
    for entry in data:
        tests = entry["tests"]
        if not tests:
            continue
        decided = compare_all(
            tests, alpha=0.05, min_improvement=0.05, resamples=args.resamples, seed=args.seed, all_cis=False
        )
        aa_samples = {}
        for name, (old, _new) in tests.items():
            shuffled = old[:]
            rng.shuffle(shuffled)
            half = len(shuffled) // 2
            aa_samples[name] = (shuffled[:half], shuffled[half:])
        aa = compare_all(
            aa_samples,
            alpha=0.05,
            min_improvement=0.05,
            resamples=args.resamples,
            seed=args.seed,
            all_cis=False,
        )
        for rule in (DecisionRule.PAPER, DecisionRule.OURS, DecisionRule.STRICT):
            r = res[rule]
            r["instances"] += 1
            r["tests"] += len(decided)
            r["instances_improved"] += verdict(decided, rule=rule) == "improved"
            r["tests_improved"] += sum(rule.improved(t) for t in decided)
            flagged = [t for t in aa if any(rule.flags(t))]
            r["aa_instances"] += 1
            r["aa_tests"] += len(aa)
            r["aa_instances_flagged"] += bool(flagged)
            r["aa_tests_flagged"] += len(flagged)
    for r in res.values():
        r["aa_instance_fp_rate"] = round(r["aa_instances_flagged"] / max(r["aa_instances"], 1), 4)
        r["aa_test_fp_rate"] = round(r["aa_tests_flagged"] / max(r["aa_tests"], 1), 5)
    res["meta"] = {"entries": len(data), "seconds": round(time.perf_counter() - t0, 1), "seed": args.seed}
    if args.json:
        print(json.dumps(res))
        return
    print(f"{'':32}{'paper rule':>14}{'ours':>14}{'ours, strict':>14}")
    rows = [
        ("instances with timings", "instances"),
        ("instances improved", "instances_improved"),
        ("tests", "tests"),
        ("tests improved", "tests_improved"),
        ("A/A instances flagged", "aa_instances_flagged"),
        ("A/A instance FP rate", "aa_instance_fp_rate"),
        ("A/A tests flagged", "aa_tests_flagged"),
        ("A/A test FP rate", "aa_test_fp_rate"),
    ]
    for label, key in rows:
        print(f"{label:32}{res['paper'][key]!s:>14}{res['ours'][key]!s:>14}{res['strict'][key]!s:>14}")
    print(f"({res['meta']['entries']} entries, {res['meta']['seconds']} s)")


if __name__ == "__main__":
    main()
