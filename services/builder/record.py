"""The instance record: the published CppPerf-DB JSON shape plus our own `cppperf` section.

Published keys (`metadata`, `commit_info`, `issues`, `pull_requests`, `build_info`,
`performance_analysis`, `tests`, `logs`, `raw_timing_data`) are filled the way the published files
fill them, so tools that read CppPerf-DB read ours. `cppperf` adds: instance id, verdict (ours and
the paper's rule), per-test statistics with CIs, raw samples both sides (wall and CPU), seed,
environment (cppperf/compiler/CMake versions, leased core, load average), the metric that decided
each test (`decided_on`), repeats per sample, early-stop savings, confirmation runs, failure
category, and the instance verdict under all three rules (`decision_rule` says which one is
`verdict`); with `builder.coverage`, `coverage` (domain.Coverage): which tests run the change, the
deciding family, the controls and whether one moved (`suspect`); the project's benchmarks
(`bench_record.py`: `proven_by`, per-benchmark `benchmarks`, workloads and skips). The published
`tests` keys and `cppperf.tests` hold the CTest tests only; `performance_analysis.test_name` is
the improved workload (a test or a benchmark) with the largest median change.
"""

from __future__ import annotations

import shlex
import statistics
from datetime import UTC, datetime
from pathlib import Path

from msgspec import UNSET

from cppperf.services.builder.bench_record import proven_by
from cppperf.services.builder.instance import InstanceResult
from cppperf.shared.domain import InstanceMeta, InstanceRecord, SideSamples, StatsRecord, Verdict
from cppperf.shared.engine.benchmarks import is_benchmark
from cppperf.shared.engine.cmake import BuildSpec, configure_argv
from cppperf.shared.engine.protocol import Samples
from cppperf.shared.messages import CommitSelected
from cppperf.shared.published import (
    BuildInfo,
    ChangedFile,
    CommitInfo,
    LinkedText,
    Logs,
    Metadata,
    PerformanceAnalysis,
    RawTimingData,
    TestResult,
    TestsSummary,
)
from cppperf.shared.settings import BuilderSettings

RECORD_VERSION = 1


def _ci95(xs: list[float]) -> list[float]:
    if len(xs) < 2:
        return [xs[0], xs[0]] if xs else [0.0, 0.0]
    m = statistics.fmean(xs)
    half = 1.96 * statistics.stdev(xs) / len(xs) ** 0.5
    return [m - half, m + half]


def _ms(xs: list[float]) -> list[float]:
    return [x * 1000.0 for x in xs]


def _commands(res: InstanceResult, side: str, settings: BuilderSettings) -> list[str]:
    """The configure and build commands as they ran on `side`, every option included."""
    cmds = [shlex.join(s.command) for s in res.build_steps if s.side == side and s.command]
    if cmds:
        return cmds
    build_type = res.environment.build_type or settings.effective_build_type()
    spec = BuildSpec(build_type=build_type)  # nothing ran: what would have
    return [shlex.join(configure_argv(Path("src"), Path("build"), spec, options=[])), "cmake --build build"]


def _test_result(t: StatsRecord, s: Samples | None, metric: str | None) -> TestResult:
    old_ms, new_ms = (_ms(s.old), _ms(s.new)) if s else ([], [])
    return TestResult(
        test_name=t.name,
        is_significant=t.improved,
        p_value=t.p_improve_adj,
        is_mannwhitney_significant=t.paper_improved,
        mannwhitney_p_value=t.p_improve,
        relative_improvement=t.mean_change,
        relative_improvement_median=t.median_change,
        decided_on=metric,
        exact=t.exact,
        absolute_improvement_ms=(t.mean_old - t.mean_new) * 1000.0,
        old_mean_ms=t.mean_old * 1000.0,
        new_mean_ms=t.mean_new * 1000.0,
        old_std_ms=statistics.stdev(old_ms) if len(old_ms) > 1 else 0.0,
        new_std_ms=statistics.stdev(new_ms) if len(new_ms) > 1 else 0.0,
        old_ci95_ms=_ci95(old_ms),
        new_ci95_ms=_ci95(new_ms),
        old_times=old_ms,
        new_times=new_ms,
    )


