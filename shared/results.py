"""Finished results are recorded before they are announced, and announced from the record.

The `instances` KV entry is the truth for a built instance; `patch.built` is derived from it
(`finished_message`) and published with the instance id and the record's content hash as
`Nats-Msg-Id` (`built_msg_id`), so re-publishing the same result is harmless (dedup) while a
forced rebuild (`mine --force`: a new record) is announced again. Any later request for a finished instance — a redelivery, `dlq replay`, a
producer using another message id, a replica that waited for the claim — re-publishes the
recorded result instead of building again, so record, KV entry and `patch.built` agree.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cppperf.shared import messages as m
from cppperf.shared.buckets import COMMITS, INSTANCES
from cppperf.shared.ports import StageContext


def finished_message(iid: str, rec: dict[str, Any]) -> m.PatchBuilt:
    """`record_path` stays empty (deprecated): the record is read from `instances` by id, the
    same on first publish and on re-publish."""
    return m.PatchBuilt(
        instance_id=iid,
        repo=str(rec.get("repo", "")),
        sha=str(rec.get("sha", "")),
        parent=str(rec.get("parent", "")),
        verdict=str(rec["verdict"]),
        improved_tests=list(rec.get("improved_tests") or []),
        regressed_tests=list(rec.get("regressed_tests") or []),
        improved_benchmarks=list(rec.get("improved_benchmarks") or []),
        regressed_benchmarks=list(rec.get("regressed_benchmarks") or []),
        failure_category=rec.get("failure_category"),
        failure_detail=str(rec.get("failure_detail") or ""),
    )


def built_msg_id(iid: str, record_text: str) -> str:
    """`patch.built`'s `Nats-Msg-Id`: the instance id and a hash of the record's JSON as stored."""
    return f"{iid}@{hashlib.sha256(record_text.encode()).hexdigest()[:16]}"


async def republish_finished(ctx: StageContext, iid: str) -> bool:
    """If the instance has a recorded verdict: (re)publish `patch.built` from it, mark the
    commit built, and return True."""
    rec = await ctx.store.get(INSTANCES.name, iid)
    if rec is None or not rec.get("verdict"):
        return False
    msg = finished_message(iid, rec)
    text = await ctx.store.resolve_text(str(rec.get("record") or ""), rec.get("record_ref"))
    await ctx.bus.publish(m.PATCH_BUILT, msg, msg_id=built_msg_id(iid, text))
    await ctx.store.update(COMMITS.name, m.commit_id(msg.repo, msg.sha), stage="built", verdict=msg.verdict)
    return True
