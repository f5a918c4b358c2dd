"""The run-level report of one model in one evaluation run, shaped like SWE-bench's
`<model>.<run_id>.json`: counts and id lists (submitted, completed, resolved, unresolved, error,
empty patch, incomplete), plus ours: `opt` (overall, single- and multi-file) and the speed-ups.

    OUT/runs/<run_id>/<model>.<run_id>.json    (schema: `cppperf schema run-report`)

How our verdicts map: **resolved** = `opt` (correct and as fast as the expert within
`evaluator.opt_fraction`); **error** = the harness could not judge the patch (`instance-broken`,
`untrusted-refused`, `unknown-instance`); **empty patch** = `empty-patch`; every other verdict is
**unresolved** (`correct` among them: right but not fast enough). **completed** = resolved +
unresolved; **incomplete** = submitted without a report (not evaluated yet). An instance id of
the predictions that is not in OUT/instances counts as submitted and error (unknown-instance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TypeVar

import msgspec
from msgspec import UnsetType

from cppperf.shared.domain import EvalReport, EvalVerdict
from cppperf.shared.files import write_atomic
from cppperf.shared.settings import Settings

T = TypeVar("T")
SCHEMA_VERSION: Final = 1
ERROR_VERDICTS: Final = frozenset(
    {EvalVerdict.INSTANCE_BROKEN, EvalVerdict.UNTRUSTED_REFUSED, EvalVerdict.UNKNOWN_INSTANCE}
)


class OptBlock(msgspec.Struct, kw_only=True):
    instances: int
    opt: int
    rate: float


class SpeedUps(msgspec.Struct, kw_only=True):
    """Geometric means over the instances whose agent patch passed the tests (opt or correct)."""

    instances: int
    gm_speedup_agent: float | None
    gm_speedup_expert: float | None


class InstanceResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    verdict: str
    opt: bool = False
    multi_file: bool | None = None
    speedup_agent: float | None = None
    speedup_expert: float | None = None
    reason: str = ""


class RunReport(msgspec.Struct, kw_only=True):
    """`OUT/runs/<run_id>/<model>.<run_id>.json`."""

    schema_version: int
    run_id: str
    model: str
    total_instances: int  # in OUT/instances
    submitted_instances: int
    completed_instances: int
    resolved_instances: int
    unresolved_instances: int
    empty_patch_instances: int
    error_instances: int
    submitted_ids: list[str]
    completed_ids: list[str]
    incomplete_ids: list[str]
    resolved_ids: list[str]
    unresolved_ids: list[str]
    empty_patch_ids: list[str]
    error_ids: list[str]
    opt: OptBlock
    opt_single_file: OptBlock
    opt_multi_file: OptBlock
    speedups: SpeedUps
    verdicts: dict[str, int]
    instances: dict[str, InstanceResult]


def report_path(settings: Settings, run_id: str, model: str) -> Path:
    from cppperf.services.evaluator.pipeline import model_folder, safe_name

    return settings.runs_path() / safe_name(run_id) / f"{model_folder(model)}.{safe_name(run_id)}.json"


def _gm(values: list[float]) -> float | None:
    vals = [v for v in values if v > 0]
    return round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 4) if vals else None


def _opt(rs: list[EvalReport]) -> OptBlock:
    n, k = len(rs), sum(r.opt for r in rs)
    return OptBlock(instances=n, opt=k, rate=round(k / n, 4) if n else 0.0)


def _given(value: T | UnsetType) -> T | None:
    """A report field, None when the report has none (`UNSET`)."""
    return None if isinstance(value, UnsetType) else value


def _result(r: EvalReport) -> InstanceResult:
    return InstanceResult(
        verdict=str(r.verdict),
        opt=r.opt,
        multi_file=_given(r.multi_file),
        speedup_agent=_given(r.gm_speedup_agent),
        speedup_expert=_given(r.gm_speedup_expert),
        reason=r.reason[:300],
    )


def build_run_report(
    settings: Settings, run_id: str, model: str, *, submitted: Sequence[str], unknown: Sequence[str] = ()
) -> RunReport:
    """The report over `submitted` instance ids (`unknown`: those not in OUT/instances), read
    from the per-instance reports on disk; written to `report_path` and returned."""
    from cppperf.services.evaluator.pipeline import read_report, run_dir_of

    reports: dict[str, EvalReport] = {}
    for iid in submitted:
        found = read_report(run_dir_of(settings, run_id, model, iid) / "report.json")
        if found is not None:
            reports[iid] = found
    for iid in unknown:
        reports.setdefault(
            iid, EvalReport(verdict=EvalVerdict.UNKNOWN_INSTANCE, reason="not in OUT/instances")
        )
    ids = sorted(set(submitted) | set(unknown))
    got = [i for i in ids if i in reports]
    verdict = {i: str(reports[i].verdict) for i in got}
    error = [i for i in got if verdict[i] in ERROR_VERDICTS]
    empty = [i for i in got if verdict[i] == EvalVerdict.EMPTY_PATCH]
    resolved = [i for i in got if reports[i].opt]
    unresolved = [i for i in got if i not in set(error) | set(empty) | set(resolved)]
    judged = [reports[i] for i in got if i not in set(error) | set(empty)]
    passing = [r for r in judged if r.verdict in (EvalVerdict.OPT, EvalVerdict.CORRECT)]
    counts: dict[str, int] = {}
    for v in verdict.values():
        counts[v] = counts.get(v, 0) + 1
    inst_dir = Path(settings.out_dir) / "instances"
    report = RunReport(
        schema_version=SCHEMA_VERSION,
        run_id=run_id,
        model=model,
        total_instances=len(list(inst_dir.glob("*.json"))) if inst_dir.is_dir() else 0,
        submitted_instances=len(ids),
        completed_instances=len(resolved) + len(unresolved),
        resolved_instances=len(resolved),
        unresolved_instances=len(unresolved),
        empty_patch_instances=len(empty),
        error_instances=len(error),
        submitted_ids=ids,
        completed_ids=sorted(resolved + unresolved),
        incomplete_ids=[i for i in ids if i not in reports],
        resolved_ids=resolved,
        unresolved_ids=unresolved,
        empty_patch_ids=empty,
        error_ids=error,
        opt=_opt(judged),
        opt_single_file=_opt([r for r in judged if r.multi_file is not True]),
        opt_multi_file=_opt([r for r in judged if r.multi_file is True]),
        speedups=SpeedUps(
            instances=len(passing),
            gm_speedup_agent=_gm([r.gm_speedup_agent for r in passing if r.gm_speedup_agent]),
            gm_speedup_expert=_gm([r.gm_speedup_expert for r in passing if r.gm_speedup_expert]),
        ),
        verdicts=counts,
        instances={i: _result(reports[i]) for i in got},
    )
    write_atomic(report_path(settings, run_id, model), msgspec.json.encode(report).decode() + "\n")
    return report


def describe(report: RunReport) -> str:
    """One human line: what a reader of a SWE-bench summary looks for first."""
    sp = report.speedups
    speed = (
        f", speed-up {sp.gm_speedup_agent:.2f}× (expert {sp.gm_speedup_expert or 0:.2f}×)"
        if sp.gm_speedup_agent
        else ""
    )
    return (
        f"{report.model}: {report.submitted_instances} submitted, {report.completed_instances} completed, "
        f"{report.resolved_instances} resolved (opt), {report.unresolved_instances} unresolved, "
        f"{report.empty_patch_instances} empty patch, {report.error_instances} error"
        f"{speed}; opt single-file {report.opt_single_file.opt}/{report.opt_single_file.instances}, "
        f"multi-file {report.opt_multi_file.opt}/{report.opt_multi_file.instances}"
    )
