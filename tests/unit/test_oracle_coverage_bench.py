"""bench/oracle_coverage.py's table and summary on hand-made rows (the bench itself is not in CI)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def oc() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "oracle_coverage.py"
    spec = importlib.util.spec_from_file_location("oracle_coverage_bench", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(i: str, config: str, verdict: str = "not-improved", **kw: Any) -> dict[str, Any]:
    return {"id": i, "config": config, "verdict": verdict, "prove_s": 10.0, **kw}


def _cov(suspect: bool = False) -> dict[str, Any]:
    return {
        "used": True,
        "reason": "",
        "deciding": 1,
        "controls": 2,
        "moved_controls": {},
        "suspect": suspect,
    }


def test_summary_counts_new_oracles_and_clean_oracles_only(oc: ModuleType) -> None:
    a, b, c, d = "o/a@1", "o/b@2", "p/c@3", "p/d@4"
    rows = [
        # a: proven today and by the new oracles, validated with an oracle today
        _row(a, "tests", "improved", proven_by="ctest", oracle="ctest"),
        _row(a, "oracles", "improved", proven_by="ctest", coverage=_cov(), oracle="ctest"),
        _row(a, "exact", coverage=_cov()),
        # b: proven by a benchmark only, oracle benchmark
        _row(b, "tests"),
        _row(
            b,
            "oracles",
            "improved",
            proven_by="benchmark",
            coverage=_cov(),
            oracle="benchmark",
            validate_s=5.0,
        ),
        _row(b, "exact", coverage=_cov()),
        # c: proven on counts, but a control moved: no clean oracle
        _row(c, "tests"),
        _row(c, "oracles", coverage=_cov()),
        _row(c, "exact", "improved", proven_by="ctest", coverage=_cov(suspect=True), oracle="ctest"),
        # d: only one configuration finished: not counted
        _row(d, "tests", "improved", proven_by="ctest", oracle="none"),
    ]
    k = oc.counts(rows, [a, b, c, d])
    assert k["finished"] == [a, b, c]
    assert k["today"] == [a] and k["new"] == [a, b, c] and k["new_only"] == [a, b, c]
    assert k["graded"] == [a, b] and k["graded_today"] == [a] and k["suspect"] == [c]
    line = oc.summary(rows, [a, b, c, d])
    assert "finished 3 of 4 instances over 3 repositories" in line
    assert "proven by tests alone 1, with the new oracles 3" in line and "ratio 3.0×" in line
    assert "with an oracle 2/3 = 67%" in line and "coverage suspect: 1" in line


def test_table_marks_unfinished_configurations_not_run(oc: ModuleType) -> None:
    a = "o/a@1"
    rows = [_row(a, "tests", "rejected", category="compile")]
    lines = oc.table(rows, [a, "o/b@2"], {a: "2021-01-01"})
    assert lines[2].startswith(
        f"| `{a}` | 2021-01-01 | rejected: compile (10 s) | not run: time | not run: time |"
    )
    assert lines[3].count("not run: time") == 3
    # no instance finished: the ratio is not a number
    assert "ratio n/a" in oc.summary(rows, [a])


def test_a_claimed_instance_is_left_to_its_live_process(oc: ModuleType, tmp_path: Path) -> None:
    assert oc.claim(tmp_path, "o/a@1")  # free: taken
    assert oc.claim(tmp_path, "o/a@1")  # ours already
    other = tmp_path / "claims" / "o__b@2"
    other.write_text("1")  # pid 1 is alive: another process has it
    assert not oc.claim(tmp_path, "o/b@2")
    other.write_text("999999999")  # no such process: taken over
    assert oc.claim(tmp_path, "o/b@2")


def test_load_done_keeps_the_last_row_per_instance_and_configuration(oc: ModuleType, tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text(
        '{"id": "o/a@1", "config": "tests", "verdict": "improved", "oracle": "none"}\n\n'
        '{"id": "o/a@1", "config": "tests", "verdict": "improved", "oracle": "ctest", "revalidated": true}\n'
    )
    done = oc.load_done(results)
    assert list(done) == [("o/a@1", "tests")] and done[("o/a@1", "tests")]["oracle"] == "ctest"
    assert oc.load_done(tmp_path / "missing.jsonl") == {}


def test_a_skipped_validation_is_no_oracle_and_says_so(oc: ModuleType) -> None:
    r = _row("o/a@1", "exact", "improved", proven_by="ctest", oracle="skipped")
    assert not oc.clean_oracle(r)
    assert "not validated" in oc.cell(r)


def test_a_validation_gives_its_columns(oc: ModuleType) -> None:
    """The row's validation columns come from the `Validation` Struct gold validation returns."""
    from cppperf.shared.domain import EvalVerdict, Oracle, Validation, ValidationRun

    block = Validation(
        gold=ValidationRun(verdict=EvalVerdict.OPT, opt=True, gm_speedup_agent=1.9),
        null=ValidationRun(verdict=EvalVerdict.CORRECT),
        oracle=Oracle.CTEST,
        can_grade=True,
    )
    assert oc.validation_columns(block) == {
        "oracle": "ctest",
        "gold": "opt",
        "null": "correct",
        "gold_speedup": 1.9,
        "why": "",
    }


