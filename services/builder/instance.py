"""Prove (or refute) one patch: build both sides, compare binaries, time tests, decide.

Verdicts: `improved`, `not-improved`, `regressed`, `unchanged-binaries`, `rejected` (with a
failure category: configure, dependency, compile, test-failure, test-failure-both-sides,
test-failure-parent-only, test-flaky, timeout, resource-limit, infra, no-tests).
A rejected instance is a verdict about the patch or its build, never an exception.

Whose fault a failing test is: the failing run is repeated on its own side and run on the other
side once. Failing on the new side only is `test-failure` (the commit broke it); failing on both
sides is `test-failure-both-sides` (the project or the build profile, not the commit), and then,
when the build type is not already `builder.fallback_build_type` (Debug, as the paper built), both
sides are rebuilt and proved once more in that build type. A build whose compiler errors are all
warnings made errors (`-Werror` meeting a newer compiler's warnings) is rebuilt once with
`-Wno-error` after every flag (`builder.werror_fallback`), recorded as the attempt's
`profile_change`. Under `builder.metric=cachegrind`, a rejection because Valgrind could not run
a test's binary (an instruction it lacks: AVX-512 from `-march=native`) is proven once more on
cpu (`cpu_fallback`, profile change `metric cpu`). Every attempt is recorded (`attempts`), with
the failing step, the log lines that matter and what cppperf tried; earlier attempts' logs are
kept in `logs/attempt-<n>-<type>/`.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec

from cppperf.services.builder.blame import blame, explain, limit_category
from cppperf.shared.domain import (
    Attempt,
    BenchmarkWorkload,
    BuildStep,
    Confirmation,
    Coverage,
    DecisionRule,
    Environment,
    FailureCategory,
    SkippedBenchmark,
    StatsRecord,
    Verdict,
)
from cppperf.shared.engine.backend import SIDES, Backend, SideName, Sides, build_sides
from cppperf.shared.engine.benchmarks import (
    Discovered,
    bench_settings,
    executables_identical,
    is_benchmark,
    timed_run,
)
from cppperf.shared.engine.benchmarks import find as find_benchmarks
from cppperf.shared.engine.cases import split as split_cases
from cppperf.shared.engine.cmake import (
    NO_WERROR_ARGS,
    BuildSpec,
    StepResult,
    TestCase,
    werror_only,
)
from cppperf.shared.engine.coverage import flag_controls, measure_coverage, split_family
from cppperf.shared.engine.errorlines import first_error_lines
from cppperf.shared.engine.leases import Turns, core_plan, exact_metric, timing_turns
from cppperf.shared.engine.leftout import metric_limit
from cppperf.shared.engine.limits import limits_for
from cppperf.shared.engine.protocol import Drop, Measurement, RunFailure, check_metric, measure
from cppperf.shared.engine.sandbox import Limits, RunResult
from cppperf.shared.engine.stats import compare_all, compare_test, power_problem, verdict
from cppperf.shared.engine.submodules import MissingSubmodule
from cppperf.shared.logging import get_logger
from cppperf.shared.settings import BuilderSettings

log = get_logger(__name__)

PhaseCallback = Callable[[str, int, int], None]  # phase, done, total


@dataclass
class InstanceResult:
    instance_id: str
    verdict: Verdict
    verdict_paper: Verdict = Verdict.REJECTED
    verdict_strict: Verdict = Verdict.REJECTED
    decision_rule: DecisionRule = DecisionRule.OURS  # the rule whose verdict is `verdict`
    compared_tests: list[str] = field(default_factory=list)  # tests on both sides
    failure_category: FailureCategory | None = None
    failure_detail: str = ""
    improved_tests: list[str] = field(default_factory=list)
    regressed_tests: list[str] = field(default_factory=list)
    tests: list[StatsRecord] = field(default_factory=list)
    confirmations: dict[str, Confirmation] = field(default_factory=dict)
    measurement: Measurement | None = None
    build_steps: list[BuildStep] = field(default_factory=list)
    added_tests: list[str] = field(default_factory=list)
    removed_tests: list[str] = field(default_factory=list)
    missing_packages: list[str] = field(default_factory=list)
    llm_proposed_packages: list[str] = field(default_factory=list)
    environment: Environment = field(default_factory=Environment)
    failure_step: str = ""  # checkout | configure | build | tests | test
    failure_lines: list[str] = field(default_factory=list)  # the log lines that matter
    tried: list[str] = field(default_factory=list)  # what cppperf did about the failure
    attempts: list[Attempt] = field(default_factory=list)  # one per build profile tried
    werror_only: bool = False  # the build failed on warnings made errors only
    # the project's benchmarks as workloads (engine/benchmarks.py): timed beside the tests, one
    # family with them; `improved_tests`/`regressed_tests` name tests only, these the benchmarks
    benchmark_workloads: list[BenchmarkWorkload] = field(default_factory=list)
    benchmarks_skipped: list[SkippedBenchmark] = field(default_factory=list)
    improved_benchmarks: list[str] = field(default_factory=list)
    regressed_benchmarks: list[str] = field(default_factory=list)
    coverage: Coverage | None = None  # builder.coverage: which tests run the change
    metric: str = ""  # the metric this attempt measured on (`builder.metric`, or cpu after `cpu_fallback`)
    valgrind_unhandled: str = ""  # a failed run's instruction Valgrind could not run (`RunFailure`)

    def attempt_summary(self, build_type: str, profile_change: str = "") -> Attempt:
        return Attempt(
            build_type=build_type,
            profile_change=profile_change,
            verdict=self.verdict,
            failure_category=self.failure_category,
            failure_step=self.failure_step,
            failure_lines=self.failure_lines,
            failure_detail=self.failure_detail[:600],
            tried=list(self.tried),
            build_steps=list(self.build_steps),
        )


def _cppperf_version() -> str:
    try:
        return metadata.version("cppperf")
    except metadata.PackageNotFoundError:
        return "unknown"


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def environment_facts(settings: BuilderSettings) -> Environment:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    plan = core_plan(settings)
    return Environment(
        platform=platform.platform(),
        cpu_model=cpu,
        cpu_count=os.cpu_count(),
        python=platform.python_version(),
        cppperf_version=_cppperf_version(),
        profile=settings.profile,
        build_type=settings.effective_build_type(),
        thread_env=dict(settings.thread_env),
        pinned_cpu=settings.pin_cpu,
        timing_cores=list(plan.timing),
        build_cores=list(plan.build),
        leased_core=None,
        load_average_start=_loadavg(),
    )


def _build_step(side: SideName, s: StepResult) -> BuildStep:
    return BuildStep(
        side=side,
        step=s.step,
        command=list(s.argv),
        ok=s.ok,
        seconds=round(s.result.wall_s, 3),
        category=s.category,
        log=str(s.log_path) if s.log_path else None,
    )


def _build_both(
    backend: Backend,
    result: InstanceResult,
    phase: PhaseCallback,
    llm_propose: Callable[[str], list[str]] | None,
) -> tuple[FailureCategory, str] | None:
    """Configure and build both sides; the (category, detail) of the first failure, if any (its
    step, log lines and what was tried go into `result`)."""

    def record(side: SideName, steps: list[StepResult]) -> None:
        result.build_steps += [_build_step(side, s) for s in steps]
        if not steps[-1].ok and sum(1 for st in steps if st.step == "configure") > 1:
            missing = steps[-1].missing.debian if steps[-1].missing else []
            result.tried.append(f"configured again with {' '.join(missing)} installed")

    failed = build_sides(backend, SIDES, on_built=record, phase=phase)
    if failed is None:
        return None
    side, last = failed.side, failed.step
    if last.missing is not None:
        result.missing_packages = last.missing.debian
    result.failure_step = last.step
    result.failure_lines = first_error_lines(last.result.output)
    result.werror_only = last.step == "build" and werror_only(last.result.output)
    if (
        llm_propose is not None
        and last.step == "configure"
        and (last.missing is None or last.missing.unknown)
    ):
        proposed = [p for p in llm_propose(last.result.output) if p not in result.missing_packages]
        if proposed:
            result.missing_packages += proposed
            result.llm_proposed_packages = proposed
            last.category = FailureCategory.DEPENDENCY
            result.tried.append(f"asked the model for packages: {' '.join(proposed)}")
    detail = last.missing.describe() if last.missing else last.result.output[-1500:]
    if result.llm_proposed_packages:
        detail += f"; model proposes: {' '.join(result.llm_proposed_packages)}"
    return last.category or FailureCategory.INFRA, f"{side} {last.step} failed: {detail}"


def prove(
    iid: str,
    backend: Backend,
    settings: BuilderSettings,
    *,
    sides: Sides | None,
    repo_path: Path | None = None,
    on_phase: PhaseCallback | None = None,
    seed: int | None = None,
    llm_propose: Callable[[str], list[str]] | None = None,
    time_identical: bool = False,
    coverage: Coverage | None = None,
) -> InstanceResult:
    """Run the whole protocol for instance `iid`: `sides` `{"old": parent, "new": sha}` exported from
    `repo_path`, or None when the backend holds the trees already (an instance image). With
    `time_identical` byte-identical binaries are timed anyway (an A/A calibration run). When a test
    fails on both sides, once more in `settings.fallback_build_type` (both attempts recorded); when
    Valgrind cannot run the project's binaries under the exact metric, once more on cpu (`cpu_fallback`).
    `coverage`: a recorded one (reproducing an instance) decides instead of a new measurement."""
    if sides is not None and repo_path is None:
        raise ValueError("prove: sides to export need the repository they come from")
    once = _Once(iid, sides, repo_path, backend, on_phase, seed, llm_propose, time_identical, coverage)
    current = _attempt(once, settings)
    current.attempts = [current.attempt_summary(settings.effective_build_type())]
    if (
        current.failure_category == FailureCategory.COMPILE
        and current.werror_only
        and settings.werror_fallback
        and not set(NO_WERROR_ARGS) <= set(backend.spec.extra_args)
    ):
        spec = replace(backend.spec, extra_args=(*backend.spec.extra_args, *NO_WERROR_ARGS))
        current = _retry(once, current, settings, spec, "-Wno-error", "rebuilt both sides with -Wno-error")
    why = cpu_fallback(current, settings)
    if why is not None:  # the exact metric's limit, not the project's: measured on CPU time instead
        settings = msgspec.structs.replace(settings, metric="cpu")
        current = _retry(once, current, settings, backend.spec, "metric cpu", why)
    fallback = settings.fallback_build_type
    if (
        current.failure_category != FailureCategory.TEST_FAILURE_BOTH_SIDES
        or not fallback
        or fallback == settings.effective_build_type()
    ):
        return current
    spec = replace(backend.spec, build_type=fallback)
    return _retry(
        once, current, replace_settings(settings, fallback), spec, "", f"rebuilt both sides in {fallback}"
    )


def cpu_fallback(result: InstanceResult, settings: BuilderSettings) -> str | None:
    """The `tried` line of proving once more on CPU time, when an attempt under the exact metric
    was rejected because Valgrind could not run a test's binary (an instruction it lacks, e.g.
    AVX-512 from `-march=native`: Valgrind 3.19 has none); None when nothing calls for it."""
    if not exact_metric(settings) or result.verdict != Verdict.REJECTED or not result.valgrind_unhandled:
        return None
    return (
        f"Valgrind cannot run this project's binaries ({result.valgrind_unhandled}): measured on cpu instead"
    )


def _retry(
    once: _Once,
    prev: InstanceResult,
    settings: BuilderSettings,
    spec: BuildSpec,
    change: str,
    what: str,
) -> InstanceResult:
    """Prove once more with `spec` (a clean workspace); the earlier attempts and their logs kept.
    A rejection after the build type's retry keeps the earlier category (what the project does in
    the configured build type); after the -Wno-error retry its own (that build got further)."""
    backend = once.backend
    n = len(prev.attempts)
    kept = _read_logs(backend.logs)  # the retry starts from a clean workspace: keep the logs
    backend.cleanup()
    backend.spec = spec
    nxt = _attempt(once, settings)
    earlier = backend.logs / f"attempt-{n}-{prev.attempts[-1].build_type}"
    _write_logs(earlier, kept)
    for step in prev.build_steps:  # the same BuildSteps as in prev.attempts[-1]
        if step.log and Path(step.log).parent == backend.logs:
            step.log = str(earlier / Path(step.log).name)
    changes = [a.profile_change for a in prev.attempts if a.profile_change] + ([change] if change else [])
    nxt.attempts = [*prev.attempts, nxt.attempt_summary(spec.build_type, " ".join(changes))]
    nxt.tried = [*prev.tried, what, *nxt.tried]
    if nxt.verdict == Verdict.REJECTED:
        first = prev
        nxt.failure_detail = (
            f"{first.failure_detail}; {what}, then: {nxt.failure_category}: {nxt.failure_detail}"
        )
        if not change:  # the build type's retry: the default profile's category stands
            nxt.failure_category, nxt.failure_step = first.failure_category, first.failure_step
            nxt.failure_lines = first.failure_lines
    return nxt


def _read_logs(logs: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in logs.glob("*.log") if f.is_file()} if logs.is_dir() else {}


def _write_logs(dest: Path, logs: dict[str, bytes]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in logs.items():
        (dest / name).write_bytes(data)


def replace_settings(settings: BuilderSettings, build_type: str) -> BuilderSettings:
    return msgspec.structs.replace(settings, build_type=build_type)


@dataclass(frozen=True)
class _Once:
    """One attempt's inputs, apart from the settings (the fallback changes the build type)."""

    iid: str
    sides: Sides | None
    repo_path: Path | None
    backend: Backend
    on_phase: PhaseCallback | None
    seed: int | None
    llm_propose: Callable[[str], list[str]] | None
    time_identical: bool
    coverage: Coverage | None = None  # a recorded one: decides instead of a measurement


