"""The builder's handlers, without a broker: `repo.candidate` → validate the latest commit →
`repo.found`; `commit.classified` (positives) → prove → `patch.built` + the instance record;
`startup` announces the worker and removes dead attempts' workspaces.

Each handler takes a `StageContext` (settings, publisher, records) and `BuilderOps` (the slow
work: mirror, validate, prove); `on_classified_claimed` and `startup` also the `Claims` port
(one build per instance at a time across replicas: a lease held around the build; a replica
that finds it held waits, then answers from the record). Each returns what it did, and is
idempotent: the store is checked
first, and a built instance is recorded before `patch.built` is published from it (a crash or a
second request re-publishes from the record; the stable id drops the duplicate). State: the instance record goes into the `instances` bucket
(inline, or by `record_ref` in the object store when large); the file under `out/instances/` is
an export. With `builder.validate_gold` an improved instance, once stored, is handed to the
evaluator for gold validation (`validate.requested`, `request_validation`): the builder never runs
an evaluation itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from cppperf.services.builder.service import (
    BuiltPatch,
    build_patch,
    head_sha,
    llm_dependency_proposer,
    validate_latest,
)
from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.buckets import COMMITS, INSTANCES, REPOS
from cppperf.shared.domain import (
    InstanceState,
    RepoState,
    Stage,
    Verdict,
    record_text,
)
from cppperf.shared.errors import RepoRejected
from cppperf.shared.logging import get_logger
from cppperf.shared.mirror import ensure_local
from cppperf.shared.ports import Claims, StageContext
from cppperf.shared.results import built_msg_id, republish_finished
from cppperf.shared.settings import Settings

CandidateOutcome = Literal["already-validated", "rejected", "validated"]
ClassifiedOutcome = Literal["negative", "already-built", "built"]

log = get_logger(__name__)


class BuilderOps(Protocol):
    """The slow, blocking work the handlers run in a thread."""

    def checkout(self, url: str, repo: str) -> Path: ...
    def head(self, path: Path) -> str: ...
    def validate(self, candidate: m.RepoCandidate, path: Path) -> m.RepoFound: ...
    def prove(self, commit: m.CommitSelected, path: Path, diff: str) -> BuiltPatch: ...


@dataclass
class EngineOps:
    """The real `BuilderOps`: git mirrors and the engine (local or docker backend), in this
    process's own workspace (from the `Claims` port: never shared with another process)."""

    settings: Settings
    claims: Claims

    def checkout(self, url: str, repo: str) -> Path:
        return ensure_local(url, repo, self.settings.mirror_dir())

    def head(self, path: Path) -> str:
        return head_sha(path)

    def validate(self, candidate: m.RepoCandidate, path: Path) -> m.RepoFound:
        s = self.settings
        work_dir = self.claims.workspace(s.work_dir(), owner=s.run_owner())
        return validate_latest(candidate, path, self.settings.builder, work_dir=work_dir)

    def prove(self, commit: m.CommitSelected, path: Path, diff: str) -> BuiltPatch:
        s = self.settings
        return build_patch(
            commit,
            path,
            s.builder,
            work_dir=self.claims.workspace(s.work_dir(), owner=s.run_owner()),
            out_dir=Path(s.out_dir),
            diff=diff,
            llm_propose=llm_dependency_proposer(s),
        )


async def request_validation(ctx: StageContext, iid: str) -> bool:
    """`builder.validate_gold`: ask the evaluator to gold-validate a stored improved instance not
    validated yet (`validate.requested`; the evaluator records its `oracle`). True when asked
    (a duplicate of an earlier request is dropped by its id)."""
    if not ctx.settings.builder.validate_gold:
        return False
    state = await buckets.get(ctx.store, INSTANCES, iid)
    if state is None or state.verdict != Verdict.IMPROVED or state.oracle is not None:
        return False
    text = await ctx.store.resolve_text(state.record, state.record_ref)
    # one request per stored record: a forced rebuild (a new record) is validated again
    request = m.ValidateRequested(instance_id=iid, request_id=built_msg_id(iid, text).rsplit("@", 1)[1])
    await ctx.bus.publish(m.VALIDATE_REQUESTED, request)
    return True


async def startup(ctx: StageContext, claims: Claims) -> list[str]:
    """Once, before consuming: announce this worker (its lease), take its workspace and remove
    the workspaces of this run's dead attempts (their tokens)."""
    s = ctx.settings
    await claims.announce(lease=s.bus.claim_lease)
    claims.workspace(s.work_dir(), owner=s.run_owner())
    return await claims.clean_stale(s.work_dir(), owner=s.run_owner())


