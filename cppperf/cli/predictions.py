"""`evaluate --predictions gold|empty`: SWE-bench's harness check, one prediction per instance of
OUT/instances that is proven (a rejected or not-improved record is no instance to grade; named
with --instance-ids it is kept) -- the expert's own patch (`gold`, which should come out `opt` or `correct`) or an
empty one (`empty`, which should come out `empty-patch`)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

PSEUDO: Final = ("gold", "empty")


def pseudo_predictions(out_dir: Path, kind: str, ids: set[str] | None) -> list[dict[str, str]]:
    """Rows for every proven instance of `out_dir` (only `ids` when given, proven or not; an id
    without a record is kept, and reported as an unknown instance)."""
    from cppperf.dataset.records import RecordError, git_patch, is_significant, iter_records, load_record

    if ids is not None:
        wanted = sorted(ids)
    else:
        wanted = sorted(r.cppperf.instance_id for r in iter_records(out_dir) if is_significant(r))
    rows = []
    for iid in wanted:
        patch = ""
        if kind == "gold":
            try:
                patch = git_patch(load_record(out_dir, iid))
            except RecordError:
                patch = ""
        rows.append({"instance_id": iid, "model_name_or_path": kind, "model_patch": patch})
    return rows
