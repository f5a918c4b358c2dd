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

from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.buckets import COMMITS, INSTANCES
from cppperf.shared.domain import InstanceState
from cppperf.shared.ports import StageContext


def finished_message(iid: str, state: InstanceState) -> m.PatchBuilt:
    """`patch.built` from the `instances` entry of a built instance (`state.verdict` set).
    `record_path` stays empty (deprecated): the record is read from `instances` by id, the same on
    first publish and on re-publish."""
    return m.PatchBuilt(
        instance_id=iid,
        repo=state.repo,
        sha=state.sha,
        parent=state.parent,
        verdict=str(state.verdict or ""),
        improved_tests=list(state.improved_tests),
        regressed_tests=list(state.regressed_tests),
        improved_benchmarks=list(state.improved_benchmarks),
        regressed_benchmarks=list(state.regressed_benchmarks),
        failure_category=state.failure_category,
    )


def built_msg_id(iid: str, record_text: str) -> str:
    """`patch.built`'s `Nats-Msg-Id`: the instance id and a hash of the record's JSON as stored."""
    return f"{iid}@{hashlib.sha256(record_text.encode()).hexdigest()[:16]}"


async def republish_finished(ctx: StageContext, iid: str) -> bool:
    """If the instance has a recorded verdict: (re)publish `patch.built` from it, mark the
    commit built, and return True."""
    state = await buckets.get(ctx.store, INSTANCES, iid)
    if state is None or not state.verdict:
        return False
    msg = finished_message(iid, state)
    text = await ctx.store.resolve_text(state.record, state.record_ref)
    await ctx.bus.publish(m.PATCH_BUILT, msg, msg_id=built_msg_id(iid, text))
    await ctx.store.update(COMMITS.name, m.commit_id(msg.repo, msg.sha), stage="built", verdict=msg.verdict)
    return True