async def on_classified_claimed(
    ctx: StageContext, ops: BuilderOps, claims: Claims, item: m.CommitClassified, *, exclusive: asyncio.Lock
) -> ClassifiedOutcome:
    """`on_classified` under the instance's claim (`instance/<id>`): a finished instance is
    answered from its record without a claim; else the claim is taken (waiting while another
    replica holds it; a dead holder's lease runs out and its workspace is removed), and the build
    runs once `exclusive` (one build or timing job per process) is free."""
    if not item.label:
        return await on_classified(ctx, ops, item)  # records nothing, returns at once
    iid = m.instance_id(item.commit.repo, item.commit.sha)
    if await republish_finished(ctx, iid):
        await request_validation(ctx, iid)  # `builder.validate_gold`, if not validated yet
        return "already-built"  # a redelivery or a second request gets that result

    async def busy(holder: str) -> None:
        log.info("instance_claimed_elsewhere", instance=iid, holder=holder)

    s = ctx.settings
    async with claims.held(f"instance/{iid}", lease=s.bus.claim_lease, wait=busy):
        await claims.clean_stale(s.work_dir(), owner=s.run_owner())  # e.g. a dead holder's
        async with exclusive:
            return await on_classified(ctx, ops, item)


async def on_candidate(ctx: StageContext, ops: BuilderOps, cand: m.RepoCandidate) -> CandidateOutcome:
    path = await asyncio.to_thread(ops.checkout, cand.url, cand.repo)
    prior = await buckets.get(ctx.store, REPOS, cand.repo) or RepoState()
    head = await asyncio.to_thread(ops.head, path)
    if prior.validated and prior.head_sha == head:
        # validated earlier at this very commit: pass it on without rebuilding
        await ctx.bus.publish(
            m.REPO_FOUND,
            m.RepoFound(
                repo=cand.repo,
                url=cand.url,
                head_sha=head,
                validated=True,
                test_count=prior.test_count,
                build_seconds=prior.build_seconds,
            ),
        )
        return "already-validated"
    try:
        found = await asyncio.to_thread(ops.validate, cand, path)
    except RepoRejected as exc:
        rejected = RepoState(stage=Stage.REJECTED, by="builder", reason=str(exc), url=cand.url)
        await buckets.put(ctx.store, REPOS, cand.repo, rejected)
        return "rejected"  # a verdict about the repo, recorded; nothing to retry
    await ctx.bus.publish(m.REPO_FOUND, found)
    await ctx.store.update(
        REPOS.name,
        cand.repo,
        stage=Stage.FOUND,
        validated=True,
        head_sha=found.head_sha,
        test_count=found.test_count,
        build_seconds=found.build_seconds,
    )
    return "validated"


async def on_classified(ctx: StageContext, ops: BuilderOps, item: m.CommitClassified) -> ClassifiedOutcome:
    commit = item.commit
    if not item.label:
        return "negative"
    iid = m.instance_id(commit.repo, commit.sha)
    done = await buckets.get(ctx.store, INSTANCES, iid) or InstanceState()
    if done.verdict is not None:  # finished earlier: a redelivery must not redo 30 minutes of work
        await republish_finished(ctx, iid)  # but a second request gets the result (dedup by id)
        await request_validation(ctx, iid)  # e.g. a crash before it was asked
        return "already-built"
    path = await asyncio.to_thread(ops.checkout, commit.url, commit.repo)
    diff = await ctx.store.resolve_text(commit.diff, commit.diff_ref)
    built = await asyncio.to_thread(ops.prove, commit, path, diff)
    msg = built.message
    text = record_text(built.record, indent=None)
    record, record_ref = await ctx.store.inline_or_ref(f"record/{iid}", text)
    state = InstanceState(
        stage=Stage.BUILT,
        verdict=built.record.cppperf.verdict,
        repo=msg.repo,
        sha=msg.sha,
        parent=msg.parent,
        improved_tests=msg.improved_tests,
        regressed_tests=msg.regressed_tests,
        improved_benchmarks=msg.improved_benchmarks,
        regressed_benchmarks=msg.regressed_benchmarks,
        failure_category=built.record.cppperf.failure_category,
        record=record,
        record_ref=record_ref,
        record_path=str(built.path),
    )
    # Store before publish: the record is the truth and patch.built is derived from it; if another
    # attempt recorded first, its result is the one announced (record, KV and message agree).
    if not await buckets.create(ctx.store, INSTANCES, iid, state):
        await republish_finished(ctx, iid)
        await request_validation(ctx, iid)
        return "already-built"
    await ctx.bus.publish(m.PATCH_BUILT, msg, msg_id=built_msg_id(iid, text))
    await request_validation(ctx, iid)  # after the record: the evaluator reads it from the bucket
    await ctx.store.update(COMMITS.name, commit.id, stage=Stage.BUILT, verdict=msg.verdict)
    return "built"
