"""Every stage's handlers without a broker (in-memory Publisher/Records from tests/fakes.py), on every
branch: the work done, already done (answered from the store, nothing redone), rejected, duplicate,
bad input. The real-NATS paths stay covered by test_bus/test_filter/test_classifier/test_evaluator."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from cppperf.demo import DemoRepo
from cppperf.services.builder.handlers import on_candidate, on_classified, on_classified_claimed
from cppperf.services.builder.handlers import startup as builder_startup
from cppperf.services.builder.service import BuiltPatch
from cppperf.services.classifier.handlers import StoreCache, on_selected
from cppperf.services.classifier.service import Classifier
from cppperf.services.evaluator.handlers import on_request
from cppperf.services.evaluator.instances import EvalInstance
from cppperf.services.evaluator.pipeline import EvalRequest, patch_sha256
from cppperf.services.filter.handlers import on_repo_found
from cppperf.services.filter.links import LinkResolver
from cppperf.shared import messages as m
from cppperf.shared.domain import (
    EvalReport,
    EvalVerdict,
    InstanceMeta,
    InstanceRecord,
    InstanceState,
    Stage,
    Verdict,
    to_struct,
)
from cppperf.shared.errors import BadInput, RepoRejected
from cppperf.shared.published import CommitInfo, Metadata, TestsSummary
from cppperf.shared.results import finished_message
from cppperf.shared.service import ServiceContext
from cppperf.shared.store import instance_record
from tests.conftest import make_settings
from tests.fakes import FakeContext, MemoryClaims, MemoryRecords

SHA = "a" * 40
PARENT = "b" * 40
DIFF = "diff --git a/s.cpp b/s.cpp\n--- a/s.cpp\n+++ b/s.cpp\n@@ -1 +1 @@\n-  v.push_back(x);\n+  v.reserve(n);\n"


def commit(message: str = "Speed up the parser by avoiding copies", diff: str = DIFF) -> m.CommitSelected:
    return m.CommitSelected(
        repo="o/r", url="/src/r", sha=SHA, parent=PARENT, date="2024-01-01", message=message, diff=diff
    )


@pytest.fixture
def fctx(tmp_path: Path) -> FakeContext:
    return FakeContext(make_settings(tmp_path))


# ------------------------------------------------------------------------------------ builder
@dataclass
class FakeBuilderOps:
    tmp: Path
    head_sha: str = SHA
    reject: str | None = None
    bad_checkout: bool = False
    record_size: int = 10
    calls: list[str] = field(default_factory=list)

    def checkout(self, url: str, repo: str) -> Path:
        self.calls.append("checkout")
        if self.bad_checkout:
            raise BadInput(f"{url}: not a git repository")
        return self.tmp

    def head(self, path: Path) -> str:
        return self.head_sha

    def validate(self, candidate: m.RepoCandidate, path: Path) -> m.RepoFound:
        self.calls.append("validate")
        if self.reject:
            raise RepoRejected(self.reject)
        return m.RepoFound(
            repo=candidate.repo, url=candidate.url, head_sha=self.head_sha, validated=True, test_count=3
        )

    def prove(self, c: m.CommitSelected, path: Path, diff: str) -> BuiltPatch:
        self.calls.append("prove")
        iid = m.instance_id(c.repo, c.sha)
        record = InstanceRecord(
            metadata=Metadata(repository_name=c.repo),
            commit_info=CommitInfo(
                old_sha=c.parent,
                new_sha=c.sha,
                files_changed=[],
                patch=[diff],
                commit_message=["x" * self.record_size],
            ),
            tests=TestsSummary(tests=[]),
            # a real record differs per build (samples, seed)
            cppperf=InstanceMeta(instance_id=iid, verdict=Verdict.IMPROVED, seed=self.calls.count("prove")),
        )
        msg = m.PatchBuilt(
            instance_id=iid,
            repo=c.repo,
            sha=c.sha,
            parent=c.parent,
            verdict=Verdict.IMPROVED,
            improved_tests=["t"],
        )
        return BuiltPatch(record, msg, self.tmp / f"{iid}.json")


CAND = m.RepoCandidate(repo="o/r", url="/src/r")


async def test_builder_validates_a_candidate_and_records_the_head(fctx: FakeContext, tmp_path: Path) -> None:
    ops = FakeBuilderOps(tmp_path)
    assert await on_candidate(fctx, ops, CAND) == "validated"
    [found] = fctx.bus.on(m.REPO_FOUND)
    assert found.validated and found.test_count == 3
    rec = await fctx.store.get("repos", "o/r")
    assert rec is not None and rec["stage"] == Stage.FOUND and rec["head_sha"] == SHA


async def test_builder_candidate_validated_at_the_same_head_is_not_rebuilt(
    fctx: FakeContext, tmp_path: Path
) -> None:
    ops = FakeBuilderOps(tmp_path)
    await on_candidate(fctx, ops, CAND)
    fctx.bus.seen_ids.clear()  # a later crawl: JetStream's dedup window has passed
    assert await on_candidate(fctx, ops, CAND) == "already-validated"
    assert ops.calls.count("validate") == 1
    assert len(fctx.bus.on(m.REPO_FOUND)) == 2
    ops.head_sha = "c" * 40  # the branch moved on: validate again
    assert await on_candidate(fctx, ops, CAND) == "validated"


async def test_builder_rejected_candidate_is_recorded_not_published(
    fctx: FakeContext, tmp_path: Path
) -> None:
    ops = FakeBuilderOps(tmp_path, reject="latest commit does not build")
    assert await on_candidate(fctx, ops, CAND) == "rejected"
    assert fctx.bus.published == []
    rec = await fctx.store.get("repos", "o/r")
    assert rec is not None and rec["stage"] == "rejected" and rec["by"] == "builder"
    assert "does not build" in rec["reason"]


async def test_builder_bad_candidate_raises_bad_input_and_records_nothing(
    fctx: FakeContext, tmp_path: Path
) -> None:
    ops = FakeBuilderOps(tmp_path, bad_checkout=True)
    with pytest.raises(BadInput):
        await on_candidate(fctx, ops, CAND)
    assert fctx.bus.published == [] and fctx.store.buckets == {}


async def test_builder_negative_commit_is_not_built(fctx: FakeContext, tmp_path: Path) -> None:
    ops = FakeBuilderOps(tmp_path)
    item = m.CommitClassified(commit=commit(), label=False, backend="heuristic")
    assert await on_classified(fctx, ops, item) == "negative"
    assert ops.calls == [] and fctx.bus.published == []


async def test_builder_proves_and_keeps_the_record_in_the_instances_bucket(
    fctx: FakeContext, tmp_path: Path
) -> None:
    ops = FakeBuilderOps(tmp_path)
    item = m.CommitClassified(commit=commit(), label=True, backend="heuristic")
    assert await on_classified(fctx, ops, item) == "built"
    [built] = fctx.bus.on(m.PATCH_BUILT)
    assert built.instance_id == "o__r-aaaaaaaaaaaa" and built.record_path == ""  # an id, not a host path
    state = to_struct(await fctx.store.get("instances", built.instance_id), InstanceState)
    assert state.verdict == Verdict.IMPROVED and state.record and state.record_ref is None
    record = await instance_record(fctx.store, built.instance_id)
    assert record is not None and record.commit_info.patch == [DIFF]
    assert (await fctx.store.get("commits", commit().id) or {})["verdict"] == "improved"
    # redelivered: finished earlier, nothing is redone
    assert await on_classified(fctx, ops, item) == "already-built"
    assert ops.calls.count("prove") == 1
    # the re-publish is the first publish again: record_path empty on both (deprecated)
    again = finished_message(built.instance_id, state)
    assert again == built and again.record_path == ""


async def test_builder_large_record_goes_to_the_object_store(tmp_path: Path) -> None:
    fctx = FakeContext(make_settings(tmp_path), store=MemoryRecords(inline_limit=1000))
    ops = FakeBuilderOps(tmp_path, record_size=5000)
    big_diff = "+" * 3000
    await fctx.store.put_blob("diff/x", big_diff.encode())
    c = msgspec_replace(commit(), diff="", diff_ref="diff/x")
    await on_classified(fctx, ops, m.CommitClassified(commit=c, label=True, backend="heuristic"))
    state = to_struct(await fctx.store.get("instances", "o__r-aaaaaaaaaaaa"), InstanceState)
    assert state.record == "" and state.record_ref is not None
    record = await instance_record(fctx.store, "o__r-aaaaaaaaaaaa")
    assert record is not None and record.commit_info.patch == [big_diff]  # the diff came by reference too


async def test_builder_bad_commit_raises_bad_input_and_marks_nothing(
    fctx: FakeContext, tmp_path: Path
) -> None:
    class Broken(FakeBuilderOps):
        def prove(self, c: m.CommitSelected, path: Path, diff: str) -> BuiltPatch:
            raise BadInput("cannot export aaaaaaaaaaaa: not a tree")

    item = m.CommitClassified(commit=commit(), label=True, backend="heuristic")
    with pytest.raises(BadInput):
        await on_classified(fctx, Broken(tmp_path), item)
    assert fctx.bus.published == [] and await fctx.store.get("instances", "o__r-aaaaaaaaaaaa") is None


async def test_builder_builds_under_the_instances_claim_and_releases_it(
    fctx: FakeContext, tmp_path: Path
) -> None:
    ops, claims = FakeBuilderOps(tmp_path), MemoryClaims()
    item = m.CommitClassified(commit=commit(), label=True, backend="heuristic")
    seen: list[dict[str, Any]] = []

    class Watching(FakeBuilderOps):
        def prove(self, c: m.CommitSelected, path: Path, diff: str) -> BuiltPatch:
            seen.extend(asyncio.run(claims.live()))  # what another replica sees mid-build
            return ops.prove(c, path, diff)

    lock = asyncio.Lock()
    assert await on_classified_claimed(fctx, Watching(tmp_path), claims, item, exclusive=lock) == "built"
    key = "instance/o__r-aaaaaaaaaaaa"
    assert next(k for k in seen if k["key"] == key)["holder"] == claims.token
    assert claims.events == [("claimed", key), ("cleaned", fctx.settings.run_owner()), ("released", key)]
    assert claims.holders == {} and not lock.locked()
    # finished: answered from the record, no claim taken, nothing built again
    claims.events.clear()
    assert await on_classified_claimed(fctx, ops, claims, item, exclusive=lock) == "already-built"
    assert claims.events == [] and ops.calls.count("prove") == 1
    # a negative takes no claim either
    neg = m.CommitClassified(commit=commit(), label=False, backend="heuristic")
    assert await on_classified_claimed(fctx, ops, claims, neg, exclusive=lock) == "negative"
    assert claims.events == []


async def test_builder_waits_for_another_replicas_claim_then_answers_from_its_record(
    fctx: FakeContext, tmp_path: Path
) -> None:
    ops, claims = FakeBuilderOps(tmp_path), MemoryClaims()
    key = "instance/o__r-aaaaaaaaaaaa"
    claims.holders[key] = "replica-2"
    item = m.CommitClassified(commit=commit(), label=True, backend="heuristic")
    with capture_logs() as logs:
        task = asyncio.create_task(on_classified_claimed(fctx, ops, claims, item, exclusive=asyncio.Lock()))
        await asyncio.sleep(0.1)
        assert not task.done() and ops.calls == []  # waits while the other replica builds
        other = FakeBuilderOps(tmp_path)  # the other replica records its result, then releases
        assert await on_classified(fctx, other, item) == "built"
        del claims.holders[key]
        assert await task == "already-built"
    assert ops.calls == []  # never built twice
    assert next(e for e in logs if e["event"] == "instance_claimed_elsewhere")["holder"] == "replica-2"
    assert len(fctx.bus.on(m.PATCH_BUILT)) == 1  # the re-publish is dropped by its stable id


async def test_builder_startup_announces_the_worker_and_cleans_dead_workspaces(fctx: FakeContext) -> None:
    claims = MemoryClaims()
    assert await builder_startup(fctx, claims) == []
    assert claims.events == [("announced", f"worker/{claims.token}"), ("cleaned", fctx.settings.run_owner())]
    assert (fctx.settings.work_dir() / "attempts" / claims.token).is_dir()


def msgspec_replace(c: m.CommitSelected, **kw: Any) -> m.CommitSelected:
    import msgspec

    return msgspec.structs.replace(c, **kw)


# ------------------------------------------------------------------------------------ evaluator
@dataclass
class FakeEvaluatorOps:
    verdict: str = EvalVerdict.OPT
    seen: list[tuple[EvalRequest, EvalInstance | None]] = field(default_factory=list)

    def evaluate(self, req: EvalRequest, instance: EvalInstance | None) -> EvalReport:
        self.seen.append((req, instance))
        return EvalReport(
            verdict=EvalVerdict(self.verdict),
            opt=self.verdict == EvalVerdict.OPT,
            patch_sha256=patch_sha256(req.patch),
            samples={"t": {}},
            samples_wall={"t": {}},
            samples_cpu={"t": {}},
        )


def request(**kw: Any) -> m.EvalRequested:
    base: dict[str, Any] = {
        "request_id": "r1/m/o__r-aaaaaaaaaaaa",
        "run_id": "r1",
        "model": "m",
        "instance_id": "o__r-aaaaaaaaaaaa",
        "patch": DIFF,
        "reply_to": "_INBOX.x",
    }
    return m.EvalRequested(**{**base, **kw})


async def test_evaluator_evaluates_replies_and_stores_the_report(fctx: FakeContext, tmp_path: Path) -> None:
    # the instance comes from the instances bucket (as the builder left it), not from a host path
    await on_classified(
        fctx, FakeBuilderOps(tmp_path), m.CommitClassified(commit=commit(), label=True, backend="h")
    )
    stored = await fctx.store.get("instances", "o__r-aaaaaaaaaaaa")
    assert stored is not None
    record = {
        "metadata": {"repository_name": "o/r", "repository": "/src/r"},
        "commit_info": {"old_sha": PARENT, "new_sha": SHA, "patch": [DIFF], "files_changed": []},
        "tests": {"tests": []},
        "cppperf": {"instance_id": "o__r-aaaaaaaaaaaa", "verdict": "improved"},
    }
    await fctx.store.update("instances", "o__r-aaaaaaaaaaaa", record=json.dumps(record))
    ops = FakeEvaluatorOps()
    assert await on_request(fctx, ops, request()) == "evaluated"
    [(req, inst)] = ops.seen
    assert req.patch == DIFF and inst is not None and inst.base_sha == PARENT
    [done] = fctx.bus.on(m.EVAL_COMPLETED)
    assert done.verdict == "opt" and done.opt
    assert not {"samples", "samples_wall", "samples_cpu"} & done.report.keys()  # none ride the bus
    assert fctx.bus.replies == [("_INBOX.x", done)]
    ev = await fctx.store.get("evaluations", "r1/m/o__r-aaaaaaaaaaaa")
    assert ev is not None and ev["verdict"] == "opt" and json.loads(ev["report"])["verdict"] == "opt"
    assert not {"samples", "samples_wall", "samples_cpu"} & json.loads(ev["report"]).keys()


async def test_evaluator_answers_a_finished_request_from_the_store(fctx: FakeContext) -> None:
    ops = FakeEvaluatorOps()
    await on_request(fctx, ops, request())
    again = request(reply_to="_INBOX.y")
    assert await on_request(fctx, ops, again) == "answered-from-store"
    assert len(ops.seen) == 1  # not re-run
    assert len(fctx.bus.on(m.EVAL_COMPLETED)) == 1  # the re-publish is a duplicate id
    assert fctx.bus.replies[-1][0] == "_INBOX.y" and fctx.bus.replies[-1][1].verdict == "opt"


async def test_evaluator_reevaluates_the_same_request_with_another_patch(fctx: FakeContext) -> None:
    ops = FakeEvaluatorOps()
    await on_request(fctx, ops, request())
    other = request(patch=DIFF.replace("reserve(n)", "reserve(2 * n)"))
    assert await on_request(fctx, ops, other) == "evaluated"  # a stored report is for its patch only
    assert [req.patch for req, _ in ops.seen] == [DIFF, other.patch]


async def test_evaluator_reevaluates_when_the_stored_report_is_of_another_shape(fctx: FakeContext) -> None:
    """A stored report this version cannot read as an `EvalReport` (an unknown key, from another
    version) is not answered from: the request is evaluated again and its report replaces it."""
    ops = FakeEvaluatorOps()
    await on_request(fctx, ops, request())
    key = "r1/m/o__r-aaaaaaaaaaaa"
    ev = await fctx.store.get("evaluations", key)
    assert ev is not None
    old = {**json.loads(ev["report"]), "from_a_newer_version": 1}
    await fctx.store.update("evaluations", key, report=json.dumps(old))
    assert await on_request(fctx, ops, request(reply_to="_INBOX.z")) == "evaluated"
    assert len(ops.seen) == 2
    ev = await fctx.store.get("evaluations", key)
    assert ev is not None and "from_a_newer_version" not in json.loads(ev["report"])


async def test_evaluator_reads_a_large_patch_by_reference(fctx: FakeContext) -> None:
    ref = await fctx.store.put_blob("patch/r1/m/x", DIFF.encode())
    ops = FakeEvaluatorOps(verdict=EvalVerdict.CORRECT)
    await on_request(fctx, ops, request(patch="", patch_ref=ref))
    assert ops.seen[0][0].patch == DIFF and ops.seen[0][1] is None  # no instance in the bucket


async def test_evaluator_missing_patch_ref_is_bad_input(fctx: FakeContext) -> None:
    with pytest.raises(BadInput, match="patch_ref"):
        await on_request(fctx, FakeEvaluatorOps(), request(patch="", patch_ref="patch/gone"))
    assert fctx.bus.published == [] and await fctx.store.get("evaluations", "r1/m/o__r-aaaaaaaaaaaa") is None


# ------------------------------------------------------------------------------------ filter
async def test_filter_walks_once_and_publishes_each_commit_once(
    fctx: FakeContext, demo_repo: DemoRepo
) -> None:
    found = m.RepoFound(repo="local/demo", url=str(demo_repo.path))
    assert await on_repo_found(fctx, found, LinkResolver()) == "walked"
    selected = fctx.bus.on(m.COMMIT_SELECTED)
    assert len(selected) == 8
    assert (await fctx.store.get("commits", selected[0].id) or {})["stage"] == "selected"
    assert await on_repo_found(fctx, found, LinkResolver()) == "already-walked"
    # the branch moved (the head record changed): a new walk, but known commits are not re-published
    await fctx.store.update("repos", "local/demo", filter={"head": "old"})
    assert await on_repo_found(fctx, found, LinkResolver()) == "walked"
    assert len(fctx.bus.on(m.COMMIT_SELECTED)) == 8


async def test_filter_large_diff_goes_by_reference(tmp_path: Path, demo_repo: DemoRepo) -> None:
    fctx = FakeContext(make_settings(tmp_path), store=MemoryRecords(inline_limit=10))
    await on_repo_found(fctx, m.RepoFound(repo="local/demo", url=str(demo_repo.path)), LinkResolver())
    sel = fctx.bus.on(m.COMMIT_SELECTED)
    assert sel and all(c.diff == "" and c.diff_ref for c in sel)
    assert "diff --git" in await fctx.store.resolve_text("", sel[0].diff_ref)


async def test_filter_not_a_repository_is_bad_input(fctx: FakeContext, tmp_path: Path) -> None:
    with pytest.raises(BadInput):
        await on_repo_found(fctx, m.RepoFound(repo="x/y", url=str(tmp_path)), LinkResolver())
    assert fctx.bus.published == []


# ------------------------------------------------------------------------------------ classifier
async def test_classifier_labels_records_and_caches(fctx: FakeContext) -> None:
    clf = Classifier.create(fctx.settings.classifier, StoreCache(fctx.store))
    c = commit()
    assert await on_selected(fctx, clf, c) is True
    [out] = fctx.bus.on(m.COMMIT_CLASSIFIED)
    assert out.label and out.commit.sha == SHA
    rec = await fctx.store.get("commits", c.id)
    assert rec is not None and rec["stage"] == "classified" and rec["label"] is True
    # redelivered: answered from the cache bucket, published once (same id)
    assert await on_selected(fctx, clf, c) is True
    assert clf.cache_hits == 1 and len(fctx.bus.on(m.COMMIT_CLASSIFIED)) == 1


async def test_classifier_prefilter_rejects_a_comment_only_diff(fctx: FakeContext) -> None:
    clf = Classifier.create(fctx.settings.classifier, StoreCache(fctx.store))
    comment = "diff --git a/s.cpp b/s.cpp\n--- a/s.cpp\n+++ b/s.cpp\n@@ -1 +1 @@\n-// old\n+// new\n"
    assert await on_selected(fctx, clf, commit(diff=comment)) is False
    [out] = fctx.bus.on(m.COMMIT_CLASSIFIED)
    assert out.backend == "prefilter" and not out.label


async def test_classifier_reads_the_diff_by_reference(fctx: FakeContext) -> None:
    ref = await fctx.store.put_blob("diff/o/r@a", DIFF.encode())
    clf = Classifier.create(fctx.settings.classifier, StoreCache(fctx.store))
    assert await on_selected(fctx, clf, msgspec_replace(commit(), diff="", diff_ref=ref)) is True


# ------------------------------------------------------------------------------------ crawler
async def test_crawler_submits_a_good_repo_and_records_bad_ones(
    fctx: FakeContext, demo_repo: DemoRepo, tmp_path: Path
) -> None:
    from cppperf.services.crawler.handlers import submit

    not_cpp = tmp_path / "py"
    from tests.gitrepo import commit_files

    commit_files(not_cpp, {"a.py": "x = 1\n" * 100}, "init")
    report = await submit(fctx, [str(demo_repo.path), str(not_cpp), "::not a spec::"], validate=True)
    assert report.published == [f"local/{demo_repo.path.name}"]
    assert len(report.rejected) == 2
    [cand] = fctx.bus.on(m.REPO_CANDIDATE)
    assert cand.language == "C++"
    rec = await fctx.store.get("repos", "local/py")
    assert rec is not None and rec["stage"] == Stage.REJECTED and rec["by"] == "crawler"
    # submitted again (a later crawl within JetStream's dedup window): one candidate on the bus
    await submit(fctx, [str(demo_repo.path)], validate=True)
    assert len(fctx.bus.on(m.REPO_CANDIDATE)) == 1
    # without validation the repo goes straight to the filter
    fresh = FakeContext(fctx.settings)
    await submit(fresh, [str(demo_repo.path)], validate=False)
    assert [f.validated for f in fresh.bus.on(m.REPO_FOUND)] == [False]


# ------------------------------------------------------------------------------------ mine --force
async def test_force_requeues_a_finished_instance_and_the_builder_proves_it_again(
    ctx: ServiceContext, demo_repo: DemoRepo, tmp_path: Path
) -> None:
    from cppperf.redo import redo_instances
    from cppperf.shared.bus import stream_for

    sha = demo_repo.shas["perf"]
    first = m.CommitSelected(
        repo="local/demo",
        url=str(demo_repo.path),
        sha=sha,
        parent=demo_repo.git("rev-parse", f"{sha}^"),
        date="2024-01-01",
        message="perf",
        diff=DIFF,
    )
    ops = FakeBuilderOps(tmp_path)
    item = m.CommitClassified(commit=first, label=True, backend="heuristic")
    assert await on_classified(ctx, ops, item) == "built"
    iid = m.instance_id("local/demo", sha)
    await ctx.store.put("repos", "local/demo", {"url": str(demo_repo.path)})
    assert await on_classified(ctx, ops, item) == "already-built"  # without --force: not redone
    outcome = await redo_instances(ctx, [iid, "nope__x-000000000000"])
    assert outcome[iid] == "requeued" and "unknown instance" in outcome["nope__x-000000000000"]
    assert await ctx.store.get("instances", iid) is None
    raw = await ctx.bus.js.get_last_msg(stream_for(m.COMMIT_CLASSIFIED), m.COMMIT_CLASSIFIED)
    again = m.decode(raw.data, m.CommitClassified)
    assert again.label and again.backend == "force" and again.commit.sha == sha
    assert again.commit.diff.startswith("diff --git")  # read from the repository, not the old message
    assert await on_classified(ctx, ops, again) == "built"
    assert ops.calls.count("prove") == 2
    # patch.built: the forced result is announced although the instance id is the same (its msg id
    # carries the record's hash); a re-publish of that same result is deduplicated
    built_stream = stream_for(m.PATCH_BUILT)
    assert (await ctx.bus.js.stream_info(built_stream)).state.messages == 2
    assert await on_classified(ctx, ops, again) == "already-built"
    assert (await ctx.bus.js.stream_info(built_stream)).state.messages == 2
    last = await ctx.bus.js.get_last_msg(built_stream, m.PATCH_BUILT)
    assert (last.headers or {}).get("Nats-Msg-Id", "").startswith(iid + "@")


async def test_gateway_answers_a_finished_evaluation_whole_or_in_brief(fctx: FakeContext) -> None:
    """`result` is the stored report (typed on the way: `EvalReport`) with its id; `results` rows
    are `ResultSummary`s; a report too large for a reply is its summary, `truncated`; a stored
    report that does not decode is answered as such, never raised."""
    from cppperf.services.evaluator import gateway
    from cppperf.shared import buckets
    from cppperf.shared.buckets import EVALUATIONS
    from cppperf.shared.domain import EvalReport, EvaluationState, to_json_dict

    eid = m.evaluation_id(m.agent_run("alice", "r1"), "m", "o__r-aaaaaaaaaaaa")
    report = EvalReport(
        verdict=EvalVerdict.OPT, opt=True, instance_id="o__r-aaaaaaaaaaaa", model="m", gm_speedup_agent=1.5
    )

    async def store(text: str) -> None:
        state = EvaluationState(verdict=EvalVerdict.OPT, opt=True, report=text)
        await buckets.put(fctx.store, EVALUATIONS, eid, state)

    async def result() -> dict[str, Any]:
        answer = await gateway.result(fctx, "alice", m.encode(m.AgentQuery(id=eid)))  # type: ignore[arg-type]
        assert answer.ok and answer.status == "done" and answer.result is not None
        return answer.result

    await store(json.dumps(to_json_dict(msgspec.structs.replace(report, apply_log="applied"))))
    assert await result() == {**to_json_dict(report), "apply_log": "applied", "id": eid}
    rows = (await gateway.results(fctx, "alice", m.encode(m.AgentQuery(run_id="r1")))).results  # type: ignore[arg-type]
    brief = {
        "id": eid,
        "instance_id": "o__r-aaaaaaaaaaaa",
        "model": "m",
        "verdict": "opt",
        "opt": True,
        "gm_speedup_agent": 1.5,
        "reason": "",
    }
    assert rows == [brief]
    assert (await gateway.results(fctx, "bob", m.encode(m.AgentQuery(run_id="r1")))).results == []  # type: ignore[arg-type]
    await store(
        json.dumps(to_json_dict(msgspec.structs.replace(report, apply_log="x" * gateway.MAX_REPORT_REPLY)))
    )
    assert await result() == {**brief, "truncated": True}
    await store("{not json")
    unreadable = await result()
    assert unreadable["verdict"] == "opt" and unreadable["reason"] == "the stored report is unreadable"
