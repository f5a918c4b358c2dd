"""`mine --force ID`: build chosen instances again, although the store says they are finished.

A finished instance is never rebuilt by the pipeline (the store is the truth, README "Failure
behaviour"). Forcing one removes its `instances` entry and puts its commit straight back on
`commit.classified` (a positive label, backend `force`) under a fresh message id, so the JetStream
dedup window does not drop it; the builder then proves it as it would a new one. Upstream stages
are untouched: the repository is not walked again and the commit is not classified again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.buckets import INSTANCES, REPOS
from cppperf.shared.domain import RepoState
from cppperf.shared.errors import CppPerfError
from cppperf.shared.mirror import ensure_local
from cppperf.shared.service import ServiceContext

ALL = "all"


async def _commit(ctx: ServiceContext, rec: dict[str, object]) -> m.CommitSelected:
    from cppperf.api import commit_from_repo

    repo, sha, parent = str(rec.get("repo", "")), str(rec.get("sha", "")), str(rec.get("parent", ""))
    state = await buckets.get(ctx.store, REPOS, repo) or RepoState()
    url = state.url
    if not url:
        raise CppPerfError(f"repository {repo} is not in this output folder's store")
    path: Path = await asyncio.to_thread(ensure_local, url, repo, ctx.settings.mirror_dir())
    return await asyncio.to_thread(commit_from_repo, path, sha, parent=parent or None, name=repo)


async def redo_instances(ctx: ServiceContext, ids: list[str]) -> dict[str, str]:
    """Requeue each instance of `ids` (`all`: every recorded one). Returns id -> "requeued" or
    why it could not be (an unknown id, a repository no longer reachable)."""
    wanted = list(ids)
    if ALL in wanted:
        wanted = [i for i in wanted if i != ALL]
        wanted += [str(k) for k in await ctx.store.ids(INSTANCES.name) if k not in wanted]
    outcome: dict[str, str] = {}
    for iid in wanted:
        rec = await ctx.store.get(INSTANCES.name, iid)
        if rec is None:
            outcome[iid] = "unknown instance (never built in this output folder)"
            continue
        try:
            commit = await _commit(ctx, rec)
        except (CppPerfError, ValueError) as exc:
            outcome[iid] = str(exc)
            continue
        diff, ref = await ctx.store.inline_or_ref(f"diff/{commit.id}", commit.diff)
        if ref:
            commit = msgspec.structs.replace(commit, diff=diff, diff_ref=ref)
        await ctx.store.delete(INSTANCES.name, iid)
        msg = m.CommitClassified(commit=commit, label=True, backend="force", evidence=["mine --force"])
        await ctx.bus.publish(m.COMMIT_CLASSIFIED, msg, msg_id=f"{msg.id}#force-{time.time_ns()}")
        outcome[iid] = "requeued"
    return outcome
