"""A workload the exact metric cannot count is left out, not the instance rejected: `measure`'s
`drop` hook, the builder's rule for it (fails under Valgrind on both sides, passes natively on
both) and the evaluator never counting what the builder left out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cppperf.services.builder.instance import InstanceResult, _valgrind_only
from cppperf.services.evaluator.instances import EvalInstance
from cppperf.services.evaluator.pipeline import timed_workloads
from cppperf.shared.domain import Verdict
from cppperf.shared.engine.cmake import TestCase as Case
from cppperf.shared.engine.protocol import RunFailure, measure
from cppperf.shared.engine.sandbox import Limits, RunResult
from cppperf.shared.settings import BuilderSettings


def _res(rc: int = 0, *, timed_out: bool = False, ir: int = 1000, unhandled: str | None = None) -> RunResult:
    return RunResult(rc, 0.01, 0.01, "out", timed_out, False, ir=ir, valgrind_unhandled=unhandled)


def _runner(fails: Callable[[str, str, int], bool]) -> tuple[Callable[[str, str], RunResult], list[Any]]:
    calls: list[Any] = []

    def run_one(side: str, name: str) -> RunResult:
        calls.append((side, name))
        n = sum(1 for c in calls if c == (side, name))
        return _res(1 if fails(side, name, n) else 0)

    return run_one, calls


def _measure(run_one: Callable[[str, str], RunResult], tests: list[str], drop: Any) -> Any:
    return measure(tests, run_one, rounds=3, warmup=0, seed=7, metric="cachegrind", drop=drop)  # type: ignore[arg-type]


def test_a_dropped_workload_leaves_the_measurement_and_the_rest_goes_on() -> None:
    asked: list[RunFailure] = []

    def drop(f: RunFailure) -> str | None:
        asked.append(f)
        return "cannot be counted"

    run_one, _ = _runner(lambda side, name, n: name == "b" and side == "new" and n >= 2)
    meas = _measure(run_one, ["a", "b", "c"], drop)
    assert meas.failure is None
    assert [(f.test, f.side, f.round) for f in asked] == [("b", "new", 1)]
    assert meas.left_out == {"b": "cannot be counted"}
    assert set(meas.samples) == {"a", "c"} and "b" not in meas.rounds_run and "b" not in meas.repeats
    assert meas.rounds_run == {"a": 3, "c": 3}
    assert set(meas.decision_samples()) == {"a", "c"}


def test_a_failure_drop_does_not_take_stands() -> None:
    run_one, _ = _runner(lambda side, name, n: name == "b")
    meas = _measure(run_one, ["a", "b"], lambda f: None)
    assert meas.failure is not None and meas.failure.test == "b" and meas.left_out == {}


def test_the_last_workload_is_never_left_out() -> None:
    asked: list[RunFailure] = []
    run_one, _ = _runner(lambda side, name, n: True)
    meas = _measure(run_one, ["a"], lambda f: asked.append(f) or "x")  # type: ignore[func-returns-value]
    assert meas.failure is not None and meas.left_out == {} and asked == []
    run_one, _ = _runner(lambda side, name, n: True)  # two failing: the first goes, the last stands
    meas = _measure(run_one, ["a", "b"], lambda f: "x")
    assert meas.failure is not None and len(meas.left_out) == 1 and meas.failure.test not in meas.left_out


class _Native:
    """A backend whose native (uncounted) runs pass or fail as told, per side."""

    def __init__(self, native_ok: dict[str, bool]) -> None:
        self.native_ok = native_ok
        self.runs: list[tuple[str, bool]] = []

    def run_test(self, side: str, test: Case, limits: Limits) -> RunResult:
        self.runs.append((side, limits.valgrind))
        return _res(0 if self.native_ok[side] else 1)


def _failure(
    test: str = "ld", *, rc: int = 1, timed_out: bool = False, unhandled: str | None = None
) -> RunFailure:
    return RunFailure(test, "new", 1, rc, timed_out, "long double has no 64-bit mantissa", unhandled)


def _rule(
    native_ok: dict[str, bool], counted_other_ok: bool, deciding: tuple[str, ...] = ("ld", "spin")
) -> tuple[Any, _Native, InstanceResult, list[Any]]:
    backend = _Native(native_ok)
    tests = {side: {"ld": Case("ld", ["./ld"], "/")} for side in ("old", "new")}
    counted: list[Any] = []

    def run_one(side: str, name: str) -> RunResult:
        counted.append((side, name))
        return _res(0 if counted_other_ok else 1)

    result = InstanceResult(instance_id="x", verdict=Verdict.REJECTED)
    settings = BuilderSettings(metric="cachegrind", pin_cpu=False)
    drop = _valgrind_only(backend, settings, tests, run_one, result, list(deciding))  # type: ignore[arg-type]
    return drop, backend, result, counted


def test_a_test_failing_counted_on_both_sides_and_passing_natively_is_left_out() -> None:
    drop, backend, result, counted = _rule({"old": True, "new": True}, counted_other_ok=False)
    why = drop(_failure())
    assert why is not None and "fails under Valgrind on both sides (exit 1)" in why
    assert "passes natively on both" in why
    assert counted == [("old", "ld")]  # counted once more on the other side
    assert sorted(backend.runs) == [("new", False), ("old", False)]  # natively, not under Valgrind
    assert result.tried == [f"left ld out of the counted tests: {why}"]


def test_every_other_failure_keeps_its_blame() -> None:
    drop, backend, result, _ = _rule({"old": True, "new": True}, counted_other_ok=True)
    assert drop(_failure()) is None  # counted on the old side it passes: the commit's
    assert backend.runs == []
    for native in ({"old": False, "new": True}, {"old": True, "new": False}):
        drop, _, result, _ = _rule(native, counted_other_ok=False)
        assert drop(_failure()) is None  # fails natively too: the project's or the commit's
        assert result.tried == []
    drop, backend, _, counted = _rule({"old": True, "new": True}, counted_other_ok=False)
    assert drop(_failure(timed_out=True)) is None  # a limit's: timeout
    assert drop(_failure(rc=-9)) is None  # killed (memory, pids)
    assert drop(_failure(unhandled="unhandled instruction bytes: 0x62")) is None  # cpu_fallback's
    assert drop(_failure("bench:BM_x")) is None  # benchmarks are never counted
    assert counted == [] and backend.runs == []


def test_the_last_test_that_runs_the_change_keeps_its_failure() -> None:
    """Coverage's deciding tests are what can show the change: with every one of them left out
    the counts could only say `not-improved` about a change they never measured (controls
    alone cannot prove anything), so the last one's failure stands (blame decides)."""
    drop, backend, result, counted = _rule(
        {"old": True, "new": True}, counted_other_ok=False, deciding=("ld",)
    )
    assert drop(_failure()) is None and counted == [] and backend.runs == [] and result.tried == []
    drop, _, _, _ = _rule({"old": True, "new": True}, counted_other_ok=False, deciding=("ld", "spin"))
    assert drop(_failure()) is not None  # another test that runs the change decides


