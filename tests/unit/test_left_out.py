"""A workload the exact metric cannot count is left out, not the instance rejected: `measure`'s
`drop` hook, the builder's rule for it (fails under Valgrind on both sides, passes natively on
both) and the evaluator never counting what the builder left out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cppperf.services.builder.instance import InstanceResult, _valgrind_only
from cppperf.services.evaluator.pipeline import CpuFallback, Trees, _timed, timed_workloads
from cppperf.shared.domain import Verdict
from cppperf.shared.engine.cmake import TestCase as Case
from cppperf.shared.engine.leftout import metric_limit
from cppperf.shared.engine.protocol import RunFailure, measure
from cppperf.shared.engine.sandbox import Limits, RunResult
from cppperf.shared.settings import BuilderSettings
from tests.conftest import eval_instance, make_settings


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


def test_the_evaluator_never_counts_what_the_builder_left_out() -> None:
    common = ["a", "b", "ld"]
    inst = eval_instance(left_out=["ld"])
    assert timed_workloads(common, inst, [], exact=True) == ["a", "b"]
    assert timed_workloads(common, inst, [], exact=False) == common  # timed natively it runs
    deciding = eval_instance(left_out=["ld"], deciding_tests=["ld", "b"])
    assert timed_workloads(common, deciding, [], exact=True) == ["b"]
    improved = eval_instance(left_out=["ld"], improved_tests=["a"])
    assert timed_workloads(common, improved, ["bench:x"], exact=True) == ["a", "bench:x"]
    assert timed_workloads(["ld"], inst, [], exact=True) == ["ld"]  # nothing else: it is tried


def test_the_evaluators_rule_asks_every_other_side_counted_and_every_side_natively() -> None:
    """The same rule over old/expert/agent: an agent's tree is never blamed for what Valgrind
    cannot count on the original and the expert either."""
    sides = ("old", "agent", "expert")
    asked: list[tuple[str, str, str]] = []

    def on(kind: str, ok: Callable[[str], bool]) -> Callable[[str, str], RunResult]:
        def run(side: str, name: str) -> RunResult:
            asked.append((kind, side, name))
            return _res(0 if ok(side) else 1)

        return run

    heard: list[tuple[str, str]] = []
    drop = metric_limit(
        sides,
        on("counted", lambda s: False),
        on("native", lambda s: True),
        left=lambda t, w: heard.append((t, w)),
    )
    agent_failed = RunFailure("ld", "agent", 0, 1, False, "", None)
    why = drop(agent_failed)
    assert (
        why is not None
        and "fails under Valgrind on all 3 sides (exit 1)" in why
        and "natively on all 3" in why
    )
    assert [a for a in asked if a[0] == "counted"] == [("counted", "old", "ld"), ("counted", "expert", "ld")]
    assert sorted(a[1] for a in asked if a[0] == "native") == ["agent", "expert", "old"]
    assert heard == [("ld", why)]
    # the expert's tree counts it: the agent's tree is the cause, its failure stands
    drop = metric_limit(sides, on("counted", lambda s: s == "expert"), on("native", lambda s: True))
    assert drop(agent_failed) is None
    # it fails natively on the agent's tree: the agent's
    drop = metric_limit(sides, on("counted", lambda s: False), on("native", lambda s: s != "agent"))
    assert drop(agent_failed) is None


class _Trees:
    """Three trees' runs: `ld` fails under Valgrind everywhere (passes natively), `spin` counts
    `ir[side]` instructions; `unhandled` sides meet an instruction Valgrind lacks in `spin`."""

    def __init__(
        self, unhandled: tuple[str, ...] = (), native_fails: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.ir = {"old": 3_000_000, "expert": 1_000_000, "agent": 1_000_000}
        self.unhandled, self.native_fails = unhandled, native_fails
        self.runs: list[tuple[str, str, bool]] = []

    def instructions_unsupported(self) -> str:
        return "no PMU here"

    def run_test(self, side: str, test: Case, limits: Limits) -> RunResult:
        self.runs.append((side, test.name, limits.valgrind))
        if not limits.valgrind:
            rc = 1 if (side, test.name) in self.native_fails else 0
            return RunResult(rc, 0.01, self.ir[side] / 1e8, "ok", False, False)
        if test.name == "ld":
            return _res(1)
        if side in self.unhandled:
            return RunResult(
                -4, 0.1, 0.1, "SIGILL", False, False, valgrind_unhandled="unhandled instruction bytes: 0x62"
            )
        return _res(0, ir=self.ir[side])


def _timed_on(trees: _Trees, timed: list[str], tmp: Any) -> tuple[Any, Any, CpuFallback | None]:
    s = make_settings(
        tmp, builder={"metric": "cachegrind", "pin_cpu": False, "exact_runs": 3, "runs": 5, "warmup": 1}
    )
    workloads = {
        side: {n: Case(n, [f"./{n}"], "/") for n in ("spin", "ld")} for side in ("old", "agent", "expert")
    }

    def limits(t: Case, cpu: int | None = None, instructions: bool = False) -> Limits:
        return Limits(timeout=60, cpu=cpu, instructions=instructions)

    return _timed(Trees(trees, timed, workloads, [], limits, lambda *_: None), s, count=False)  # type: ignore[arg-type]


def test_the_evaluator_leaves_out_what_no_tree_can_be_counted_on(tmp_path: Any) -> None:
    trees = _Trees()
    meas, _, fallback = _timed_on(trees, ["spin", "ld"], tmp_path)
    assert fallback is None and meas.failure is None and meas.metric == "cachegrind"
    assert list(meas.left_out) == ["ld"] and "on all 3 sides" in meas.left_out["ld"]
    assert (
        set(meas.samples) == {"spin"} and meas.samples["spin"].by_metric("cachegrind")["agent"] == [1e6] * 3
    )


def test_the_evaluator_times_on_cpu_when_the_counts_cannot_grade(tmp_path: Any) -> None:
    """The last workload uncountable on every tree, or an instruction Valgrind lacks (an agent's
    AVX-512 is an optimisation): measured once more on CPU time, never the agent's failure."""
    for trees, timed, said in (
        (_Trees(), ["ld"], "ld fails under Valgrind on all 3 sides"),
        (_Trees(unhandled=("agent",)), ["spin"], "Valgrind cannot run spin on the agent side (unhandled"),
    ):
        meas, pin, fallback = _timed_on(trees, timed, tmp_path)
        assert fallback is not None and fallback.expert_where == ""
        assert fallback.reason.startswith(said) and fallback.reason.endswith(": timed on cpu instead"), (
            fallback
        )
        assert meas.failure is None and meas.metric == "cpu" and pin is None
        assert set(meas.samples) == set(timed) and len(meas.samples[timed[0]].cpu["agent"]) >= 5
        assert any(not counted for _, _, counted in trees.runs[-3:])  # the last runs were native