# one attempt of the protocol in `settings`' build type (`prove` retries with another)
def _attempt(once: _Once, settings: BuilderSettings) -> InstanceResult:
    iid, backend, seed, llm_propose = once.iid, once.backend, once.seed, once.llm_propose
    phase = once.on_phase or (lambda _p, _d, _t: None)
    result = InstanceResult(
        instance_id=iid,
        verdict=Verdict.REJECTED,
        environment=environment_facts(settings),
        metric=settings.metric,
    )

    def reject(category: FailureCategory, detail: str) -> InstanceResult:
        result.verdict, result.failure_category, result.failure_detail = Verdict.REJECTED, category, detail
        result.verdict_paper = result.verdict_strict = Verdict.REJECTED
        return result

    phase("checkout", 0, 1)
    try:
        if once.sides is not None:
            assert once.repo_path is not None
            backend.prepare(once.repo_path, once.sides)
    except MissingSubmodule as exc:
        result.failure_step = "checkout"
        result.failure_lines = [str(exc)]
        result.tried = list(exc.tried)
        return reject(FailureCategory.DEPENDENCY, str(exc))
    count = check_metric(backend, settings)  # before any build: an impossible metric fails fast
    phase("checkout", 1, 1)
    failure = _build_both(backend, result, phase, llm_propose)
    if failure is not None:
        return reject(*failure)
    phase("build new", 2, 2)
    result.environment = msgspec.structs.replace(  # compiler_version, cmake_version
        result.environment, **{f"{k}_version": v for k, v in backend.toolchain().items()}
    )

    tests_by_side: dict[SideName, dict[str, TestCase]] = {
        side: {t.name: t for t in backend.tests(side) if not t.disabled} for side in SIDES
    }
    common = sorted(set(tests_by_side["old"]) & set(tests_by_side["new"]))
    result.added_tests = sorted(set(tests_by_side["new"]) - set(tests_by_side["old"]))
    result.removed_tests = sorted(set(tests_by_side["old"]) - set(tests_by_side["new"]))
    result.compared_tests = common
    if not common:
        result.failure_step = "tests"
        result.tried.append("enabled BUILD_TESTING and the project's own test options")
        return reject(FailureCategory.NO_TESTS, "no CTest test exists on both sides")
    if (
        not once.time_identical
        and backend.binaries_identical(common)
        and executables_identical(backend, settings)
    ):
        result.verdict = result.verdict_paper = result.verdict_strict = Verdict.UNCHANGED_BINARIES
        return result
    tests_by_side, common = _before_timing(once, tests_by_side, common, settings, result, phase)
    benches = _benchmarks(backend, settings, result, phase)

    run_seed = settings.seed if seed is None else seed
    exact = exact_metric(settings)
    _check_power(len(split_family(result.coverage, common)[0]) + len(benches.common), settings, result)
    with timing_turns(settings, phase) as turns:
        run_one = _runner(backend, settings, tests_by_side, benches, turns, count=count, exact=exact)
        deciding = split_family(result.coverage, common + benches.common)[0]
        drop = _valgrind_only(backend, settings, tests_by_side, run_one, result, deciding) if exact else None
        meas = measure(
            common + benches.common,
            run_one,
            # an exact count needs no warm-up, no repeats, no early stop: a few identical runs
            rounds=settings.exact_runs if exact else settings.runs,
            warmup=0 if exact else settings.warmup,
            seed=run_seed,
            early_stop=settings.early_stop and not exact,
            min_rounds=settings.early_stop_min_rounds,
            min_improvement=settings.min_improvement,
            progress=lambda d, t: phase("measure", d, t),
            metric=settings.metric,
            multithread_ratio=settings.multithread_ratio,
            floor=0.0 if exact else settings.sample_floor,
            max_repeats=settings.max_repeats,
            turn=turns.turn,
            pinned=dict.fromkeys(benches.common, 1),
            drop=drop,
        )
        result.measurement = meas
        try:
            if meas.failure is not None:  # re-runs that say whose fault it is: on a leased core too
                return _reject_failure(meas.failure, run_one, settings, result, reject, phase, turns)
            _decide(meas, run_one, settings, run_seed, result, phase, turns)
            _split_benchmarks(result)
        finally:
            result.environment = msgspec.structs.replace(result.environment, **turns.facts())
        result.environment.load_average_end = _loadavg()
    return result


