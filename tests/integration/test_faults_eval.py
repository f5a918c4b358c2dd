"""Faults in the evaluator's stored state, on a real nats-server (the `ctx` fixture), with stand-ins
only for the slow work (an evaluation, a gold validation):

- a stored evaluation that cannot be read (its KV value corrupt, its report's blob gone): the
  request is evaluated again and its record rewritten; the agent's `submit` queues it (a fresh
  dedup id: the first submit's would be a duplicate, answered `queued` with nothing queued),
  `result` says what is wrong in one line, `results` lists the rest of the run;
- an instance record that cannot be read when an agent's request is evaluated: the agent gets a
  verdict (`unknown-instance`), not silence (a dead letter it never sees);
- a validated instance whose record changes or is deleted while it is validated: the validation
  of the old record never overwrites the new one nor brings a deleted one back.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.js.errors import NotFoundError
from structlog.testing import capture_logs

from cppperf.services.evaluator import gateway
from cppperf.services.evaluator.handlers import on_request, on_validate
from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.bus import WORK_QUEUES
from cppperf.shared.domain import (
    EvalReport,
    EvalVerdict,
    InstanceRecord,
    InstanceState,
    Oracle,
    Stage,
    Verdict,
)
from cppperf.shared.errors import TransientError
from cppperf.shared.service import ServiceContext
from cppperf.shared.store import encode_key, instance_record
from tests.integration.test_bus_auth import FakeOps
from tests.integration.test_validate_bus import IID, RECORD, FakeValidator

pytestmark = pytest.mark.nats
AGENT = "bob"
INSTANCES_BUCKET = buckets.INSTANCES


def request(patch: str, run_id: str = "r", model: str = "m") -> m.EvalRequested:
    eid = m.evaluation_id(m.agent_run(AGENT, run_id), model, IID)
    return m.EvalRequested(
        request_id=eid, agent=AGENT, run_id=run_id, model=model, instance_id=IID, patch=patch
    )


async def proven_instance(ctx: ServiceContext) -> None:
    state = InstanceState(stage=Stage.BUILT, verdict=Verdict.IMPROVED, record=json.dumps(RECORD))
    await buckets.put(ctx.store, INSTANCES_BUCKET, IID, state)


async def corrupt(ctx: ServiceContext, eid: str, how: str) -> None:
    """Break the stored evaluation `eid`: its KV value not JSON, or its report's blob gone."""
    if how == "value":
        kv = await ctx.bus.js.key_value("evaluations")
        await kv.put(encode_key(eid), b"{not json")
        return
    state = await buckets.get(ctx.store, buckets.EVALUATIONS, eid)
    assert state is not None
    gone = msgspec.structs.replace(
        state, report="", report_ref="report/gone-" + hashlib.sha256(eid.encode()).hexdigest()
    )
    await buckets.put(ctx.store, buckets.EVALUATIONS, eid, gone)


async def queued(ctx: ServiceContext) -> int:
    stream = WORK_QUEUES[m.EVAL_REQUESTED].stream
    return int((await ctx.bus.js.stream_info(stream)).state.messages)


@pytest.mark.parametrize("how", ["value", "blob"])
async def test_an_unreadable_stored_evaluation_is_evaluated_again_not_stuck(
    ctx: ServiceContext, how: str
) -> None:
    """The record of an evaluation is read on every redelivery, `submit`, `result` and `results`.
    One that could not be read (a corrupt value: msgspec's decode error; a report whose blob is
    gone: BadInput) made a redelivery a dead letter the agent never sees (or a retry loop), and
    every `submit`, `result` of it and `results` of its whole run a refusal "ask again", for
    good: the id could never be evaluated again."""
    await proven_instance(ctx)
    ops = FakeOps()
    first, other = request("fast a"), request("slow", model="m2")
    assert await on_request(ctx, ops, first) == "evaluated"
    assert await on_request(ctx, ops, other) == "evaluated"
    await corrupt(ctx, first.id, how)

    # the agent's side: one clear line, the run's other rows, and the id can be asked again
    answer = await gateway.result(ctx, AGENT, m.encode(m.AgentQuery(id=first.id)))
    if how == "value":  # nothing known of it: one line saying what to do
        assert not answer.ok and "unreadable" in answer.error and "submit" in answer.error, answer
    else:  # its verdict is in the record: answered as a report that is not JSON is
        assert answer.ok and (answer.result or {})["reason"] == gateway.UNREADABLE_REPORT, answer
    rows = await gateway.results(ctx, AGENT, m.encode(m.AgentQuery(run_id="r")))
    listed = [first.id, other.id] if how == "blob" else [other.id]  # (the run's other row, always)
    assert rows.ok and [r["id"] for r in rows.results or []] == listed, rows
    before = await queued(ctx)
    body = m.encode(m.AgentSubmit(instance_id=IID, patch="fast a", run_id="r", model="m"))
    sent = await gateway.submit(ctx, AGENT, body)
    assert sent.ok and sent.status == "queued" and not sent.duplicate, sent
    assert await queued(ctx) == before + 1  # really queued, not dropped as the first submit's duplicate

    # the worker's side (a redelivery, or the request just queued): evaluated again, rewritten
    assert await on_request(ctx, ops, first) == "evaluated"
    assert [r.patch for r in ops.ran] == ["fast a", "slow", "fast a"]
    done = await gateway.result(ctx, AGENT, m.encode(m.AgentQuery(id=first.id)))
    assert done.ok and done.status == "done" and (done.result or {})["verdict"] == "opt", done


