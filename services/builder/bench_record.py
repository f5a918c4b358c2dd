"""The instance record's benchmark keys (`cppperf` section; types in shared/domain.py):
`proven_by` (which kind of workload proved the instance: ctest | benchmark | both | none; None
when nothing was measured), `benchmarks` (per-benchmark statistics, beside the tests' `tests`),
`benchmark_workloads` (what was timed and how), `benchmarks_skipped` (found, not timed, why),
`improved_benchmarks`, `regressed_benchmarks`. A benchmark's raw samples are under `samples`
with the tests', by its workload name (`bench:<target>/<benchmark>`): per-iteration seconds.
`proven_by` is decided here; record.py `_meta` fills the other keys from the `InstanceResult`."""

from __future__ import annotations

from cppperf.services.builder.instance import InstanceResult
from cppperf.shared.domain import Oracle, Verdict


def proven_by(res: InstanceResult) -> Oracle | None:
    """Which kind of workload shows the improvement; `none` when measured and not improved."""
    if res.measurement is None or res.verdict in (Verdict.REJECTED, Verdict.UNCHANGED_BINARIES):
        return None
    if res.verdict != Verdict.IMPROVED:
        return Oracle.NONE
    return Oracle.of(ctest=bool(res.improved_tests), benchmark=bool(res.improved_benchmarks))