def _runner(
    backend: Backend,
    settings: BuilderSettings,
    tests: dict[SideName, dict[str, TestCase]],
    benches: Discovered,
    turns: Turns,
    *,
    count: bool,
    exact: bool,
) -> Callable[[SideName, str], RunResult]:
    """One timed run of a workload on a side: a test as CTest judges it, a benchmark as the
    sample its own JSON gives (timed, never under Valgrind)."""
    workloads = {side: {**tests[side], **benches.by_side[side]} for side in SIDES}

    def run_one(side: SideName, name: str) -> RunResult:
        t = workloads[side][name]
        if is_benchmark(name):
            return timed_run(backend, side, t, limits_for(t, settings, cpu=turns.cpu))
        return timed_run(
            backend, side, t, limits_for(t, settings, cpu=turns.cpu, instructions=count, counted=exact)
        )

    return run_one


def _valgrind_only(
    backend: Backend,
    settings: BuilderSettings,
    tests: dict[SideName, dict[str, TestCase]],
    run_one: Callable[[SideName, str], RunResult],
    result: InstanceResult,
    deciding: list[str],
) -> Drop:
    """Under the exact metric, `leftout.metric_limit` over old/new: a test that fails under
    Valgrind on both sides and passes natively on both is left out of the counted tests
    (`left_out`, a tried line) instead of rejecting the instance. The last of the `deciding`
    tests (those that run the change, coverage's family) keeps its failure: without one, the
    counts could only say `not-improved` about a change they never measured."""
    left = set(deciding)

    def native(side: SideName, name: str) -> RunResult:  # untimed, on the build cores
        test = tests[side][name]
        return timed_run(backend, side, test, limits_for(test, settings))

    def record(name: str, why: str) -> None:
        left.discard(name)
        result.tried.append(f"left {name} out of the counted tests: {why}")
        log.info("left_out", instance=result.instance_id, test=name, reason=why)

    return metric_limit(SIDES, run_one, native, keep=lambda name: left == {name}, left=record)


