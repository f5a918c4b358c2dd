"""`cppperf calibrate --out` writes the A/A record with the verdict under all three rules; an
impossible metric is one clear line and a non-zero exit, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cppperf.demo import DemoRepo
from cppperf.shared.engine.runner_script import instructions_unsupported
from tests.e2e.test_cli import run_cli

pytestmark = [pytest.mark.build, pytest.mark.stage2]


def test_calibrate_writes_the_aa_record(demo_repo: DemoRepo, tmp_path: Path) -> None:
    out = tmp_path / "aa.json"
    env = {"CPPPERF_BUILDER_WORK_DIR": str(tmp_path / "work"), "CPPPERF_BUILDER_EARLY_STOP_MIN_ROUNDS": "4"}
    proc = run_cli(
        "calibrate", "--repo", str(demo_repo.path), "--sha", demo_repo.shas["perf"], "--runs", "6",
        "--out", str(out), env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text())
    c = rec["cppperf"]
    assert c["instance_id"].endswith(demo_repo.shas["perf"][:12])
    assert {c["verdict"], c["verdict_paper_rule"], c["verdict_strict_rule"]} <= {
        "not-improved",
        "improved",
        "regressed",
    }
    assert set(c["calibration"]) >= {"flagged_ours", "flagged_paper_rule", "flagged_strict_rule"}
    assert rec["commit_info"]["old_sha"] == rec["commit_info"]["new_sha"]


@pytest.mark.skipif(instructions_unsupported() is None, reason="this machine can count instructions")
def test_instructions_metric_where_impossible_is_one_clear_line(demo_repo: DemoRepo, tmp_path: Path) -> None:
    proc = run_cli(
        "build", "--repo", str(demo_repo.path), "--sha", demo_repo.shas["perf"], "--runs", "4",
        "--metric", "instructions", "--out", str(tmp_path / "out"),
        env={"CPPPERF_BUILDER_WORK_DIR": str(tmp_path / "work")}, timeout=600,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "builder.metric=instructions is not possible here" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