def _linked(commit: CommitSelected, kind: str) -> list[LinkedText]:
    return [
        LinkedText(number=lt.number, title=lt.title, body=lt.body, url=lt.url)
        for lt in commit.linked
        if lt.kind == kind
    ]


def build_record(
    commit: CommitSelected, res: InstanceResult, *, diff: str, settings: BuilderSettings
) -> InstanceRecord:
    meas = res.measurement
    tests = [t for t in res.tests if not is_benchmark(t.name)]  # the CTest tests (published keys)
    old_total: list[float] = []
    new_total: list[float] = []
    if meas is not None and meas.failure is None:
        timed = [s for n, s in meas.samples.items() if not is_benchmark(n)]
        full = [s for s in timed if len(s.old) == len(timed[0].old)] if timed else []
        if full:
            old_total = [sum(v) for v in zip(*(s.old for s in full), strict=False)]
            new_total = [sum(v) for v in zip(*(s.new for s in full), strict=False)]
    per_test = [
        _test_result(t, meas.samples[t.name] if meas else None, meas.metric_of(t.name) if meas else None)
        for t in tests
    ]
    improved = [t.name for t in tests if t.improved]
    regressed = [t.name for t in tests if t.regressed]
    paper_imp = [t.name for t in tests if t.paper_improved]
    paper_reg = [t.name for t in tests if t.paper_regressed]
    old_mean = statistics.fmean(old_total) if old_total else 0.0
    new_mean = statistics.fmean(new_total) if new_total else 0.0
    files = [
        ChangedFile(
            filename=f.path,
            status={"A": "added", "D": "removed"}.get(f.status, "modified"),
            additions=f.added,
            deletions=f.deleted,
            changes=f.added + f.deleted,
        )
        for f in commit.files
    ]
    if not res.tests and res.verdict == "unchanged-binaries":  # the tests whose binaries matched
        per_test = [
            TestResult(test_name=n, is_significant=False, unchanged_binary=True) for n in res.compared_tests
        ]
    rule = res.decision_rule
    best = max((t for t in res.tests if rule.improved(t)), key=lambda t: t.median_change, default=None)
    test_script = ["cd build && ctest --show-only=json-v1", "<each test run directly>"]
    return InstanceRecord(
        metadata=Metadata(
            collection_date=datetime.now(UTC).isoformat(),
            repository=commit.url,
            repository_name=commit.repo,
        ),
        commit_info=CommitInfo(
            old_sha=commit.parent,
            new_sha=commit.sha,
            commit_message=[commit.message],
            commit_date=commit.date,
            patch=[diff],
            files_changed=files,
            lines_added=sum(f.added for f in commit.files),
            lines_removed=sum(f.deleted for f in commit.files),
        ),
        issues=_linked(commit, "issue"),
        pull_requests=_linked(commit, "pull"),
        build_info=BuildInfo(
            old_build_script=_commands(res, "old", settings),
            new_build_script=_commands(res, "new", settings),
            old_test_script=list(test_script),
            new_test_script=list(test_script),
            build_system="cmake",
        ),
        performance_analysis=PerformanceAnalysis(
            is_significant=res.verdict == Verdict.IMPROVED,
            # the improved test with the largest median change under the deciding rule (or None)
            test_name=best.name if best else None,
            test_relative_improvement=best.mean_change if best else None,
            test_relative_improvement_median=best.median_change if best else None,
            relative_improvement=(old_mean - new_mean) / old_mean if old_mean else 0.0,
            relative_improvement_median=(
                (statistics.median(old_total) - statistics.median(new_total)) / statistics.median(old_total)
                if old_total and new_total
                else 0.0
            ),
            absolute_improvement_ms=(old_mean - new_mean) * 1000.0,
            old_mean_ms=old_mean * 1000.0,
            new_mean_ms=new_mean * 1000.0,
            old_ci95_ms=_ci95(_ms(old_total)),
            new_ci95_ms=_ci95(_ms(new_total)),
            old_times_s=old_total,
            new_times_s=new_total,
        ),
        tests=TestsSummary(
            total_tests=len(tests) or len(res.compared_tests),
            significant_improvements=len(improved),
            significant_improvements_tests=improved,
            significant_regressions=len(regressed),
            significant_regressions_tests=regressed,
            significant_mannwhitney_improvements=len(paper_imp),
            significant_mannwhitney_improvements_tests=paper_imp,
            significant_mannwhitney_regressions=len(paper_reg),
            significant_mannwhitney_regressions_tests=paper_reg,
            tests=per_test,
        ),
        logs=Logs(
            build_success=not any(not s.ok for s in res.build_steps),
            test_success=not (res.failure_category or "").startswith(("test-", "timeout")),
            build_logs=[s.log for s in res.build_steps if s.log],
        ),
        raw_timing_data=RawTimingData(
            warmup_runs=meas.warmup if meas else 0,
            measurement_runs=(meas.rounds - meas.warmup) if meas else 0,
            min_exec_time_improvement=settings.min_improvement,
            min_p_value=settings.alpha,
        ),
        cppperf=_meta(commit, res, settings),
    )