def _benchmarks(
    backend: Backend, settings: BuilderSettings, result: InstanceResult, phase: PhaseCallback
) -> Discovered:
    """The project's benchmarks to time beside the tests (what is not timed, and why, recorded)."""
    phase("benchmarks", 0, 1)
    benches = find_benchmarks(backend, SIDES, settings, unchanged=("old", "new"))
    result.benchmark_workloads = benches.records(bench_settings(settings))
    result.benchmarks_skipped = benches.skipped
    phase("benchmarks", 1, 1)
    return benches


def _split_benchmarks(result: InstanceResult) -> None:
    """The improved and regressed benchmarks apart from the tests (one family, two kinds)."""
    for kind in ("improved", "regressed"):
        names: list[str] = getattr(result, f"{kind}_tests")
        setattr(result, f"{kind}_tests", [n for n in names if not is_benchmark(n)])
        setattr(result, f"{kind}_benchmarks", [n for n in names if is_benchmark(n)])


def _before_timing(
    once: _Once,
    tests_by_side: dict[SideName, dict[str, TestCase]],
    common: list[str],
    settings: BuilderSettings,
    result: InstanceResult,
    phase: PhaseCallback,
) -> tuple[dict[SideName, dict[str, TestCase]], list[str]]:
    """Untimed work on the build cores: which tests run the change (`builder.coverage`, on the
    CTest tests, before they are split), then each test split into its cases."""
    if once.coverage is not None:
        result.coverage = msgspec.structs.replace(once.coverage, moved_controls={}, suspect=False)
    elif settings.coverage:
        new_tests = {n: tests_by_side["new"][n] for n in common}
        result.coverage = measure_coverage(
            once.backend, once.repo_path, once.sides, new_tests, settings, phase
        )
    if settings.split_cases:
        tests_by_side, common = _split_cases(once.backend, tests_by_side, common, phase, settings)
        result.compared_tests = common
    return tests_by_side, common


