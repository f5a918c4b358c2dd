"""Decisions apart from execution, table-driven (SWE-bench `grading.py`): whose fault a failing test
is (`builder/blame.py`), why a build step failed (`engine/cmake.step_category`), the evaluation
verdict (`evaluator/verdict.py`, `evaluator/checks.check_patch`) and the decision rule's flags
(`DecisionRule`). Every value of `FailureCategory`, `EvalVerdict` and `DecisionRule` has a row here
(a test fails when a value is added without one), and every `Verdict`, `FailureCategory` and
`EvalVerdict` names the test that produces it through the real code path (or why none can)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from cppperf.services.builder.blame import blame, explain, limit_category
from cppperf.services.evaluator import verdict as v
from cppperf.services.evaluator.checks import check_patch
from cppperf.shared.domain import DecisionRule, EvalVerdict, FailureCategory, StatsRecord, Verdict
from cppperf.shared.engine import stats
from cppperf.shared.engine.cmake import step_category
from cppperf.shared.engine.protocol import RunFailure
from cppperf.shared.engine.sandbox import RunResult
from cppperf.shared.rules import Rules
from cppperf.shared.settings import MiningSettings

FC, EV = FailureCategory, EvalVerdict

# ------------------------------------------------------------------------------ whose fault
# (failed side, its re-run passed, the other side passed) -> category
BLAME_ROWS: list[tuple[str, bool, bool, FailureCategory]] = [
    ("new", True, True, FC.TEST_FLAKY),
    ("new", True, False, FC.TEST_FLAKY),  # passed when re-run: flaky, whatever the other side does
    ("old", True, True, FC.TEST_FLAKY),
    ("old", True, False, FC.TEST_FLAKY),
    ("new", False, False, FC.TEST_FAILURE_BOTH_SIDES),
    ("old", False, False, FC.TEST_FAILURE_BOTH_SIDES),
    ("new", False, True, FC.TEST_FAILURE),
    ("old", False, True, FC.TEST_FAILURE_PARENT_ONLY),
]

# (timed out, exit code) -> category, or None: re-run to decide
LIMIT_ROWS: list[tuple[bool, int, FailureCategory | None]] = [
    (True, -9, FC.TIMEOUT),  # the timeout kills with SIGKILL too: it is the timeout
    (True, 0, FC.TIMEOUT),
    (False, -9, FC.RESOURCE_LIMIT),
    (False, 137, FC.RESOURCE_LIMIT),
    (False, 1, None),
    (False, -11, None),  # a crash is the test's own failure
]


def _run(rc: int = 1, *, timed_out: bool = False, memory: bool = False, output: str = "") -> RunResult:
    return RunResult(rc, 1.0, 1.0, output, timed_out, False, memory_exceeded=memory)


# (step, run, a dependency is missing) -> category
STEP_ROWS: list[tuple[str, RunResult, bool, FailureCategory]] = [
    ("configure", _run(timed_out=True), False, FC.TIMEOUT),
    ("configure", _run(-9, memory=True), False, FC.RESOURCE_LIMIT),
    ("configure", _run(), True, FC.DEPENDENCY),
    ("configure", _run(), False, FC.CONFIGURE),
    ("build", _run(timed_out=True), False, FC.TIMEOUT),
    ("build", _run(-9, memory=True), False, FC.RESOURCE_LIMIT),
    ("build", _run(-9), False, FC.INFRA),
    ("build", _run(137), False, FC.INFRA),  # SIGKILL through the jail: bubblewrap exits 128 + 9
    ("build", _run(1, output="c++: fatal error: Killed signal terminated program cc1plus"), False, FC.INFRA),
    ("build", _run(2, output="t.cpp:1: error: 'retrun' was not declared"), False, FC.COMPILE),
]


@pytest.mark.parametrize(("side", "same_ok", "other_ok", "expected"), BLAME_ROWS)
def test_blame(side: str, same_ok: bool, other_ok: bool, expected: FailureCategory) -> None:
    assert blame(side, same_ok=same_ok, other_ok=other_ok) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("timed_out", "rc", "expected"), LIMIT_ROWS)
def test_limit_category(timed_out: bool, rc: int, expected: FailureCategory | None) -> None:
    assert limit_category(timed_out=timed_out, returncode=rc) is expected


@pytest.mark.parametrize(("step", "res", "missing", "expected"), STEP_ROWS)
def test_step_category(step: str, res: RunResult, missing: bool, expected: FailureCategory) -> None:
    assert step_category(step, res, missing=missing) is expected


EXPLAINED = {
    FC.TIMEOUT: "(timed out)",
    FC.RESOURCE_LIMIT: "killed (resource limit)",
    FC.TEST_FLAKY: "passed when re-run there",
    FC.TEST_FAILURE_BOTH_SIDES: "fails on both sides in Release",
    FC.TEST_FAILURE: "new side only (the commit broke it)",
    FC.TEST_FAILURE_PARENT_ONLY: "the commit fixes it",
}


@pytest.mark.parametrize("category", list(EXPLAINED))
def test_explain_says_whose_fault(category: FailureCategory) -> None:
    f = RunFailure(test="spin", side="new", round=3, returncode=1, timed_out=False, output_tail="boom")
    detail = explain(category, f, "Release")
    assert EXPLAINED[category] in detail and detail.startswith("test spin failed on the new side in round 3")
    assert detail.endswith("boom")


def test_explain_refuses_a_category_no_run_decides() -> None:
    f = RunFailure(test="spin", side="new", round=0, returncode=1, timed_out=False, output_tail="")
    with pytest.raises(ValueError, match="compile"):
        explain(FC.COMPILE, f, "Release")


# -------------------------------------------------------------------------- the evaluation
GOOD = "--- a/src/core.cpp\n+++ b/src/core.cpp\n@@ -1 +1 @@\n-int x;\n+int y;\n"
TEST_EDIT = "--- a/tests/test_spin.cpp\n+++ b/tests/test_spin.cpp\n@@ -1 +1 @@\n-int x;\n+int y;\n"
FORBIDDEN = "--- a/build.sh\n+++ b/build.sh\n@@ -1 +1 @@\n-echo a\n+echo b\n"
ESCAPE = "diff --git a/../../x b/../../x\n--- a/../../x\n+++ b/../../x\n@@ -0,0 +1 @@\n+pwned\n"

# a patch's text -> the check's verdict (None: it passes); limit 400 bytes
PATCH_ROWS: list[tuple[str, EvalVerdict | None]] = [
    ("", EV.EMPTY_PATCH),
    ("make it faster please\n", EV.MALFORMED_PATCH),
    (GOOD + "+" + "x" * 400 + "\n", EV.TOO_LARGE),
    (ESCAPE, EV.UNSAFE_PATCH),
    (TEST_EDIT, EV.TEST_EDIT),
    (FORBIDDEN, EV.FORBIDDEN_FILE),
    (GOOD, None),
]


@pytest.mark.parametrize(("patch", "expected"), PATCH_ROWS)
def test_patch_check(patch: str, expected: EvalVerdict | None) -> None:
    got = check_patch(patch, Rules.from_settings(MiningSettings()), max_bytes=400)
    assert (got.verdict, got.ok) == (expected, expected is None), got.reason


# (function, its arguments) -> verdict (None: the pipeline goes on)
STEP_VERDICT_ROWS: list[tuple[str, tuple[object, ...], dict[str, object], EvalVerdict | None]] = [
    ("instance_id_verdict", ("../../etc__passwd-0123456789ab",), {}, EV.UNKNOWN_INSTANCE),
    ("instance_id_verdict", ("owner__name",), {}, EV.UNKNOWN_INSTANCE),
    ("instance_id_verdict", ("owner__name-0123456789ab",), {}, None),
    (
        "refusal",
        ("bubblewrap: not installed",),
        {"trust_patches": False, "docker": False},
        EV.UNTRUSTED_REFUSED,
    ),
    ("refusal", ("bubblewrap: not installed",), {"trust_patches": True, "docker": False}, None),
    ("refusal", ("bubblewrap: not installed",), {"trust_patches": False, "docker": True}, None),
    ("refusal", ("",), {"trust_patches": False, "docker": False}, None),
    ("apply_verdict", (False,), {}, EV.APPLY_FAILED),
    ("apply_verdict", (True,), {}, None),
    ("build_verdict", ("agent",), {}, EV.BUILD_FAILED),
    ("build_verdict", ("old",), {}, EV.INSTANCE_BROKEN),
    ("build_verdict", ("expert",), {}, EV.INSTANCE_BROKEN),
    ("tests_defined_verdict", (False,), {}, EV.TEST_EDIT),
    ("tests_defined_verdict", (True,), {}, None),
    ("common_tests_verdict", ([],), {}, EV.INSTANCE_BROKEN),
    ("common_tests_verdict", (["spin"],), {}, None),
    ("correctness_verdict", ([],), {}, None),
    ("correctness_verdict", ([True, True],), {}, EV.TIMEOUT),
    ("correctness_verdict", ([True, False],), {}, EV.TESTS_FAILED),
    ("correctness_verdict", ([False],), {}, EV.TESTS_FAILED),
    ("timing_verdict", ("agent",), {"timed_out": True}, EV.TIMEOUT),
    ("timing_verdict", ("agent",), {"timed_out": False}, EV.TESTS_FAILED),
    ("timing_verdict", ("old",), {"timed_out": False}, EV.INSTANCE_BROKEN),
    ("timing_verdict", ("expert",), {"timed_out": True}, EV.INSTANCE_BROKEN),
    ("score_verdict", (True,), {}, EV.OPT),
    ("score_verdict", (False,), {}, EV.CORRECT),
]


@pytest.mark.parametrize(("fn", "args", "kwargs", "expected"), STEP_VERDICT_ROWS)
def test_step_verdict(fn: str, args: tuple[object, ...], kwargs: dict[str, object], expected: object) -> None:
    assert getattr(v, fn)(*args, **kwargs) is expected


# ------------------------------------------------------------------------- decision rules
def _stats(**flags: bool) -> StatsRecord:
    base = dict.fromkeys(("n_old", "n_new"), 10)
    nums = ("median_old", "median_new", "mean_old", "mean_new", "median_change", "mean_change")
    more = ("ratio", "ci_low", "ci_high", "p_improve", "p_regress")
    return StatsRecord(name="t", **base, **dict.fromkeys(nums + more, 1.0), **flags)  # type: ignore[arg-type]


# (the test's flags, rule) -> (improved, regressed)
RULE_ROWS: list[tuple[dict[str, bool], DecisionRule, tuple[bool, bool]]] = [
    ({"improved": True}, DecisionRule.OURS, (True, False)),
    ({"regressed": True}, DecisionRule.OURS, (False, True)),
    ({"strict_improved": True}, DecisionRule.OURS, (False, False)),
    ({"strict_improved": True}, DecisionRule.STRICT, (True, False)),
    ({"strict_regressed": True, "improved": True}, DecisionRule.STRICT, (False, True)),
    ({"paper_improved": True}, DecisionRule.PAPER, (True, False)),
    ({"paper_regressed": True, "strict_improved": True}, DecisionRule.PAPER, (False, True)),
    ({"improved": True, "regressed": True}, DecisionRule.PAPER, (False, False)),
]


@pytest.mark.parametrize(("flags", "rule", "expected"), RULE_ROWS)
def test_decision_rule_flags(flags: dict[str, bool], rule: DecisionRule, expected: tuple[bool, bool]) -> None:
    t = _stats(**flags)
    assert rule.flags(t) == expected and (rule.improved(t), rule.regressed(t)) == expected
    want = "regressed" if expected[1] else ("improved" if expected[0] else "not-improved")
    assert stats.verdict([t], rule=rule) == want  # the instance verdict reads the same flags


# --------------------------------------------------------------- every value has a row
# produced through the real code path: the test that does it, or why no test can
REAL_FAILURES: dict[FailureCategory, str] = {
    FC.CONFIGURE: "tests/integration/test_whose_fault.py::test_a_configure_error_is_configure",
    FC.DEPENDENCY: "tests/integration/test_builder.py::test_missing_dependency_is_named",
    FC.COMPILE: "tests/integration/test_builder.py::test_compile_error_rejects_as_compile",
    FC.TEST_FAILURE: "tests/integration/test_whose_fault.py::test_the_commit_broke_it",
    FC.TEST_FAILURE_BOTH_SIDES: "tests/integration/test_whose_fault.py::test_fails_everywhere_is_not_the_commits_fault",
    FC.TEST_FAILURE_PARENT_ONLY: "tests/integration/test_whose_fault.py::test_the_commit_fixed_it_is_parent_only",
    FC.TEST_FLAKY: "tests/integration/test_whose_fault.py::test_a_test_that_passes_when_run_again_is_flaky",
    FC.TIMEOUT: "tests/integration/test_whose_fault.py::test_a_hanging_test_is_a_timeout",
    FC.RESOURCE_LIMIT: "tests/integration/test_docker.py::test_memory_hog_is_a_resource_limit_not_a_result",
    FC.INFRA: "tests/integration/test_whose_fault.py::test_a_build_killed_from_outside_is_infra",
    FC.NO_TESTS: "tests/integration/test_whose_fault.py::test_no_common_test_is_no_tests",
}
REAL_BUILDS: dict[Verdict, str] = {
    Verdict.IMPROVED: "tests/integration/test_builder.py::test_perf_commit_is_improved_and_names_the_test",
    Verdict.NOT_IMPROVED: "tests/integration/test_builder.py::test_noop_commit_is_not_improved",
    Verdict.REGRESSED: "tests/integration/test_builder.py::test_slowdown_is_a_regression",
    Verdict.UNCHANGED_BINARIES: "tests/integration/test_builder.py::test_comment_only_commit_short_circuits",
    Verdict.REJECTED: "tests/integration/test_builder.py::test_compile_error_rejects_as_compile",
}
REAL_VERDICTS: dict[EvalVerdict, str] = {
    EV.OPT: "tests/integration/test_evaluator.py::test_expert_patch_is_opt",
    EV.CORRECT: "tests/integration/test_evaluator.py::test_slower_patch_is_correct_without_speedup",
    EV.TESTS_FAILED: "tests/integration/test_evaluator.py::test_breaking_patch_names_the_test",
    EV.TIMEOUT: "tests/integration/test_evaluator.py::test_infinite_loop_times_out",
    EV.BUILD_FAILED: "tests/integration/test_evaluator.py::test_compile_error_patch",
    EV.APPLY_FAILED: "tests/integration/test_evaluator.py::test_patch_that_does_not_apply",
    EV.EMPTY_PATCH: "tests/integration/test_evaluator.py::test_bad_patches_are_refused_before_running",
    EV.MALFORMED_PATCH: "tests/integration/test_evaluator.py::test_bad_patches_are_refused_before_running",
    EV.TOO_LARGE: "tests/integration/test_evaluator.py::test_an_over_long_patch_is_too_large",
    EV.UNSAFE_PATCH: "tests/integration/test_evaluator.py::test_bad_patches_are_refused_before_running",
    EV.TEST_EDIT: "tests/integration/test_evaluator.py::test_bad_patches_are_refused_before_running",
    EV.FORBIDDEN_FILE: "tests/integration/test_hostile.py::test_crlf_names_cannot_smuggle_a_second_file",
    EV.INSTANCE_BROKEN: "tests/integration/test_evaluator.py::test_an_original_that_no_longer_builds_is_instance_broken",
    EV.UNKNOWN_INSTANCE: "tests/integration/test_hostile.py::test_instance_id_traversal_is_refused_before_any_path",
    EV.UNTRUSTED_REFUSED: "tests/integration/test_evaluator.py::test_no_jail_is_untrusted_refused",
}


def test_every_failure_category_has_a_decision_row() -> None:
    decided = {r[-1] for r in BLAME_ROWS} | {r[-1] for r in LIMIT_ROWS} | {r[-1] for r in STEP_ROWS}
    # no-tests: no test on both sides (instance.py); dependency also from a missing submodule
    missing = set(FailureCategory) - decided - {FC.NO_TESTS}
    assert not missing, f"no table row decides {sorted(missing)}"


def test_every_eval_verdict_has_a_decision_row() -> None:
    decided = {r[-1] for r in PATCH_ROWS} | {r[-1] for r in STEP_VERDICT_ROWS}
    missing = set(EvalVerdict) - decided
    assert not missing, f"no table row decides {sorted(missing)}"


def test_every_decision_rule_has_a_row() -> None:
    assert {r[1] for r in RULE_ROWS} == set(DecisionRule)


@pytest.mark.parametrize(
    "table", [REAL_BUILDS, REAL_FAILURES, REAL_VERDICTS], ids=["verdict", "failure-category", "eval-verdict"]
)
def test_every_value_is_produced_by_a_real_run(
    table: dict[Verdict, str] | dict[FailureCategory, str] | dict[EvalVerdict, str],
) -> None:
    enum = type(next(iter(table)))
    assert set(table) == set(enum), f"no producing test named for {sorted(set(enum) - set(table))}"
    root = Path(__file__).resolve().parents[2]
    for value, where in table.items():
        if where.startswith("not feasible"):
            continue
        path, name = where.split("::")
        assert (root / path).is_file(), (value, where)
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert callable(getattr(module, name, None)), f"{value}: {where} does not exist"
        text = (root / path).read_text()
        at = text.index(f"\ndef {name}(")
        body = text[text.rfind("\n\n\n", 0, at) : text.find("\n\n\n", at)]  # decorators too
        assert f'"{value}"' in body, f"{where} never checks {value!r}"