def test_a_failure_the_rule_kept_is_the_failure_not_a_fallback(tmp_path: Any) -> None:
    """`ld` fails natively on the original too: not the metric's limit — the failure stands (the
    instance's or a tree's, as before), asked about once, and the counts are not swapped for CPU."""
    trees = _Trees(native_fails=(("old", "ld"),))
    meas, _, fallback = _timed_on(trees, ["spin", "ld"], tmp_path)
    assert fallback is None and meas.failure is not None and meas.failure.test == "ld"
    assert meas.left_out == {} and meas.metric == "cachegrind"
    assert [r for r in trees.runs if r[1] == "ld" and not r[2]] == [("old", "ld", False)]  # one native run


def test_where_valgrind_stopped_in_the_experts_tree_is_kept_apart_from_the_reason(tmp_path: Any) -> None:
    """The expert's tree meets an instruction Valgrind lacks: timed on cpu, the reason names the
    side but not where (the expert's code); where is kept apart, for the operator's report only."""
    meas, _, fallback = _timed_on(_Trees(unhandled=("expert",)), ["spin"], tmp_path)
    assert fallback is not None and meas.metric == "cpu" and meas.failure is None
    assert fallback.reason.startswith("Valgrind cannot run spin on the expert side (an instruction it lacks)")
    assert "0x62" not in fallback.reason and fallback.expert_where == "unhandled instruction bytes: 0x62"