def _check_power(tests: int, settings: BuilderSettings, result: InstanceResult) -> None:
    """Rounds too few for any p to reach alpha over this many tests: a warning in the log and in
    the record (the proof still runs; its verdict can only be `not-improved`). An exact count
    decides on its own terms (no rank test), so it is never underpowered this way."""
    if exact_metric(settings):
        return
    why = power_problem(
        tests, settings.runs, rule=settings.effective_rule(), alpha=settings.alpha, warmup=settings.warmup
    )
    if why:
        log.warning("underpowered", instance=result.instance_id, reason=why)
        result.environment.power_warning = why


def _decide(
    meas: Measurement,
    run_one: Callable[[SideName, str], Any],
    settings: BuilderSettings,
    run_seed: int,
    result: InstanceResult,
    phase: PhaseCallback,
    turns: Turns,
) -> None:
    """Statistics on each test's deciding metric, confirmation runs, verdicts under every rule.
    With coverage the tests that run the change are one family (its own correction) and decide;
    the others are A/A controls, a family of their own: one that moves makes the record suspect."""

    def family(names: list[str]) -> list[StatsRecord]:
        if not names:
            return []
        decided = compare_all(
            {n: s for n, s in meas.decision_samples().items() if n in set(names)},
            alpha=settings.alpha,
            min_improvement=settings.min_improvement,
            resamples=settings.bootstrap_resamples,
            seed=run_seed,
            exact=[n for n in names if meas.metric_of(n) == "cachegrind"],
            tolerance=settings.exact_tolerance,
        )
        if settings.confirm:
            decided = _confirm(decided, meas, run_one, settings, run_seed, result, phase, turns)
        return decided

    deciding, controls = split_family(result.coverage, sorted(meas.samples))
    decided, checked = family(deciding), family(controls)
    rule = settings.effective_rule()
    if result.coverage is not None and checked:
        flag_controls(result.coverage, checked, rule=rule)
    cleared = [
        msgspec.structs.replace(t, **_CLEARED, paper_improved=False, paper_regressed=False) for t in checked
    ]
    result.tests = sorted([*decided, *cleared], key=lambda t: t.name)
    result.decision_rule = rule
    result.verdict = verdict(decided, rule=rule)
    result.verdict_paper = verdict(decided, rule=DecisionRule.PAPER)
    result.verdict_strict = verdict(decided, rule=DecisionRule.STRICT)
    result.improved_tests = [t.name for t in decided if rule.improved(t)]
    result.regressed_tests = [t.name for t in decided if rule.regressed(t)]