async def test_an_unreadable_instance_record_answers_the_agent(ctx: ServiceContext) -> None:
    """An agent's request for an instance whose stored record does not decode was BadInput: a
    dead letter, no announcement, no record, so `result` said `pending` for ever."""
    await buckets.put(
        ctx.store, INSTANCES_BUCKET, IID, InstanceState(verdict=Verdict.IMPROVED, record='{"metadata": {}}')
    )
    ops = FakeOps()
    req = request("fast")
    assert await on_request(ctx, ops, req) == "evaluated"
    assert ops.ran == []  # nothing to grade on
    done = await gateway.result(ctx, AGENT, m.encode(m.AgentQuery(id=req.id)))
    assert done.ok and done.status == "done", done
    report = done.result or {}
    assert report["verdict"] == EvalVerdict.UNKNOWN_INSTANCE and "metadata" not in report["reason"], report


class MidFlight(FakeValidator):
    """A validation during which `meanwhile` runs on the event loop (a rebuild, a removal)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, meanwhile: Callable[[], Any]) -> None:
        super().__init__()
        self.loop, self.meanwhile = loop, meanwhile

    def validate(self, record: InstanceRecord, *, force: bool) -> InstanceRecord:
        if len(self.ran) == 0:  # only the first validation is overtaken
            asyncio.run_coroutine_threadsafe(self.meanwhile(), self.loop).result(timeout=10)
        return super().validate(record, force=force)


async def test_a_record_rebuilt_during_its_validation_is_not_overwritten(ctx: ServiceContext) -> None:
    """Gold validation takes two evaluations (minutes); the builder may store a new record of the
    instance meanwhile (a rebuild). The validation wrote the old record with its validation over
    the new one (compare-and-set on the key, but of fields read before the validation): the
    rebuild was lost. Now the new record stays and the request is retried, validating it."""
    await proven_instance(ctx)
    rebuilt = json.loads(json.dumps(RECORD))
    rebuilt["commit_info"]["patch"] = ["rebuilt"]

    async def rebuild() -> None:
        state = InstanceState(stage=Stage.BUILT, verdict=Verdict.IMPROVED, record=json.dumps(rebuilt))
        await buckets.put(ctx.store, INSTANCES_BUCKET, IID, state)

    ops = MidFlight(asyncio.get_running_loop(), rebuild)
    with pytest.raises(TransientError, match="changed"):
        await on_validate(ctx, ops, m.ValidateRequested(instance_id=IID))
    record = await instance_record(ctx.store, IID)
    assert record is not None and record.commit_info.patch == ["rebuilt"]
    assert await on_validate(ctx, ops, m.ValidateRequested(instance_id=IID)) == "validated"  # the retry
    record = await instance_record(ctx.store, IID)
    assert record is not None and record.commit_info.patch == ["rebuilt"] and record.cppperf.oracle == "ctest"
    state = await buckets.get(ctx.store, INSTANCES_BUCKET, IID)
    assert state is not None and state.oracle == Oracle.CTEST


async def test_a_record_removed_during_its_validation_is_not_brought_back(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    """An instance removed while it is validated came back as a half record (the validated
    record and `oracle`, without `stage` or `verdict`). Now it stays removed; the retry is an
    unknown instance (a dead letter with that reason)."""
    await proven_instance(ctx)

    async def remove() -> None:
        await ctx.store.delete(INSTANCES_BUCKET.name, IID)

    ops = MidFlight(asyncio.get_running_loop(), remove)
    with pytest.raises(TransientError, match="changed"):
        await on_validate(ctx, ops, m.ValidateRequested(instance_id=IID))
    assert await ctx.store.get(INSTANCES_BUCKET.name, IID) is None
    assert not (Path(ctx.settings.out_dir) / "instances" / f"{IID}.json").exists()


class Racing(FakeOps):
    """Two evaluations of one request at once (a redelivery to a second replica while the first
    still works: its heartbeats lost in an outage longer than `ack_wait`); timing noise gives
    them different verdicts: the first to start `opt`; the second `correct`, recorded first."""

    def __init__(self, ctx: ServiceContext, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.ctx, self.loop = ctx, loop
        self.both = threading.Barrier(2, timeout=10)
        self.lock = threading.Lock()

    def recorded(self, eid: str) -> bool:
        found = asyncio.run_coroutine_threadsafe(self.ctx.store.get("evaluations", eid), self.loop)
        return found.result(timeout=10) is not None

    def evaluate(self, req: Any, instance: Any) -> EvalReport:
        with self.lock:
            report = super().evaluate(req, instance)
            first = len(self.ran) == 1
        self.both.wait()
        if not first:
            return msgspec.structs.replace(report, verdict=EvalVerdict.CORRECT, opt=False)
        while not self.recorded(req.id):  # the second's record is written before this one ends
            time.sleep(0.01)
        return report


async def live_objects(ctx: ServiceContext) -> list[str]:
    """The names of the objects in the object store (not deleted)."""
    try:
        objects = await (await ctx.bus.js.object_store("blobs")).list(ignore_deletes=True)
    except NotFoundError:  # nats-py's answer for an empty store
        return []
    return [o.name for o in objects if not o.deleted and o.name]


async def announcements(ctx: ServiceContext) -> list[str]:
    """The verdicts announced on `eval.completed.bob`, in order."""
    sub = await ctx.bus.js.subscribe(m.eval_completed_subject(AGENT), ordered_consumer=True)
    verdicts: list[str] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                return verdicts
            verdicts.append(json.loads(msg.data)["verdict"])
    finally:
        await sub.unsubscribe()


async def test_two_evaluations_of_one_request_at_once_give_the_agent_one_verdict(ctx: ServiceContext) -> None:
    """Both wrote their record (the last one stays) and announced under ids of their own: the agent
    got `correct`, then `opt`, and `result` changed its answer after the fact. The record is now
    written only over the state read before the evaluation: the later one finds the first one's
    record of the same patch, answers from it (its announcement id: deduplicated) and writes nothing."""
    await proven_instance(ctx)
    ops = Racing(ctx, asyncio.get_running_loop())
    req = request("fast")
    outcomes = await asyncio.gather(on_request(ctx, ops, req), on_request(ctx, ops, req))
    assert sorted(outcomes) == ["answered-from-store", "evaluated"]
    assert await announcements(ctx) == ["correct"]
    done = await gateway.result(ctx, AGENT, m.encode(m.AgentQuery(id=req.id)))
    assert (done.result or {})["verdict"] == "correct", done


# ----------------------------------------------------------------- SIGKILL around the announcement
ROOT = Path(__file__).resolve().parents[2]


def spawn_evaluator(url: str, tmp: Path, kill: str) -> subprocess.Popen[bytes]:
    markers = tmp / "markers"
    markers.mkdir(exist_ok=True)
    overrides = {
        "out_dir": str(tmp / "out"),
        "health_dir": str(tmp / "health"),
        "bus": {
            "ack_wait": 2.0,
            "max_deliver": 5,
            "nak_delay": 0.2,
            "stop_grace": 1.0,
            "health_interval": 0.5,
        },
        "builder": {"work_dir": str(tmp / "work")},
        "evaluator": {"runs_dir": str(tmp / "runs")},
    }
    with (markers / f"log-{kill}.txt").open("wb") as log:  # the child has its own copy of the fd
        return subprocess.Popen(
            [sys.executable, "-m", "tests.eval_fault_worker", url, str(markers), kill, json.dumps(overrides)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


async def eventually(cond: Callable[[], Any], timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while not await cond():
            await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["before-announce", "after-announce"])
async def test_an_evaluator_killed_around_the_announcement_answers_once(
    ctx: ServiceContext, tmp_path: Path, kill: str
) -> None:
    """SIGKILL after the record is written, before (or after) the announcement, never acked: the
    request comes back after `ack_wait` to another evaluator, which answers from the record (not
    evaluated again: the record's `worker` stays the dead one) under the record's announcement id:
    one announcement, the record's verdict."""
    await proven_instance(ctx)
    req = request("fast")
    stale = tmp_path / "work" / "eval" / f"{'0' * 16}-{'0' * 12}"  # an earlier evaluator's, killed
    stale.mkdir(parents=True)
    (stale.parent / f"{stale.name}.lock").touch()
    procs = []
    try:
        procs.append(first := spawn_evaluator(ctx.settings.nats_url, tmp_path, kill))
        await eventually(lambda: _exists(tmp_path / "markers" / f"ready-{first.pid}"), timeout=180)
        await ctx.bus.publish(m.eval_requested_subject(AGENT), req, msg_id="kill-test")
        await eventually(lambda: _exited(first), timeout=120)
        assert first.returncode == -signal.SIGKILL
        recorded = await ctx.store.get("evaluations", req.id)
        assert recorded is not None and recorded["worker"].endswith(f":{first.pid}")
        assert await announcements(ctx) == ([] if kill == "before-announce" else ["opt"])
        procs.append(second := spawn_evaluator(ctx.settings.nats_url, tmp_path, "none"))
        await eventually(lambda: _drained(ctx), timeout=180)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert second.pid != first.pid
    assert await announcements(ctx) == ["opt"]
    again = await ctx.store.get("evaluations", req.id)
    assert again == recorded  # answered from it, not evaluated again
    assert not stale.exists()  # removed when the evaluator started


async def _exists(path: Path) -> bool:
    return path.exists()


async def _exited(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


async def _drained(ctx: ServiceContext) -> bool:
    return await queued(ctx) == 0


# ------------------------------------------------------------------ workspaces of dead evaluators
HOLD = """
import sys, time
from pathlib import Path
from cppperf.services.evaluator.pipeline import in_use
ws = Path(sys.argv[1])
with in_use(ws):
    ws.mkdir()
    (ws / "tree").write_text("built")
    Path(sys.argv[2]).write_text("")
    time.sleep(120)
"""


def hold(ws: Path, ready: Path) -> subprocess.Popen[bytes]:
    """A process evaluating in `ws` (its lock held) until it is killed."""
    return subprocess.Popen([sys.executable, "-c", HOLD, str(ws), str(ready)], cwd=ROOT)


async def test_only_workspaces_of_dead_evaluators_are_removed(tmp_path: Path) -> None:
    """Each evaluation has a folder of its own with a random suffix, so one left by an evaluator
    killed mid-evaluation was never reused nor removed. At start the evaluator removes those
    whose lock nobody holds; never one in use by another process sharing the work dir or by this
    process, nor one kept on purpose (`evaluator.keep_failed`, `builder.keep`: no lock file)."""
    from cppperf.services.evaluator.pipeline import in_use, remove_stale_workspaces
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, builder={"work_dir": str(tmp_path / "work")})
    root = settings.work_dir() / "eval"
    dead, alive, kept, mine = (root / f"{n}-{'0' * 12}" for n in ("dead", "alive", "kept", "mine"))
    procs = [hold(dead, tmp_path / "dead.ready"), hold(alive, tmp_path / "alive.ready")]
    try:
        await eventually(lambda: _exists(tmp_path / "dead.ready"))
        await eventually(lambda: _exists(tmp_path / "alive.ready"))
        procs[0].kill()  # SIGKILL mid-evaluation: the kernel drops its lock, the folder stays
        procs[0].wait()
        kept.mkdir(parents=True)
        with in_use(mine):
            mine.mkdir()
            assert remove_stale_workspaces(settings) == [dead]
            assert not dead.exists() and not (root / f"{dead.name}.lock").exists()
            assert alive.is_dir() and kept.is_dir() and mine.is_dir()
        assert not (root / f"{mine.name}.lock").exists()  # the end of its use removes the lock file
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert remove_stale_workspaces(settings) == [alive]  # its evaluator is dead now too


def test_a_stale_workspace_that_cannot_be_removed_does_not_stop_the_evaluator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleanup runs at the evaluator's start: a work dir it cannot write (read-only, a broken
    disk) must be one log line, not an evaluator that never starts."""
    from cppperf.services.evaluator.pipeline import remove_stale_workspaces
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, builder={"work_dir": str(tmp_path / "work")})
    lock = settings.work_dir() / "eval" / f"{'0' * 16}-{'0' * 12}.lock"
    lock.parent.mkdir(parents=True)
    lock.touch()

    def read_only(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(30, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    with capture_logs() as logs:
        assert remove_stale_workspaces(settings) == []
    assert [e["event"] for e in logs] == ["stale_workspace_not_removed"]


class RacingLarge(Racing):
    """`Racing` with reports over the inline limit: each goes to the object store."""

    def evaluate(self, req: Any, instance: Any) -> EvalReport:
        report = super().evaluate(req, instance)
        return msgspec.structs.replace(report, reason=f"{report.verdict} " + "x" * 300_000)


async def test_a_large_report_of_an_evaluation_that_lost_the_race_does_not_replace_the_kept_one(
    ctx: ServiceContext,
) -> None:
    """A report over the inline limit went to the object store as `report/<id>`, one name per
    id, written before the record: the second evaluation of a request (`Racing`) overwrote the
    first's report under the first's record — the record `correct`, its report `opt`'s. Each
    evaluation's report now has an object of its own."""
    await proven_instance(ctx)
    ops = RacingLarge(ctx, asyncio.get_running_loop())
    req = request("fast")
    await asyncio.gather(on_request(ctx, ops, req), on_request(ctx, ops, req))
    state = await buckets.get(ctx.store, buckets.EVALUATIONS, req.id)
    assert state is not None and state.report_ref and state.verdict == "correct"
    report = json.loads(await ctx.store.resolve_text(state.report, state.report_ref))
    assert report["verdict"] == "correct" and report["reason"].startswith("correct "), report["verdict"]
    assert await announcements(ctx) == ["correct"]
    assert await live_objects(ctx) == [state.report_ref]  # the other evaluation's report: removed


