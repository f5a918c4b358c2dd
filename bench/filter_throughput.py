"""Our filter vs PyDriller's traversal, same rules, same local clone, one after the other.

Usage: python bench/filter_throughput.py REPO_PATH [--since 2020-01-01] [--until 2025-12-31] [--json]
(needs `pip install pydriller`, the `bench` extra)

Both apply the structural rules (window, no merges, ≤ max files, C++ only, no test/vendored
file) and produce, for each selected commit, its files with line counts (ours also reads the
diff). Commits/s counts the commits inside the window for both (PyDriller is given the window, its
best case; ours walks the whole history).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cppperf.services.filter.select import scan_repository
from cppperf.shared.rules import Rules
from cppperf.shared.settings import load_settings


def ours(repo: Path, rules: Rules) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    selected: list[object] = []
    summary = scan_repository(repo, repo="bench/repo", url=str(repo), rules=rules, emit=selected.append)
    elapsed = time.perf_counter() - t0
    in_window = summary.scanned - summary.rejected.get("out-of-window", 0)
    return in_window, len(selected), elapsed


def pydriller(repo: Path, rules: Rules) -> tuple[int, int, float]:
    from pydriller import Repository

    t0 = time.perf_counter()
    seen = selected = 0
    w = rules.window
    for c in Repository(str(repo), since=w.since, to=w.until + timedelta(seconds=1)).traverse_commits():
        if not w.contains(c.committer_date.astimezone(UTC)):
            continue
        seen += 1
        files = c.modified_files
        paths = [f.new_path or f.old_path for f in files]
        if rules.check(parents=len(c.parents), when=c.committer_date, paths=paths) is None and c.parents:
            selected += 1
            _ = [(f.added_lines, f.deleted_lines) for f in files]
    return seen, selected, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", type=Path)
    ap.add_argument("--since", default="2020-01-01")
    ap.add_argument("--until", default="2025-12-31")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-pydriller", action="store_true")
    args = ap.parse_args()
    rules = Rules.from_settings(
        load_settings(env={}, mining={"since": args.since, "until": args.until}).mining
    )
    o_seen, o_sel, o_t = ours(args.repo, rules)
    res: dict[str, object] = {
        "repo": str(args.repo),
        "window": [args.since, args.until],
        "ours": {
            "commits": o_seen,
            "selected": o_sel,
            "seconds": round(o_t, 2),
            "commits_per_s": round(o_seen / o_t, 1),
        },
    }
    if not args.skip_pydriller:
        p_seen, p_sel, p_t = pydriller(args.repo, rules)
        res["pydriller"] = {
            "commits": p_seen,
            "selected": p_sel,
            "seconds": round(p_t, 2),
            "commits_per_s": round(p_seen / p_t, 1),
        }
        res["ratio"] = round((o_seen / o_t) / (p_seen / p_t), 1)
    if args.json:
        print(json.dumps(res))
        return
    print(f"{'':12}{'commits':>9}{'selected':>10}{'seconds':>10}{'commits/s':>12}")
    for name in ("ours", "pydriller"):
        if name in res:
            r = res[name]
            assert isinstance(r, dict)
            print(f"{name:12}{r['commits']:>9}{r['selected']:>10}{r['seconds']:>10}{r['commits_per_s']:>12}")
    if "ratio" in res:
        print(f"ours / PyDriller: {res['ratio']}× (target ≥ 20×)")
    _ = datetime


if __name__ == "__main__":
    main()