def _reject_failure(
    f: RunFailure,
    run_one: Callable[[SideName, str], RunResult],
    settings: BuilderSettings,
    result: InstanceResult,
    reject: Callable[[FailureCategory, str], InstanceResult],
    phase: PhaseCallback,
    turns: Turns,
) -> InstanceResult:
    """The rejection for a failed run: the re-runs that say whose fault it is (blame.py decides)."""
    result.failure_step = "test"
    result.failure_lines = first_error_lines(f.output_tail)
    result.valgrind_unhandled = f.valgrind_unhandled or ""
    category = limit_category(timed_out=f.timed_out, returncode=f.returncode)
    if category is None:
        other: SideName = "old" if f.side == "new" else "new"
        phase("recheck", 0, 2)
        with turns.turn():
            same = run_one(f.side, f.test)
            phase("recheck", 1, 2)
            there = run_one(other, f.test)
        phase("recheck", 2, 2)

        def said(r: RunResult) -> str:
            return "passed" if r.ok else ("timed out" if r.timed_out else f"failed (exit {r.returncode})")

        result.tried.append(f"ran {f.test} again on the {f.side} side: {said(same)}")
        result.tried.append(f"ran {f.test} on the {other} side: {said(there)}")
        category = blame(f.side, same_ok=same.ok, other_ok=there.ok)
    return reject(category, explain(category, f, settings.build_type))