class Large(FakeOps):
    def evaluate(self, req: Any, instance: Any) -> EvalReport:
        return msgspec.structs.replace(super().evaluate(req, instance), reason="x" * 300_000)


async def test_a_replaced_evaluation_s_large_report_is_removed(ctx: ServiceContext) -> None:
    """One id, patch after patch: each evaluation replaces the record, and the report object of
    the one it replaced was left behind, named by nothing — an agent could fill the object store
    (every service's) by resubmitting one id. Only the kept record's object remains."""
    await proven_instance(ctx)
    ops = Large()
    kept: list[str] = []
    for patch in ("fast", "slow", "fast2"):
        assert await on_request(ctx, ops, request(patch)) == "evaluated"
        state = await buckets.get(ctx.store, buckets.EVALUATIONS, request(patch).id)
        assert state is not None and state.report_ref
        kept.append(state.report_ref)
        assert await live_objects(ctx) == [state.report_ref]
    assert len(set(kept)) == 3  # each evaluation's own object, the earlier ones removed


async def test_a_full_evaluations_bucket_writes_nothing_and_the_retry_answers_once(
    ctx: ServiceContext,
) -> None:
    """`evaluations` at its `max_bytes` (discard new) when a record is stored: the attempt fails
    (the worker retries it) with nothing half-written — no record, no announcement, and its large
    report's object (one per attempt) removed; once there is room the retry records and
    announces it once."""
    await proven_instance(ctx)
    config = (await ctx.bus.js.stream_info("KV_evaluations")).config
    config.max_bytes = 4096
    await ctx.bus.js.update_stream(config)
    kv = await ctx.bus.js.key_value("evaluations")
    await kv.put("filler", b"x" * 3900)
    req = request("fast")
    with pytest.raises(Exception, match="maximum bytes"):
        await on_request(ctx, Large(), req)
    assert await ctx.store.get("evaluations", req.id) is None
    assert await announcements(ctx) == []
    assert await live_objects(ctx) == []
    config.max_bytes = -1
    await ctx.bus.js.update_stream(config)
    assert await on_request(ctx, Large(), req) == "evaluated"
    assert await announcements(ctx) == ["opt"]


