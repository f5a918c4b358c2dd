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
the `instances` bucket.
"""

from __future__ import annotations

import difflib
import json
import subprocess
from pathlib import Path
from typing import Any

import msgspec

from cppperf.services.evaluator.instances import from_record
from cppperf.services.evaluator.pipeline import EvalRequest, Phase, evaluate
from cppperf.shared.domain import EvalVerdict, Oracle, Validation, ValidationRun, to_json_dict, to_struct
from cppperf.shared.engine.benchmarks import is_benchmark
from cppperf.shared.files import write_atomic
from cppperf.shared.mirror import ensure_local
from cppperf.shared.settings import Settings

RUN_ID = "validate"
NULL_COMMENT = "// cppperf validate: a comment-only (null) patch\n"


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


def null_patch_for(record: dict[str, Any], settings: Settings) -> str:
    """The null patch for an instance: on the first file the expert changed that exists at the base
    (a C++ source or header: the files an agent may change); empty when there is none."""
    inst = from_record(record)
    repo = ensure_local(inst.url, inst.repo, settings.mirror_dir())
    exts = tuple(settings.mining.source_extensions)
    for f in record["commit_info"].get("files_changed") or []:
        name = str(f.get("filename", ""))
        if f.get("status") == "added" or not name.endswith(exts):
            continue
        text = _file_at(repo, inst.base_sha, name)
        if text and text.endswith("\n"):
            return null_patch(text, name)
    return ""


def oracle_of(gold: dict[str, Any], null: dict[str, Any]) -> Oracle:
    """Which workload lets the instance grade agents: the gold patch is `opt`, the null patch not;
    then `ctest`, `benchmark` or `both` by the kinds of workload the gold patch significantly
    improved (a report without per-workload scores: `ctest`, the only kind before benchmarks)."""
    if gold.get("verdict") != EvalVerdict.OPT or null.get("opt"):
        return Oracle.NONE
    per = gold.get("per_test") or {}
    improved = [n for n, v in per.items() if isinstance(v, dict) and v.get("agent_improved")]
    if not improved:
        return Oracle.CTEST
    benches = [n for n in improved if is_benchmark(n)]
    return Oracle.of(ctest=len(benches) < len(improved), benchmark=bool(benches))


def brief(report: dict[str, Any]) -> ValidationRun:
    """An evaluation's report as the record keeps it (empty for one that did not run)."""
    keys = ("verdict", "opt", "reason", "gm_speedup_agent", "timed_tests", "timed_benchmarks", "wall_seconds")
    return to_struct({k: report[k] for k in (*keys, "metric") if report.get(k) is not None}, ValidationRun)


def stored_validation(record: dict[str, Any]) -> Validation | None:
    """The record's validation, when it has one (and it reads as a `Validation`)."""
    raw = (record.get("cppperf") or {}).get("validation")
    if not isinstance(raw, dict):
        return None
    try:
        return to_struct(raw, Validation)
    except msgspec.ValidationError:
        return None


def validate_record(
    record: dict[str, Any], settings: Settings, *, force: bool = False, on_phase: Phase | None = None
) -> Validation:
    """Gold-validate one instance record; the validation (also written into `record`)."""
    inst = from_record(record)

    def run(model: str, patch: str) -> dict[str, Any]:
        req = EvalRequest(run_id=RUN_ID, model=model, instance_id=inst.instance_id, patch=patch)
        return evaluate(req, settings, force=force, on_phase=on_phase, instance=inst, validating=True)

    gold = run("gold", inst.expert_patch)
    null = run("null", null_patch_for(record, settings)) if gold.get("verdict") == EvalVerdict.OPT else {}
    oracle = oracle_of(gold, null)
    why = ""
    if gold.get("verdict") != EvalVerdict.OPT:
        why = f"the expert's patch scores {gold.get('verdict')}: {gold.get('reason', '')}"[:500]
    elif null.get("opt"):
        why = "a comment-only patch scores opt: the measurement cannot tell a change from none"
    block = Validation(
        gold=brief(gold), null=brief(null), oracle=oracle, can_grade=oracle != Oracle.NONE, why=why
    )
    ours = record.setdefault("cppperf", {})
    ours["validation"] = to_json_dict(block)
    ours["oracle"] = str(oracle)
    return block


def validate_stored(
    instance_id: str, settings: Settings, *, force: bool = False, on_phase: Phase | None = None
) -> Validation:
    """Validate OUT/instances/<id>.json and write the record back with its `oracle`."""
    from cppperf.services.evaluator.instances import load_instance

    load_instance(instance_id, Path(settings.out_dir))  # a clear error for an unknown or bad id
    path = Path(settings.out_dir) / "instances" / f"{instance_id}.json"
    record: dict[str, Any] = json.loads(path.read_text())
    block = validate_record(record, settings, force=force, on_phase=on_phase)
    write_atomic(path, json.dumps(record, indent=1))
    return block