def _split_cases(
    backend: Backend,
    tests_by_side: dict[SideName, dict[str, TestCase]],
    common: list[str],
    phase: PhaseCallback,
    settings: BuilderSettings,
) -> tuple[dict[SideName, dict[str, TestCase]], list[str]]:
    """Each common test split into its framework cases on both sides; the cases on both sides.
    Listing runs untimed, on the build cores."""
    build_cores = core_plan(settings).build if settings.pin_cpu else ()
    split_by_side: dict[SideName, dict[str, TestCase]] = {}
    for side in SIDES:

        def listing(tc: TestCase, side: SideName = side) -> RunResult:
            return backend.run_test(side, tc, Limits(timeout=60, cpus=build_cores))

        out: dict[str, TestCase] = {}
        for i, name in enumerate(common):
            phase(f"list cases {side}", i, len(common))
            for t in split_cases(tests_by_side[side][name], listing):
                out[t.name] = t
        split_by_side[side] = out
    return split_by_side, sorted(set(split_by_side["old"]) & set(split_by_side["new"]))


_CLEARED = {"improved": False, "regressed": False, "strict_improved": False, "strict_regressed": False}


def _confirm(
    decided: list[StatsRecord],
    main: Measurement,
    run_one: Callable[[SideName, str], Any],
    settings: BuilderSettings,
    seed: int,
    result: InstanceResult,
    phase: PhaseCallback,
    turns: Turns,
) -> list[StatsRecord]:
    """Re-run each flagged test alone with a fresh order; a change must hold there to count."""
    # an exact count is its own confirmation: its re-runs agreed within builder.exact_tolerance
    flagged = [
        t
        for t in decided
        if (t.improved or t.regressed or t.strict_improved or t.strict_regressed) and not t.exact
    ]
    if not flagged:
        return decided
    rounds = max(settings.early_stop_min_rounds, settings.runs // 2) + settings.warmup
    out: dict[str, StatsRecord] = {t.name: t for t in decided}
    for i, t in enumerate(flagged):
        phase("confirm", i, len(flagged))
        meas = measure(
            [t.name],
            run_one,
            rounds=rounds,
            warmup=settings.warmup,
            seed=seed + 7919 * (i + 1),
            early_stop=False,
            metric=main.metric_of(t.name),
            repeats={t.name: main.repeats.get(t.name, 1)},
            turn=turns.turn,
        )
        if meas.failure is not None:
            result.confirmations[t.name] = Confirmation(held=False, failure=meas.failure.output_tail[-500:])
            out[t.name] = msgspec.structs.replace(t, **_CLEARED)
            continue
        s = meas.samples[t.name]
        metric = main.metric_of(t.name)
        old, new = s.pair(metric)
        c = compare_test(t.name, old, new, resamples=settings.bootstrap_resamples, seed=seed + i)
        if t.improved or t.strict_improved:
            held = c.p_improve < settings.alpha and c.median_change >= settings.min_improvement
        else:
            held = c.p_regress < settings.alpha and c.median_change <= -settings.min_improvement
        result.confirmations[t.name] = Confirmation(
            held=held,
            metric=metric,
            old=old,
            new=new,
            old_wall_s=s.old,
            new_wall_s=s.new,
            median_change=c.median_change,
            p_improve=c.p_improve,
            p_regress=c.p_regress,
            ratio=c.ratio,
            ci=[c.ci_low, c.ci_high],
        )
        if not held:
            out[t.name] = msgspec.structs.replace(t, **_CLEARED)
    phase("confirm", len(flagged), len(flagged))
    return [out[t.name] for t in decided]
