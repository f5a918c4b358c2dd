"""Messages of the right shape that can never succeed: a payload reference the object store does
not hold, an instance id that is a path, a repository name with a NUL, a sha that is an option, a
run id that cannot name its folder. On a real nats-server, each is dead-lettered at the first
delivery with the reason (never retried `bus.max_deliver` times as if the store were down); the
handlers refuse before any file is touched."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
from faststream.nats import NatsBroker

from cppperf.services.classifier.handlers import StoreCache, on_selected
from cppperf.services.classifier.service import Classifier
from cppperf.services.evaluator.handlers import on_validate
from cppperf.services.evaluator.instances import load_instance
from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.buckets import INSTANCES
from cppperf.shared.bus import WORK_QUEUES
from cppperf.shared.domain import InstanceState, Stage, Verdict
from cppperf.shared.errors import BadInput
from cppperf.shared.service import ServiceContext, subscribe
from tests.conftest import make_settings
from tests.fakes import FakeContext, write_bare_instance
from tests.integration.test_faults import consume_all
from tests.integration.test_handlers import commit
from tests.integration.test_validate_bus import RECORD, FakeValidator


async def until(cond: Callable[[], Awaitable[bool]], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def test_store_says_bad_input_for_a_ref_it_does_not_hold(ctx: ServiceContext) -> None:
    ref = await ctx.store.put_blob("diff/there", b"x")
    assert await ctx.store.resolve_text("", ref) == "x"
    with pytest.raises(BadInput, match="'diff/nowhere' is not in the object store"):
        await ctx.store.resolve_text("", "diff/nowhere")


async def test_a_diff_ref_not_in_the_store_is_dead_lettered_at_the_first_delivery(
    ctx: ServiceContext,
) -> None:
    """Before: nats' ObjectNotFoundError was taken for an outage (and a vanished bucket, re-created),
    the commit retried with backoff until `bus.max_deliver`."""
    clf = Classifier.create(ctx.settings.classifier, StoreCache(ctx.store))
    seen: list[str] = []

    async def work(item: m.CommitSelected) -> None:
        seen.append(item.sha)
        await on_selected(ctx, clf, item)

    selected = commit()
    missing = msgspec.structs.replace(selected, diff="", diff_ref="diff/nowhere")
    await ctx.bus.publish(m.COMMIT_SELECTED, missing)
    broker = NatsBroker(ctx.settings.nats_url, logger=None)
    durable = WORK_QUEUES[m.COMMIT_SELECTED].durable
    subscribe(broker, ctx, subject=m.COMMIT_SELECTED, service=durable, typ=m.CommitSelected, work=work)
    await broker.start()
    try:

        async def dead() -> bool:
            return len(await ctx.bus.dead_letters(m.COMMIT_SELECTED)) == 1

        await until(dead)
    finally:
        await broker.stop()
    [rec] = await ctx.bus.dead_letters(m.COMMIT_SELECTED)
    assert rec.letter.attempts == 1 and seen == [selected.sha]
    assert (
        rec.letter.error_type == "BadInput"
        and "'diff/nowhere' is not in the object store" in rec.letter.error
    )
    assert m.decode(rec.letter.payload, m.CommitSelected) == missing
    assert await ctx.store.get("commits", missing.id) is None  # nothing recorded as classified


IID = "o__r-aaaaaaaaaaaa"
UNPROCESSABLE: list[tuple[str, msgspec.Struct, str]] = [
    (m.REPO_FOUND, m.RepoFound(repo="o/r\0x", url="/tmp/r"), "RepoFound.repo: not a repository id"),
    (m.REPO_FOUND, m.RepoFound(repo="o/r/x", url="/tmp/r"), "RepoFound.repo: not a repository id"),
    (m.REPO_FOUND, m.RepoFound(repo="o/..", url="/tmp/r"), "RepoFound.repo: not a repository id"),
    (
        m.REPO_FOUND,
        m.RepoFound(repo="o/r", url="/tmp/r", head_sha="HEAD"),
        "RepoFound.head_sha: not a commit sha",
    ),
    (
        m.REPO_CANDIDATE,
        m.RepoCandidate(repo="noslash", url="/tmp/r"),
        "RepoCandidate.repo: not a repository id",
    ),
    (m.REPO_CANDIDATE, m.RepoCandidate(repo="o/r", url="/tmp/r\0"), "RepoCandidate.url: "),
    (m.REPO_CANDIDATE, m.RepoCandidate(repo="o/" + "n" * 300, url="/tmp/r"), "RepoCandidate.repo: "),
    (
        m.COMMIT_SELECTED,
        msgspec.structs.replace(commit(), sha="--output=/tmp/x"),
        "CommitSelected.sha: not a commit sha",
    ),
    (m.COMMIT_SELECTED, msgspec.structs.replace(commit(), repo="o\n/r"), "CommitSelected.repo: "),
    (
        m.COMMIT_CLASSIFIED,
        m.CommitClassified(
            commit=msgspec.structs.replace(commit(), parent="b" * 39), label=True, backend="h"
        ),
        "CommitClassified.commit.parent: not a commit sha",
    ),
    (
        m.EVAL_REQUESTED,
        m.EvalRequested(request_id="r1", run_id="", model="m", instance_id=IID),
        "EvalRequested.run_id: not a run id",
    ),
    (
        m.EVAL_REQUESTED,
        m.EvalRequested(request_id="r2", run_id="_r", model="m", instance_id=IID),
        "EvalRequested.run_id: not a run id",
    ),
    (
        m.EVAL_REQUESTED,
        m.EvalRequested(request_id="r3", run_id="r", model="m", instance_id=IID, agent="Bob.x"),
        "EvalRequested.agent: not an agent name",
    ),
    (
        m.VALIDATE_REQUESTED,
        m.ValidateRequested(instance_id="../x"),
        "ValidateRequested.instance_id: not an instance id",
    ),
]


async def test_names_and_ids_no_worker_can_process_are_dead_lettered_at_the_first_delivery(
    ctx: ServiceContext,
) -> None:
    """Before: a repository name with a NUL on repo.found reached the filter, whose mirror path
    raised ValueError (embedded null byte), taken for a passing fault and retried
    `bus.max_deliver` times; a sha `--output=…` reached git's command line; run id "" ran as
    the run `model`."""
    for n, (subject, msg, _) in enumerate(UNPROCESSABLE):
        await ctx.bus.publish_raw(subject, m.encode(msg), msg_id=f"bad-{n}")
    seen: list[object] = []

    async def work(item: object) -> None:
        seen.append(item)

    async def all_dead() -> bool:
        return len(await ctx.bus.dead_letters()) == len(UNPROCESSABLE)

    await consume_all(ctx, work, all_dead)
    assert seen == []  # no handler ran
    letters = {rec.letter.msg_id: rec.letter for rec in await ctx.bus.dead_letters()}
    for n, (subject, _, why) in enumerate(UNPROCESSABLE):
        letter = letters[f"bad-{n}"]
        assert (letter.subject, letter.attempts, letter.error_type) == (subject, 1, "MalformedMessage")
        assert letter.error.startswith(why), (why, letter.error)


async def test_every_id_the_pipeline_makes_is_processed(ctx: ServiceContext) -> None:
    """The same subjects with the names and ids producers write (local/<folder>, a folder name
    with a space, full shas, an agent's run) reach the work, none is dead-lettered."""
    good: list[tuple[str, msgspec.Struct]] = [
        (m.REPO_FOUND, m.RepoFound(repo="local/my project", url="/tmp/my project", head_sha="c" * 40)),
        (m.REPO_CANDIDATE, m.RepoCandidate(repo="url/0123456789ab", url="https://example.org/x.git")),
        (m.COMMIT_SELECTED, commit()),
        (
            m.COMMIT_CLASSIFIED,
            m.CommitClassified(
                commit=msgspec.structs.replace(commit(), sha="d" * 64), label=True, backend="h"
            ),
        ),
        (
            m.EVAL_REQUESTED,
            m.EvalRequested(
                request_id="r", run_id="demo.v2", model="org/model", instance_id=IID, agent="bob"
            ),
        ),
        (m.VALIDATE_REQUESTED, m.ValidateRequested(instance_id=IID)),
    ]
    for n, (subject, msg) in enumerate(good):
        await ctx.bus.publish_raw(subject, m.encode(msg), msg_id=f"good-{n}")
    seen: list[object] = []

    async def work(item: object) -> None:
        seen.append(item)

    async def all_seen() -> bool:
        return len(seen) == len(good)

    await consume_all(ctx, work, all_seen)
    assert await ctx.bus.dead_letters() == []
    assert sorted(map(repr, seen)) == sorted(repr(msg) for _, msg in good)


@pytest.mark.parametrize("iid", ["../escaped", "a/b", "x" * 300])
async def test_validate_refuses_an_instance_id_that_is_a_path(tmp_path: Path, iid: str) -> None:
    """A record stored under a path-like key (the KV encodes any key) was exported to
    OUT/instances/<id>.json: `../escaped` wrote OUT/escaped.json, outside the instances folder."""
    fctx = FakeContext(make_settings(tmp_path))
    state = InstanceState(stage=Stage.BUILT, verdict=Verdict.IMPROVED, record=json.dumps(RECORD))
    await buckets.put(fctx.store, INSTANCES, iid, state)
    ops = FakeValidator()
    with pytest.raises(BadInput, match="not an instance id"):
        await on_validate(fctx, ops, m.ValidateRequested(instance_id=iid))
    assert ops.ran == []
    assert not (Path(fctx.settings.out_dir) / "escaped.json").exists()


@pytest.mark.parametrize("iid", ["../out/instances/o__r-aaaaaaaaaaaa", "x" * 300, ""])
def test_the_evaluator_refuses_an_instance_id_that_is_a_path(tmp_path: Path, iid: str) -> None:
    """Before: `../out/instances/<id>` read the record by a path, a 300-byte id was OSError (a
    retry, as if the disk had failed) instead of bad input."""
    out = tmp_path / "out"
    write_bare_instance(out)
    assert load_instance("o__r-aaaaaaaaaaaa", out).instance_id == "o__r-aaaaaaaaaaaa"
    with pytest.raises(BadInput, match="not an instance id"):
        load_instance(iid, out)


def test_the_evaluator_says_why_a_record_is_unreadable(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "instances").mkdir(parents=True)
    (out / "instances" / "o__r-bbbbbbbbbbbb.json").write_bytes(b"\xff\xfe")
    with pytest.raises(BadInput, match="unreadable"):
        load_instance("o__r-bbbbbbbbbbbb", out)


def test_the_evaluator_says_a_record_nested_too_deeply_is_unreadable(tmp_path: Path) -> None:
    """Before: RecursionError, retried as if the machine had failed, then dead-lettered."""
    out = tmp_path / "out"
    (out / "instances").mkdir(parents=True)
    (out / "instances" / "o__r-bbbbbbbbbbbb.json").write_text('{"a":' * 100_000)
    with pytest.raises(BadInput, match="unreadable: JSON nested too deeply"):
        load_instance("o__r-bbbbbbbbbbbb", out)
