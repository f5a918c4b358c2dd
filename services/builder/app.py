"""Builder wiring: `repo.candidate` → validate latest → `repo.found`;
`commit.classified` (positives) → prove → `patch.built` + instance record."""

from __future__ import annotations

import asyncio
from pathlib import Path

from faststream.nats import NatsBroker

from cppperf.services.builder.service import build_patch, head_sha, llm_dependency_proposer, validate_latest
from cppperf.shared import messages as m
from cppperf.shared.errors import RepoRejected
from cppperf.shared.mirror import ensure_local
from cppperf.shared.service import ServiceContext, subscribe


async def process_candidate(ctx: ServiceContext, cand: m.RepoCandidate) -> None:
    s = ctx.settings
    path: Path = await asyncio.to_thread(ensure_local, cand.url, cand.repo, s.mirror_dir())
    prior = await ctx.store.get("repos", cand.repo) or {}
    if prior.get("validated") and prior.get("head_sha") == await asyncio.to_thread(head_sha, path):
        # validated earlier at this very commit: pass it on without rebuilding
        await ctx.bus.publish(
            m.REPO_FOUND,
            m.RepoFound(
                repo=cand.repo,
                url=cand.url,
                head_sha=prior["head_sha"],
                validated=True,
                test_count=prior.get("test_count"),
                build_seconds=prior.get("build_seconds"),
            ),
        )
        return
    try:
        found = await asyncio.to_thread(validate_latest, cand, path, s.builder, work_dir=s.work_dir())
    except RepoRejected as exc:
        await ctx.store.put(
            "repos", cand.repo, {"stage": "rejected", "by": "builder", "reason": str(exc), "url": cand.url}
        )
        return  # a verdict about the repo, recorded; nothing to retry
    await ctx.store.update(
        "repos",
        cand.repo,
        stage="found",
        validated=True,
        head_sha=found.head_sha,
        test_count=found.test_count,
        build_seconds=found.build_seconds,
    )
    await ctx.bus.publish(m.REPO_FOUND, found)


async def process_classified(ctx: ServiceContext, item: m.CommitClassified) -> None:
    commit = item.commit
    if not item.label:
        return
    iid = m.instance_id(commit.repo, commit.sha)
    done = await ctx.store.get("instances", iid)
    if done is not None and done.get("verdict"):
        return  # finished earlier: a redelivery must not redo 30 minutes of work
    s = ctx.settings
    path: Path = await asyncio.to_thread(ensure_local, commit.url, commit.repo, s.mirror_dir())
    diff = await ctx.store.resolve_text(commit.diff, commit.diff_ref)
    built = await asyncio.to_thread(
        build_patch,
        commit,
        path,
        s.builder,
        work_dir=s.work_dir(),
        out_dir=ctx.out_dir,
        diff=diff,
        llm_propose=llm_dependency_proposer(s),
    )
    msg = built.message
    await ctx.bus.publish(m.PATCH_BUILT, msg)  # before the store marks it done: a crash re-publishes
    await ctx.store.put(
        "instances",
        iid,
        {
            "stage": "built",
            "verdict": msg.verdict,
            "repo": msg.repo,
            "sha": msg.sha,
            "parent": msg.parent,
            "improved_tests": msg.improved_tests,
            "regressed_tests": msg.regressed_tests,
            "failure_category": msg.failure_category,
            "record_path": msg.record_path,
        },
    )
    await ctx.store.update("commits", commit.id, stage="built", verdict=msg.verdict)


def register(broker: NatsBroker, ctx: ServiceContext) -> None:
    # One build or timing job per process at a time: concurrent jobs would time each other.
    exclusive = asyncio.Lock()

    async def candidate(item: m.RepoCandidate) -> None:
        async with exclusive:
            await process_candidate(ctx, item)

    async def classified(item: m.CommitClassified) -> None:
        if not item.label:
            await process_classified(ctx, item)  # records nothing, returns at once
            return
        async with exclusive:
            await process_classified(ctx, item)

    subscribe(broker, ctx, subject=m.REPO_CANDIDATE, service="builder", typ=m.RepoCandidate, work=candidate)
    subscribe(
        broker, ctx, subject=m.COMMIT_CLASSIFIED, service="builder", typ=m.CommitClassified, work=classified
    )
