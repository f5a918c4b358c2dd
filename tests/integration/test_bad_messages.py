"""Messages of the right shape that can never succeed: a payload reference the object store does
not hold, an instance id that is a path. On a real nats-server, each is dead-lettered at the first
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