def test_progress_counts_only_the_workloads_measured_after_a_warm_up_drop() -> None:
    seen: list[tuple[int, int]] = []
    run_one, _ = _runner(lambda side, name, n: name == "b")
    meas = measure(
        ["a", "b", "c"],
        run_one,  # type: ignore[arg-type]
        rounds=4,
        warmup=1,
        seed=3,
        metric="cpu",
        drop=lambda f: "gone",
        progress=lambda d, t: seen.append((d, t)),
        budget=1.0,
        max_rounds=6,
    )
    assert meas.failure is None and meas.left_out == {"b": "gone"}
    assert seen[-1][0] == seen[-1][1]  # done equals the total at the end
    done = sum(meas.rounds_run.values())
    assert done == 2 * meas.rounds and seen[-2] == (done, done)  # the total as measured, b not in it


def _inst(**kw: Any) -> EvalInstance:
    return EvalInstance(
        instance_id="i", repo="o/r", url="u", base_sha="a", expert_sha="b", expert_patch="", **kw
    )


def test_the_evaluator_never_counts_what_the_builder_left_out() -> None:
    common = ["a", "b", "ld"]
    inst = _inst(left_out=["ld"])
    assert timed_workloads(common, inst, [], exact=True) == ["a", "b"]
    assert timed_workloads(common, inst, [], exact=False) == common  # timed natively it runs
    deciding = _inst(left_out=["ld"], deciding_tests=["ld", "b"])
    assert timed_workloads(common, deciding, [], exact=True) == ["b"]
    improved = _inst(left_out=["ld"], improved_tests=["a"])
    assert timed_workloads(common, improved, ["bench:x"], exact=True) == ["a", "bench:x"]
    assert timed_workloads(["ld"], inst, [], exact=True) == ["ld"]  # nothing else: it is tried
