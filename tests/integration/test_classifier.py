"""Classifier: heuristic and prefilter rules, the two-phase vote against a local OpenAI-compatible
server (structured choice, think noise, 429/500 retries, concurrency cap, cache, outage), the
eval command, and the stage on real NATS (once per commit; outages never label)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from faststream.nats import NatsBroker
from typer.testing import CliRunner

from cppperf.cli import app
from cppperf.services.classifier import app as classifier_app
from cppperf.services.classifier.heuristic import score_commit
from cppperf.services.classifier.prefilter import prefilter
from cppperf.services.classifier.prompts import budget_diff
from cppperf.services.classifier.service import Classifier, MemoryCache
from cppperf.shared import messages as m
from cppperf.shared.errors import ServiceUnavailable
from cppperf.shared.llm import ChatClient, parse_label
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import ClassifierSettings, load_settings
from tests.conftest import SHARED_DATA
from tests.fake_openai import FakeOpenAI

LABELS = SHARED_DATA / "commit-labels" / "dev.jsonl"

DIFF = "diff --git a/s.cpp b/s.cpp\n--- a/s.cpp\n+++ b/s.cpp\n@@ -1 +1 @@\n-  v.push_back(x);\n+  v.reserve(n);\n"


def commit(sha: str = "1" * 40, message: str = "Speed up the parser by avoiding copies") -> m.CommitSelected:
    return m.CommitSelected(
        repo="o/r", url="", sha=sha, parent="0" * 40, date="2024-01-01", message=message, diff=DIFF
    )


def llm_settings(url: str, **kw: object) -> ClassifierSettings:
    return load_settings(
        env={},
        classifier={
            "backend": "openai",
            "base_urls": [url],
            "models": ["m1", "m2"],
            "retries": 3,
            "cascade": False,  # these tests are about the vote itself; tests/unit/test_classifier_cascade.py
            **kw,
        },
    ).classifier


# ------------------------------------------------------------------ rules
def test_heuristic_scores_and_explains() -> None:
    pos = score_commit("Speed up hash lookup 2x by avoiding allocations", "", DIFF)
    assert pos.label and pos.score >= 2 and any("perf-word" in e for e in pos.evidence)
    neg = score_commit("Fix typo in documentation comment", "", DIFF)
    assert not neg.label
    assert score_commit(
        "Update foo.cpp", "the loop was slow; this makes it faster", ""
    ).label  # issue text counts


def test_prefilter_drops_only_clear_non_performance_work() -> None:
    comment_only = "--- a/x.cpp\n+++ b/x.cpp\n@@ -1 +1 @@\n-// old comment\n+// new comment\n"
    assert not prefilter("Improve docs", comment_only).keep
    moved = "--- a/x.cpp\n+++ b/x.cpp\n@@\n-int a;\n-int b;\n+int b;\n+    int a;\n"
    assert not prefilter("Reorder", moved).keep
    bump = '--- a/v.h\n+++ b/v.h\n@@\n-#define LIB_VERSION "1.2.3"\n+#define LIB_VERSION "1.2.4"\n'
    assert not prefilter("Bump version to 1.2.4", bump).keep
    assert prefilter("Speed up", DIFF).keep
    assert prefilter("Bump version and optimise", DIFF).keep


@pytest.mark.skipif(not LABELS.exists(), reason="../shared (hand-over folder) not present")
def test_prefilter_recall_on_labelled_commits() -> None:
    rows = [json.loads(x) for x in LABELS.read_text().splitlines()]
    positives = [r for r in rows if r["manual_label"]]
    kept = sum(prefilter(r["message"], r["diff"]).keep for r in positives)
    assert kept / len(positives) >= 0.95
    assert sum(not prefilter(r["message"], r["diff"]).keep for r in rows) > 0  # it does prune something


def test_parse_label_is_robust() -> None:
    assert parse_label("<think>No, wait... maybe</think>\n**Yes.**", ["Yes", "No", "Maybe"]) == "Yes"
    assert parse_label("  no  ", ["Yes", "No"]) == "No"
    assert parse_label("<think>unfinished", ["Yes", "No"]) is None


def test_budget_diff_is_fair_and_marks_cuts() -> None:
    small = "diff --git a/a b/a\n" + "+a\n" * 10
    big = "diff --git a/b b/b\n" + "+" + "b" * 20000 + "\n"
    out = budget_diff(small + big, 1000)
    assert small in out  # the small file is kept whole
    assert "characters of this file cut" in out
    assert len(out) < 4000 + 200


# ------------------------------------------------------------------ vote against a real HTTP server
async def test_two_phase_agreement_and_tiebreak() -> None:
    def answer(model: str, prompt: str) -> str:
        if "Diff:" in prompt:
            return "Yes"
        if "agree" in prompt:
            return "Yes"
        return "Yes" if model == "m1" else "Maybe"

    with FakeOpenAI(answer) as srv:
        clf = Classifier.create(llm_settings(srv.url, prefilter=False))
        agreed = await clf.classify(commit("a" * 40, "we agree: faster"), DIFF)
        assert (agreed.label, agreed.phase, len(srv.requests)) == (True, 1, 2)
        split = await clf.classify(commit("b" * 40, "split vote"), DIFF)
        assert (split.label, split.phase) == (True, 2)
        assert [v.answer for v in split.votes] == ["Yes", "Maybe", "Yes"]
        phase2 = srv.requests[-1]
        assert phase2["model"] == "m2" and "v.reserve(n)" in phase2["messages"][-1]["content"]
        assert phase2["temperature"] == 0 and phase2["structured_outputs"] == {"choice": ["Yes", "No"]}
        # cache: asking again sends nothing
        before = len(srv.requests)
        again = await clf.classify(commit("b" * 40, "split vote"), DIFF)
        assert again.label and len(srv.requests) == before and clf.cache_hits == 1
        await clf.close()


async def test_both_no_is_negative_without_phase_two() -> None:
    with FakeOpenAI(lambda _m, _p: "No") as srv:
        clf = Classifier.create(llm_settings(srv.url))
        res = await clf.classify(commit(), DIFF)
        assert (res.label, res.phase, len(srv.requests)) == (False, 1, 2)
        await clf.close()


async def test_think_noise_without_structured_outputs() -> None:
    with FakeOpenAI(lambda _m, _p: "<think>Is it No? Hmm.</think>\nYes.") as srv:
        srv.structured = False
        client = ChatClient(srv.url, retries=0)
        ans = await client.ask("m1", "sys", "prompt", ["Yes", "No", "Maybe"])
        assert ans.label == "Yes"
        await client.close()


async def test_retries_on_429_and_500() -> None:
    with FakeOpenAI(lambda _m, _p: "Yes") as srv:
        srv.failures = [429, 500, 503]
        client = ChatClient(srv.url, retries=4, backoff=0.01)
        ans = await client.ask("m1", "sys", "p", ["Yes", "No"])
        assert ans.label == "Yes" and len(srv.requests) == 4
        await client.close()


async def test_concurrency_is_capped_per_model() -> None:
    """At most 3 requests in flight, and more than one (each held 0.5 s: long enough to overlap
    on a build node's loaded cores, where 0.15 s once let them through one at a time)."""
    with FakeOpenAI(lambda _m, _p: "No") as srv:
        srv.delay = 0.5
        client = ChatClient(srv.url, max_concurrency=3)
        await asyncio.gather(*(client.ask("m1", "s", f"p{i}", ["Yes", "No"]) for i in range(9)))
        assert 2 <= srv.max_in_flight <= 3
        await client.close()


async def test_outage_raises_service_unavailable_and_labels_nothing() -> None:
    with FakeOpenAI(lambda _m, _p: "Yes") as srv:
        srv.always_fail = 500
        cache = MemoryCache()
        clf = Classifier.create(llm_settings(srv.url, retries=1), cache)
        clf.asker.clients["m1"].backoff = 0.01  # type: ignore[union-attr]
        with pytest.raises(ServiceUnavailable):
            await clf.classify(commit(), DIFF)
        assert cache.data == {}
        await clf.close()


# ------------------------------------------------------------------ eval command
def test_classify_eval_command(tmp_path: Path) -> None:
    labels = tmp_path / "labels.jsonl"
    rows = [
        {"message": "Speed up lookup by caching the hash", "diff": DIFF, "manual_label": True},
        {
            "message": "Fix typo in comment",
            "diff": "--- a\n+++ b\n-// tpyo\n+// typo\n",
            "manual_label": False,
        },
        {"message": "Add new option", "diff": DIFF, "manual_label": False},
        {"message": "Update foo.cpp", "diff": DIFF, "manual_label": True},
    ]
    labels.write_text("\n".join(json.dumps(r) for r in rows))
    res = CliRunner().invoke(app, ["classify", "eval", "--labels", str(labels), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert (rep["tp"], rep["fp"], rep["fn"], rep["tn"]) == (1, 0, 1, 2)
    assert rep["precision"] == 1.0 and rep["recall"] == 0.5
    assert rep["prefilter_pruned_share"] == 0.25 and rep["prefilter_recall"] == 1.0
    text = CliRunner().invoke(app, ["classify", "eval", "--labels", str(labels)])
    assert "precision 1.000" in text.stdout and "recall 0.500" in text.stdout


# ------------------------------------------------------------------ on the bus
@pytest.mark.nats
async def test_classifier_service_once_per_commit_and_nak_on_outage(ctx: ServiceContext) -> None:
    with FakeOpenAI(lambda _m, _p: "Yes") as srv:
        srv.always_fail = 503
        ctx.settings.classifier = llm_settings(srv.url, retries=0)
        ctx.bus.settings.nak_delay = 1.0  # attempts at 0 s, 1 s, 3 s, ...: the outage below is shorter
        broker = NatsBroker(ctx.settings.nats_url, logger=None)
        classifier_app.register(broker, ctx)
        await broker.start()
        try:
            for i in range(3):
                await ctx.bus.publish(m.COMMIT_SELECTED, commit(str(i) * 40))
            await ctx.bus.publish(m.COMMIT_SELECTED, commit("0" * 40))  # duplicate id
            await asyncio.sleep(1.0)
            assert (await ctx.bus.js.stream_info("COMMIT_CLASSIFIED")).state.messages == 0
            assert await ctx.bus.dead_letters() == []
            srv.always_fail = None  # the server comes back
            deadline = time.monotonic() + 30
            while (await ctx.bus.js.stream_info("COMMIT_CLASSIFIED")).state.messages < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
        finally:
            await broker.stop()
    assert (await ctx.bus.js.stream_info("COMMIT_CLASSIFIED")).state.messages == 3
    for i in range(3):
        rec = await ctx.store.get("commits", f"o/r@{str(i) * 40}")
        assert rec is not None and rec["label"] is True and rec["phase"] == 1


def test_vllm_backend_without_the_gpu_extra_is_a_clear_error() -> None:
    import importlib.util

    from cppperf.shared.errors import ConfigError

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(ConfigError, match=r"cppperf\[gpu\]"):
        Classifier.create(load_settings(env={}, classifier={"backend": "vllm"}).classifier)