def test_rows_of_another_out_join_the_table_without_overriding_this_ones(
    oc: ModuleType, tmp_path: Path
) -> None:
    """Two processes, one per `--configs` (cpu proofs; the exact metric), each with its own
    `--out`: `--with-rows` joins the other's rows; this out's row wins on a clash."""
    mine, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    mine.write_text(json.dumps(_row("o/a@1", "tests", "improved", proven_by="ctest", oracle="ctest")) + "\n")
    other.write_text(
        json.dumps(_row("o/a@1", "exact", "improved", proven_by="ctest", oracle="ctest"))
        + "\n"
        + json.dumps(_row("o/a@1", "tests", "not-improved"))
        + "\n"
    )
    done = oc.merged(oc.load_done(mine), [other, tmp_path / "missing.jsonl"])
    assert set(done) == {("o/a@1", "tests"), ("o/a@1", "exact")}
    assert done[("o/a@1", "tests")]["verdict"] == "improved"
    assert done[("o/a@1", "exact")]["config"] == "exact"


def _stat(name: str, ratio: float) -> dict[str, Any]:
    return {"name": name, "ratio": ratio, "ci_low": ratio - 0.01, "ci_high": ratio + 0.01}


def test_best_workload_is_the_lowest_ratio_among_deciding_tests_and_benchmarks(oc: ModuleType) -> None:
    record = {
        "tests": [_stat("runs-it", 0.97), _stat("control", 0.90)],
        "benchmarks": [_stat("bench:b/BM_x", 0.95)],
        "coverage": {"used": True, "deciding": ["runs-it"], "controls": ["control"]},
    }
    # the control's 0.90 is not the change's showing: it does not decide
    assert oc.best_workload(record) == {"name": "bench:b/BM_x", "ratio": 0.95, "ci": [0.94, 0.96], "of": 2}
    record["coverage"] = {"used": False}
    assert oc.best_workload(record)["name"] == "control"
    assert oc.best_workload({"tests": [], "benchmarks": []}) is None


def test_rows_without_best_take_it_from_their_stored_record(oc: ModuleType, tmp_path: Path) -> None:
    other = tmp_path / "b"
    records = other / "out" / "exact" / "instances"
    records.mkdir(parents=True)
    (records / "o__a-1234567890ab.json").write_text(json.dumps({"cppperf": {"tests": [_stat("t", 0.998)]}}))
    rows = [
        _row("o/a@12345678", "exact"),
        _row("o/a@12345678", "tests"),  # no record under any OUT: stays as it is
        _row("o/a@12345678", "oracles", "rejected"),
    ]
    got = oc.enrich(rows, [tmp_path / "a", other])
    assert got[0]["best"]["ratio"] == 0.998 and "best" not in got[1] and "best" not in got[2]
    line = oc.table(got, ["o/a@12345678"], {})[2]
    assert "best 0.998× [0.988, 1.008] `t`" in line


def test_an_earlier_runs_row_is_marked_and_counts(oc: ModuleType) -> None:
    earlier = {"source": "README table of an earlier run"}
    rows = [
        _row("o/a@1", "tests", **earlier),
        _row("o/a@1", "oracles", "improved", proven_by="benchmark", oracle="benchmark", **earlier),
        _row("o/a@1", "exact"),
    ]
    line = oc.table(rows, ["o/a@1"], {})[2]
    assert line.count("‡") == 2 and "(10 s) |" in line  # this run's exact cell is unmarked
    assert oc.counts(rows, ["o/a@1"])["graded"] == ["o/a@1"]