def _meta(commit: CommitSelected, res: InstanceResult, settings: BuilderSettings) -> InstanceMeta:
    """The record's `cppperf` section."""
    meas = res.measurement
    return InstanceMeta(
        record_version=RECORD_VERSION,
        instance_id=res.instance_id,
        verdict=res.verdict,
        decision_rule=res.decision_rule,
        verdict_paper_rule=res.verdict_paper,
        verdict_strict_rule=res.verdict_strict,
        profile=settings.profile,
        metric=res.metric or settings.metric,  # cpu when Valgrind could not run the project
        decided_on=dict(meas.decided_on) if meas else {},
        repeats=dict(meas.repeats) if meas else {},
        sample_floor_s=settings.sample_floor,
        compared_tests=res.compared_tests,
        failure_category=res.failure_category,
        failure_detail=res.failure_detail,
        failure_step=res.failure_step,
        failure_lines=res.failure_lines,
        tried=res.tried,
        attempts=res.attempts,
        builder=settings.backend,
        environment=res.environment,
        seed=meas.seed if meas else None,
        rounds=meas.rounds if meas else 0,
        rounds_run=dict(meas.rounds_run) if meas else {},
        rounds_saved_by_early_stop=meas.rounds_saved if meas and meas.failure is None else 0,
        settled_early=dict(meas.settled) if meas else {},
        left_out=dict(meas.left_out) if meas else {},
        added_tests=res.added_tests,
        removed_tests=res.removed_tests,
        missing_packages=res.missing_packages,
        llm_proposed_packages=res.llm_proposed_packages,
        build_steps=res.build_steps,
        tests=[t for t in res.tests if not is_benchmark(t.name)],  # the CTest tests
        confirmations=res.confirmations,
        samples={
            n: SideSamples(
                old_s=s.old,
                new_s=s.new,
                old_cpu_s=s.old_cpu,
                new_cpu_s=s.new_cpu,
                old_instructions=s.instructions.get("old", []),
                new_instructions=s.instructions.get("new", []),
                old_ir=s.ir.get("old", []),
                new_ir=s.ir.get("new", []),
                old_est_cycles=s.est_cycles.get("old", []),
                new_est_cycles=s.est_cycles.get("new", []),
            )
            for n, s in (meas.samples.items() if meas else [])
        },
        linked_texts_fetched=commit.links_fetched,
        coverage=res.coverage if res.coverage is not None else UNSET,  # only with builder.coverage
        # the project's benchmarks as workloads (bench_record.py)
        proven_by=proven_by(res),
        benchmarks=[t for t in res.tests if is_benchmark(t.name)],
        benchmark_workloads=list(res.benchmark_workloads),
        benchmarks_skipped=list(res.benchmarks_skipped),
        improved_benchmarks=list(res.improved_benchmarks),
        regressed_benchmarks=list(res.regressed_benchmarks),
    )
