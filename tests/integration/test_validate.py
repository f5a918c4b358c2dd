"""Gold validation on the demo's proven perf commit: the expert's patch scores opt, a comment-only
patch does not, so the record gets `oracle: ctest`; `dataset stats` counts it as able to grade;
an unknown id is one clear line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from cppperf.cli.common import app
from cppperf.demo import core
from cppperf.services.evaluator.gold import NULL_COMMENT, null_patch, oracle_of, validate_stored
from cppperf.shared.domain import EvalReport, EvalVerdict, InstanceMeta, to_struct
from tests.conftest import Proven, make_settings

pytestmark = pytest.mark.build


def test_null_patch_applies_and_only_adds_a_comment(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "core.cpp").write_text(core(3))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "p.diff").write_text(null_patch(core(3), "src/core.cpp"))
    subprocess.run(["git", "-C", str(tmp_path), "apply", "p.diff"], check=True)
    assert (tmp_path / "src" / "core.cpp").read_text() == core(3) + NULL_COMMENT


def test_oracle_needs_gold_opt_and_null_not_opt() -> None:
    opt, correct = EvalReport(verdict=EvalVerdict.OPT, opt=True), EvalReport(verdict=EvalVerdict.CORRECT)
    assert oracle_of(opt, correct) == "ctest"
    assert oracle_of(opt, opt) == "none"
    assert oracle_of(correct, None) == "none"  # the null patch did not run


def test_validate_proven_instance(tmp_path: Path, proven: Callable[[str], Proven]) -> None:
    settings = make_settings(tmp_path, evaluator={"runs": 8, "runs_dir": str(tmp_path / "runs")})
    perf = proven("perf")  # the session's proof, copied into this test's OUT
    perf.copy_to(Path(settings.out_dir))
    iid = perf.record["cppperf"]["instance_id"]
    block = validate_stored(iid, settings)
    assert block.gold.verdict == "opt", block
    assert block.null.verdict == "correct" and not block.null.opt, block
    assert block.oracle == "ctest" and block.can_grade
    assert block.gold.metric == "cpu" and block.gold.timed_tests  # typed, and says what decided
    record = json.loads((Path(settings.out_dir) / "instances" / f"{iid}.json").read_text())
    assert record["cppperf"]["oracle"] == "ctest"
    assert record["cppperf"]["validation"] == msgspec.to_builtins(block)
    meta = to_struct(record["cppperf"], InstanceMeta)  # the section's published schema holds
    assert meta.validation is not None and meta.validation.can_grade
    res = CliRunner().invoke(app, ["dataset", "stats", "--json", "--out", settings.out_dir])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert stats["can_grade"] == 1 and stats["oracles"] == {"ctest": 1} and stats["can_grade_share"] == 1.0


def test_validate_unknown_instance_is_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["validate", "nobody__nothing-0123456789ab", "--out", str(tmp_path)])
    assert res.exit_code != 0
    assert "unknown instance" in res.output and "Traceback" not in res.output
