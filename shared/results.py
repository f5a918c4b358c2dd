"""Finished results are recorded before they are announced, and announced from the record.

The `instances` KV entry is the truth for a built instance; `patch.built` is derived from it
(`finished_message`) and published with the instance id as `Nats-Msg-Id`, so re-publishing is
harmless (dedup). Any later request for a finished instance — a redelivery, `dlq replay`, a
producer using another message id, a replica that waited for the claim — re-publishes the
recorded result instead of building again, so record, KV entry and `patch.built` agree.
"""

from __future__ import annotations

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
        failure_category=rec.get("failure_category"),
        failure_detail=str(rec.get("failure_detail") or ""),
    )


async def republish_finished(ctx: StageContext, iid: str) -> bool:
    """If the instance has a recorded verdict: (re)publish `patch.built` from it, mark the
    commit built, and return True."""
    rec = await ctx.store.get(INSTANCES.name, iid)
    if rec is None or not rec.get("verdict"):
        return False
    msg = finished_message(iid, rec)
    await ctx.bus.publish(m.PATCH_BUILT, msg)
    await ctx.store.update(COMMITS.name, m.commit_id(msg.repo, msg.sha), stage="built", verdict=msg.verdict)
    return True
