"""The builder's handlers, without a broker: `repo.candidate` → validate the latest commit →
`repo.found`; `commit.classified` (positives) → prove → `patch.built` + the instance record.

Each handler takes a `StageContext` (settings, publisher, records) and `BuilderOps` (the slow
work: mirror, validate, prove), returns what it did, and is idempotent: the store is checked
first, and a built instance is recorded before `patch.built` is published from it (a crash or a
second request re-publishes from the record; the stable id drops the duplicate). State: the instance record goes into the `instances` bucket
(inline, or by `record_ref` in the object store when large); the file under `out/instances/` is
an export.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from cppperf.services.builder.service import (
    BuiltPatch,
    build_patch,
    head_sha,
    llm_dependency_proposer,
    validate_latest,
    write_instance,
)
from cppperf.shared import buckets, claims
from cppperf.shared import messages as m
from cppperf.shared.buckets import COMMITS, INSTANCES, REPOS
from cppperf.shared.domain import (
    InstanceState,
    RepoState,
    Stage,
    Verdict,
    decode_record,
    record_text,
    to_json_dict,
)
from cppperf.shared.errors import RepoRejected
from cppperf.shared.mirror import ensure_local
from cppperf.shared.ports import StageContext
from cppperf.shared.results import built_msg_id, republish_finished
from cppperf.shared.settings import Settings

CandidateOutcome = Literal["already-validated", "rejected", "validated"]
ClassifiedOutcome = Literal["negative", "already-built", "built"]


class BuilderOps(Protocol):
    """The slow, blocking work the handlers run in a thread."""

    def checkout(self, url: str, repo: str) -> Path: ...
    def head(self, path: Path) -> str: ...
    def validate(self, candidate: m.RepoCandidate, path: Path) -> m.RepoFound: ...
    def prove(self, commit: m.CommitSelected, path: Path, diff: str) -> BuiltPatch: ...


@dataclass
class EngineOps:
    """The real `BuilderOps`: git mirrors and the engine (local or docker backend)."""

    settings: Settings

    def checkout(self, url: str, repo: str) -> Path:
        return ensure_local(url, repo, self.settings.mirror_dir())

    def head(self, path: Path) -> str:
        return head_sha(path)

    def validate(self, candidate: m.RepoCandidate, path: Path) -> m.RepoFound:
        s = self.settings
        work_dir = claims.own_workspace(s.work_dir(), owner=s.run_owner())  # this process's own
        return validate_latest(candidate, path, self.settings.builder, work_dir=work_dir)

    def prove(self, commit: m.CommitSelected, path: Path, diff: str) -> BuiltPatch:
        s = self.settings
        built = build_patch(
            commit,
            path,
            s.builder,
            work_dir=claims.own_workspace(s.work_dir(), owner=s.run_owner()),  # never shared
            out_dir=Path(s.out_dir),
            diff=diff,
            llm_propose=llm_dependency_proposer(s),
        )
        return with_oracle(built, s)


def with_oracle(built: BuiltPatch, settings: Settings) -> BuiltPatch:
    """`builder.validate_gold`: an improved instance is gold-validated before it is recorded (its
    record then carries `oracle`), so what the bus stores and announces says whether it grades."""
    if not settings.builder.validate_gold or built.message.verdict != Verdict.IMPROVED:
        return built
    from cppperf.services.evaluator.gold import validate_record

    data = to_json_dict(built.record)  # gold.py works on the record's JSON and adds its validation
    validate_record(data, settings)
    built = replace(built, record=decode_record(data))
    write_instance(Path(settings.out_dir), built.record)
    return built


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
        return "already-built"
    await ctx.bus.publish(m.PATCH_BUILT, msg, msg_id=built_msg_id(iid, text))
    await ctx.store.update(COMMITS.name, commit.id, stage=Stage.BUILT, verdict=msg.verdict)
    return "built"
