"""Our measurement protocol vs the paper's, on the same commit of a local repository.

Usage: python bench/builder_protocol.py REPO_PATH SHA [--runs 31] [--json]

Paper's protocol: two clean Debug builds with `-j1` (same test options as ours, so the same
tests exist), then the whole suite through `ctest`
timed `runs` times on the old side, then `runs` times on the new side (sequential).
Ours: `cppperf build` (Release, all cores, shared ccache for the second build, identical-binary
short-circuit, tests run directly and interleaved, early stop, confirmation).
Prints both wall times side by side and the ratio (target ≤ 0.4×).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cppperf.cli.build import _commit_from_repo
from cppperf.services.builder.service import build_patch
from cppperf.shared.engine.backend import export_tree
from cppperf.shared.engine.cmake import test_options
from cppperf.shared.settings import load_settings


def paper(repo: Path, old: str, new: str, runs: int, work: Path) -> dict[str, float | str]:
    t0 = time.perf_counter()
    for side, sha in (("old", old), ("new", new)):
        src, build = work / side / "src", work / side / "build"
        export_tree(repo, sha, src)
        subprocess.run(
            ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug", *test_options(src)],
            check=True,
            capture_output=True,
        )
        subprocess.run(["cmake", "--build", str(build), "-j1"], check=True, capture_output=True)
    t_build = time.perf_counter() - t0
    for side in ("old", "new"):
        for _ in range(runs):
            subprocess.run(
                ["ctest", "--test-dir", str(work / side / "build")], capture_output=True, check=False
            )
    return {"build_s": round(t_build, 1), "total_s": round(time.perf_counter() - t0, 1)}


def ours(repo: Path, sha: str, runs: int, work: Path) -> dict[str, float | str]:
    s = load_settings(env={}, builder={"runs": runs, "work_dir": str(work)}, out_dir=str(work / "out"))
    commit = _commit_from_repo(repo, sha, None)
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    built = build_patch(
        commit,
        repo,
        s.builder,
        work_dir=work,
        out_dir=work / "out",
        on_phase=lambda p, _d, _t: phases.setdefault(p, time.perf_counter() - t0),
    )
    c = built.record["cppperf"]
    return {
        "total_s": round(time.perf_counter() - t0, 1),
        "verdict": c["verdict"],
        "build_s": round(phases.get("measure", time.perf_counter() - t0), 1),
        "rounds_saved": c["rounds_saved_by_early_stop"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", type=Path)
    ap.add_argument("sha")
    ap.add_argument("--runs", type=int, default=31)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    repo = args.repo.resolve()
    new = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", args.sha], capture_output=True, text=True, check=True
    ).stdout.strip()
    old = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", f"{new}^"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        p = paper(repo, old, new, args.runs, work / "paper")
        shutil.rmtree(work / "paper", ignore_errors=True)
        o = ours(repo, new, args.runs, work / "ours")
    res = {
        "repo": str(repo),
        "sha": new,
        "runs": args.runs,
        "paper": p,
        "ours": o,
        "ratio": round(float(o["total_s"]) / float(p["total_s"]), 2),
    }
    if args.json:
        print(json.dumps(res))
        return
    print(f"{'':10}{'build s':>10}{'total s':>10}")
    print(f"{'paper':10}{p['build_s']:>10}{p['total_s']:>10}")
    print(f"{'ours':10}{o['build_s']:>10}{o['total_s']:>10}   verdict {o['verdict']}")
    print(f"ours / paper wall time: {res['ratio']}× (target ≤ 0.4×)")


if __name__ == "__main__":
    main()