async def dead_letter_next(ctx: ServiceContext) -> None:
    """Take the agent's next queued request off the work queue as the worker does when it gives
    up on it (`term`, after writing its dead letter)."""
    stream = WORK_QUEUES[m.EVAL_REQUESTED].stream
    sub = await ctx.bus.js.pull_subscribe(
        m.eval_requested_subject(AGENT), durable="faults-eval", stream=stream
    )
    try:
        (msg,) = await sub.fetch(1, timeout=5)
        await msg.term()
        await eventually(lambda: _drained(ctx), timeout=10)  # the term is asynchronous
    finally:
        await sub.unsubscribe()
        await ctx.bus.js.delete_consumer(stream, "faults-eval")


async def test_a_dead_lettered_request_is_not_pending_for_ever_and_can_be_sent_again(
    ctx: ServiceContext,
) -> None:
    """A request the evaluator gave up on (a dead letter: `bus.max_deliver` failures, a full
    bucket) left the agent with `result` answering `pending` for ever (`wait` polled for ever),
    and sending it again was a duplicate of the dead one (the same dedup id for JetStream's 24 h
    window): `queued`, with nothing queued. Now `result` says `lost` (the client raises with the
    line) and a submit of it queues it again."""
    await proven_instance(ctx)
    body = m.encode(m.AgentSubmit(instance_id=IID, patch="fast", run_id="r", model="m"))
    sent = await gateway.submit(ctx, AGENT, body)
    assert sent.ok and sent.status == "queued" and not sent.duplicate
    ask = m.encode(m.AgentQuery(id=sent.id))
    assert (await gateway.result(ctx, AGENT, ask)).status == "pending"  # queued: it is
    await dead_letter_next(ctx)
    lost = await gateway.result(ctx, AGENT, ask)
    assert lost.ok and lost.status == "lost" and "submit it again" in lost.error, lost
    again = await gateway.submit(ctx, AGENT, body)
    assert again.ok and again.status == "queued" and not again.duplicate, again
    assert await queued(ctx) == 1
    assert (await gateway.result(ctx, AGENT, ask)).status == "pending"
    twice = await gateway.submit(ctx, AGENT, body)  # while it is queued: the duplicate it is
    assert twice.duplicate and await queued(ctx) == 1


