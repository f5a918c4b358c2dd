"""Gold validation: can an instance grade agents? (SWE-bench runs every gold patch before publishing.)

The expert's patch goes through the evaluator as if an agent had sent it and must score `opt`; a
null patch — one comment line appended to the first C++ file the expert changed, so it applies,
builds and runs every test exactly like the original — must not. Both hold: the instance has an
oracle (`oracle` = the kind of workload the expert's patch is `opt` on: `ctest`, `benchmark` (the
project's own benchmarks, engine/benchmarks.py) or `both`; `none` when either check fails).
The result goes into the record (`cppperf.validation`, a `Validation`, and `cppperf.oracle`); the
evaluator's reports stay under `evaluator.runs_dir/validate/{gold,null}/<id>/`. Locally
(`cppperf validate` without a bus) `validate_stored` reads and writes OUT/instances/<id>.json; on a
bus the evaluator's `validate.requested` handler (handlers.py `on_validate`) writes the record in
the `instances` bucket. Both work on the typed record (`InstanceRecord`) and reports (`EvalReport`).
"""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path
from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from cppperf.services.evaluator.instances import from_record
from cppperf.services.evaluator.pipeline import EvalRequest, Phase, evaluate_report
from cppperf.shared.domain import (
    EvalReport,
    EvalVerdict,
    InstanceRecord,
    Oracle,
    Validation,
    ValidationRun,
    decode_record,
    record_text,
)
from cppperf.shared.engine.benchmarks import is_benchmark
from cppperf.shared.files import write_atomic
from cppperf.shared.mirror import ensure_local
from cppperf.shared.settings import Settings

RUN_ID = "validate"
NULL_COMMENT = "// cppperf validate: a comment-only (null) patch\n"
T = TypeVar("T")


def null_patch(base_text: str, path: str) -> str:
    """A patch appending one comment line to `path` (whose text at the base is `base_text`, ending
    in a newline)."""
    lines = difflib.unified_diff(
        base_text.splitlines(keepends=True),
        (base_text + NULL_COMMENT).splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def _file_at(repo: Path, sha: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(repo), "show", f"{sha}:{path}"], capture_output=True, check=False, timeout=60
    )
    return proc.stdout.decode("utf-8", "surrogateescape") if proc.returncode == 0 else None


def null_patch_for(record: InstanceRecord, settings: Settings) -> str:
    """The null patch for an instance: on the first file the expert changed that exists at the base
    (a C++ source or header: the files an agent may change); empty when there is none."""
    inst = from_record(record)
    repo = ensure_local(inst.url, inst.repo, settings.mirror_dir())
    exts = tuple(settings.mining.source_extensions)
    for f in record.commit_info.files_changed:
        if f.status == "added" or not f.filename.endswith(exts):
            continue
        text = _file_at(repo, inst.base_sha, f.filename)
        if text and text.endswith("\n"):
            return null_patch(text, f.filename)
    return ""


def oracle_of(gold: EvalReport, null: EvalReport | None) -> Oracle:
    """Which workload lets the instance grade agents: the gold patch is `opt`, the null patch (None:
    not run) not; then `ctest`, `benchmark` or `both` by the kinds of workload the gold patch
    significantly improved (a report without per-workload scores: `ctest`, the only kind before
    benchmarks)."""
    if gold.verdict != EvalVerdict.OPT or (null is not None and null.opt):
        return Oracle.NONE
    per = {} if gold.per_test is UNSET else gold.per_test
    improved = [n for n, score in per.items() if score.agent_improved]
    if not improved:
        return Oracle.CTEST
    benches = [n for n in improved if is_benchmark(n)]
    return Oracle.of(ctest=len(benches) < len(improved), benchmark=bool(benches))


def _set(value: T | UnsetType, default: T) -> T:
    return default if isinstance(value, UnsetType) else value


def brief(report: EvalReport | None) -> ValidationRun:
    """An evaluation's report as the record keeps it (empty for one that did not run)."""
    if report is None:
        return ValidationRun()
    return ValidationRun(
        verdict=report.verdict,
        opt=report.opt,
        reason=report.reason,
        gm_speedup_agent=_set(report.gm_speedup_agent, None),
        timed_tests=_set(report.timed_tests, []),
        timed_benchmarks=_set(report.timed_benchmarks, []),
        wall_seconds=_set(report.wall_seconds, None),
        metric=_set(report.metric, ""),
    )


def stored_validation(record: InstanceRecord) -> Validation | None:
    """The record's validation, when it has one."""
    block = record.cppperf.validation
    return block if isinstance(block, Validation) else None


def with_validation(record: InstanceRecord, block: Validation) -> InstanceRecord:
    """`record` with `block` as its `cppperf.validation` and `cppperf.oracle`."""
    ours = msgspec.structs.replace(record.cppperf, validation=block, oracle=str(block.oracle))
    return msgspec.structs.replace(record, cppperf=ours)


def gold_validation(
    record: InstanceRecord, settings: Settings, *, force: bool = False, on_phase: Phase | None = None
) -> Validation:
    """Gold-validate one instance record: the expert's patch, then (when it scored opt) the null
    patch, through the evaluator."""
    inst = from_record(record)

    def run(model: str, patch: str) -> EvalReport:
        req = EvalRequest(run_id=RUN_ID, model=model, instance_id=inst.instance_id, patch=patch)
        return evaluate_report(req, settings, force=force, on_phase=on_phase, instance=inst, validating=True)

    gold = run("gold", inst.expert_patch)
    null = run("null", null_patch_for(record, settings)) if gold.verdict == EvalVerdict.OPT else None
    oracle = oracle_of(gold, null)
    why = ""
    if gold.verdict != EvalVerdict.OPT:
        why = f"the expert's patch scores {gold.verdict}: {gold.reason}"[:500]
    elif null is not None and null.opt:
        why = "a comment-only patch scores opt: the measurement cannot tell a change from none"
    return Validation(
        gold=brief(gold), null=brief(null), oracle=oracle, can_grade=oracle != Oracle.NONE, why=why
    )


def validate_record(
    record: InstanceRecord, settings: Settings, *, force: bool = False, on_phase: Phase | None = None
) -> InstanceRecord:
    """The record gold-validated: with its `cppperf.validation` and `cppperf.oracle`."""
    return with_validation(record, gold_validation(record, settings, force=force, on_phase=on_phase))


def validate_stored(
    instance_id: str, settings: Settings, *, force: bool = False, on_phase: Phase | None = None
) -> Validation:
    """Validate OUT/instances/<id>.json and write the record back with its `oracle`."""
    from cppperf.services.evaluator.instances import load_instance

    load_instance(instance_id, Path(settings.out_dir))  # a clear error for an unknown or bad id
    path = Path(settings.out_dir) / "instances" / f"{instance_id}.json"
    record = decode_record(path.read_text())
    block = gold_validation(record, settings, force=force, on_phase=on_phase)
    write_atomic(path, record_text(with_validation(record, block)))
    return block