async def test_a_third_patch_recorded_while_a_replacement_is_written_is_not_lost_unseen(
    ctx: ServiceContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One id, three patches at once: `a` evaluates while `b` is recorded; `a` finds `b`'s record
    and replaces it — and `c` is recorded between that read and `a`'s write. The write was
    unconditional: `c`'s record overwritten unseen and its report object named by nothing. It is
    compare-and-set again: `a` replaces `c`'s record as read, and `c`'s object is removed."""
    from cppperf.services.evaluator import handlers

    await proven_instance(ctx)
    loop = asyncio.get_running_loop()
    armed: list[bool] = []
    read_prior = handlers._prior

    async def prior_then_c(c: ServiceContext, eid: str) -> Any:
        got = await read_prior(c, eid)
        if armed:  # `a`'s read after `b` recorded: `c` is recorded before `a` writes
            armed.clear()
            assert await on_request(ctx, Large(), request("c")) == "evaluated"
        return got

    class WhileA(Large):
        def evaluate(self, req: Any, instance: Any) -> EvalReport:
            done = asyncio.run_coroutine_threadsafe(on_request(ctx, Large(), request("b")), loop)
            assert done.result(timeout=60) == "evaluated"
            armed.append(True)
            return super().evaluate(req, instance)

    monkeypatch.setattr(handlers, "_prior", prior_then_c)
    assert await on_request(ctx, WhileA(), request("a")) == "evaluated"
    assert not armed  # `c` was recorded in between
    state = await buckets.get(ctx.store, buckets.EVALUATIONS, request("a").id)
    assert state is not None and state.report_ref
    report = json.loads(await ctx.store.resolve_text(state.report, state.report_ref))
    assert report["patch_sha256"] == hashlib.sha256(b"a").hexdigest()
    assert await live_objects(ctx) == [state.report_ref]  # `b`'s and `c`'s objects removed


async def test_a_result_read_while_its_record_is_replaced_is_the_new_report_not_unreadable(
    ctx: ServiceContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`result` read the record, then its report object — removed meanwhile by a later patch's
    evaluation of the id (its record replaced): the agent was told "the stored report is
    unreadable". The record is read again: the agent gets the later patch's report."""
    await proven_instance(ctx)
    assert await on_request(ctx, Large(), request("slow")) == "evaluated"
    read_state = gateway._state
    replaced: list[bool] = []

    async def state_then_replaced(c: ServiceContext, eid: str) -> Any:
        got = await read_state(c, eid)
        if not replaced:  # the first read: a later patch replaces the record before the report is read
            replaced.append(True)
            assert await on_request(ctx, Large(), request("fast")) == "evaluated"
        return got

    monkeypatch.setattr(gateway, "_state", state_then_replaced)
    done = await gateway.result(ctx, AGENT, m.encode(m.AgentQuery(id=request("fast").id)))
    assert replaced and done.ok, done
    result = done.result or {}
    assert result["verdict"] == "opt" and result["reason"].startswith("x"), result.get("reason", "")[:80]
