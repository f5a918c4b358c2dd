"""Gold validation over the bus: `validate.requested` is the evaluator's (on_validate), its result
the instance's state (the record's `validation`/`oracle` and the KV value's `oracle`); a validated
instance is not validated again (a redelivery or a second request) unless forced; an unknown or
unproven instance is bad input (dead letter with the reason, one line in `cppperf validate`); with
`builder.validate_gold` the builder asks for it after storing an improved instance. On a real
nats-server: the demo's proven perf commit validated by the evaluator service gets `oracle: ctest`
in its stored record, and a second request does not run it again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cppperf.cli.validate import request_validations
from cppperf.runtime import connect, run_services
from cppperf.services.builder.handlers import on_classified, request_validation
from cppperf.services.evaluator import app as evaluator_app
from cppperf.services.evaluator.gold import with_validation
from cppperf.services.evaluator.handlers import PipelineOps, on_validate
from cppperf.services.evaluator.pipeline import EvalRequest
from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.buckets import INSTANCES
from cppperf.shared.domain import (
    EvalReport,
    EvalVerdict,
    InstanceRecord,
    InstanceState,
    Oracle,
    Stage,
    Validation,
    ValidationRun,
    Verdict,
    decode_record,
)
from cppperf.shared.errors import BadInput, CppPerfError
from cppperf.shared.store import instance_record
from tests.conftest import Proven, as_file, make_settings
from tests.fakes import FakeContext
from tests.integration.test_handlers import FakeBuilderOps, commit

IID = "o__r-aaaaaaaaaaaa"
RECORD = {
    "metadata": {"repository_name": "o/r", "repository": "/src/r"},
    "commit_info": {"old_sha": "b" * 40, "new_sha": "a" * 40, "patch": ["diff"], "files_changed": []},
    "tests": {"tests": []},
    "cppperf": {"instance_id": IID, "verdict": "improved"},
}


@dataclass
class FakeValidator:
    """Gold validation stand-in: the oracle it is given, written into the record as gold.py does."""

    oracle: Oracle = Oracle.CTEST
    ran: list[tuple[str, bool]] = field(default_factory=list)

    def validate(self, record: InstanceRecord, *, force: bool) -> InstanceRecord:
        self.ran.append((record.cppperf.instance_id, force))
        block = Validation(
            gold=ValidationRun(verdict=EvalVerdict.OPT, opt=True),
            null=ValidationRun(verdict=EvalVerdict.CORRECT),
            oracle=self.oracle,
            can_grade=self.oracle != Oracle.NONE,
        )
        return with_validation(record, block)

    def evaluate(self, req: EvalRequest, instance: object) -> EvalReport:
        raise AssertionError("no agent evaluation in these tests")


async def stored(fctx: FakeContext, verdict: Verdict = Verdict.IMPROVED) -> None:
    state = InstanceState(stage=Stage.BUILT, verdict=verdict, record=json.dumps(RECORD))
    await buckets.put(fctx.store, INSTANCES, IID, state)


@pytest.fixture
def fctx(tmp_path: Path) -> FakeContext:
    return FakeContext(make_settings(tmp_path))


async def test_validation_lands_in_the_stored_record_and_is_not_redone(fctx: FakeContext) -> None:
    await stored(fctx)
    ops = FakeValidator()
    assert await on_validate(fctx, ops, m.ValidateRequested(instance_id=IID)) == "validated"
    state = await buckets.get(fctx.store, INSTANCES, IID)
    assert state is not None and state.oracle == Oracle.CTEST
    assert state.verdict == Verdict.IMPROVED and state.stage == Stage.BUILT  # the builder's fields stay
    record = await instance_record(fctx.store, IID)
    assert record is not None and record.cppperf.oracle == "ctest"
    assert as_file(record)["commit_info"] == RECORD["commit_info"]
    exported = json.loads((Path(fctx.settings.out_dir) / "instances" / f"{IID}.json").read_text())
    assert exported == as_file(record)  # this node's export, as the builder writes one
    # a redelivery, or a second request: answered by the stored result, nothing runs
    assert await on_validate(fctx, ops, m.ValidateRequested(instance_id=IID)) == "already-validated"
    assert ops.ran == [(IID, False)]
    # forced: runs again, forced all the way down (the evaluator's reports are recomputed)
    forced = m.ValidateRequested(instance_id=IID, force=True, request_id="x")
    assert await on_validate(fctx, ops, forced) == "validated"
    assert ops.ran == [(IID, False), (IID, True)]


async def test_unknown_or_unproven_instances_are_bad_input(fctx: FakeContext) -> None:
    ops = FakeValidator()
    with pytest.raises(BadInput, match="unknown instance"):
        await on_validate(fctx, ops, m.ValidateRequested(instance_id=IID))
    await stored(fctx, Verdict.NOT_IMPROVED)
    with pytest.raises(BadInput, match="not improved"):
        await on_validate(fctx, ops, m.ValidateRequested(instance_id=IID))
    await buckets.put(
        fctx.store, INSTANCES, IID, InstanceState(verdict=Verdict.IMPROVED, record='{"metadata": {}}')
    )
    with pytest.raises(BadInput, match="unreadable"):
        await on_validate(fctx, ops, m.ValidateRequested(instance_id=IID))
    assert ops.ran == []


async def test_builder_asks_for_validation_only_when_set_and_improved(tmp_path: Path) -> None:
    item = m.CommitClassified(commit=commit(), label=True, backend="heuristic")
    off = FakeContext(make_settings(tmp_path / "off"))
    assert await on_classified(off, FakeBuilderOps(tmp_path), item) == "built"
    assert off.bus.on(m.VALIDATE_REQUESTED) == []  # off by default
    on = FakeContext(make_settings(tmp_path / "on", builder={"validate_gold": True}))
    assert await on_classified(on, FakeBuilderOps(tmp_path), item) == "built"
    [req] = on.bus.on(m.VALIDATE_REQUESTED)
    assert req.instance_id == IID and not req.force and req.request_id  # one id per stored record
    # a redelivery of the commit asks again, with the same id (the bus drops the duplicate) ...
    assert await on_classified(on, FakeBuilderOps(tmp_path), item) == "already-built"
    assert await request_validation(on, IID)
    assert on.bus.on(m.VALIDATE_REQUESTED) == [req]
    # ... until the instance has its oracle
    await on.store.update(INSTANCES.name, IID, oracle="ctest")
    assert not await request_validation(on, IID)
    # an instance not improved is never sent
    await on.store.update(INSTANCES.name, IID, oracle=None, verdict="not-improved")
    assert not await request_validation(on, IID)


@dataclass
class Counting(PipelineOps):
    """The real gold validation, counted."""

    runs: list[str] = field(default_factory=list)

    def validate(self, record: InstanceRecord, *, force: bool) -> InstanceRecord:
        self.runs.append(record.cppperf.instance_id)
        return super().validate(record, force=force)


@pytest.mark.nats
@pytest.mark.build
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("ctx")  # the session's bus wiped: `drained` counts every queue
async def test_proven_demo_is_validated_by_the_evaluator_service(
    nats_server: Any, proven: Callable[[str], Proven], tmp_path: Path
) -> None:
    perf = proven("perf")  # the session's proof
    iid = perf.record["cppperf"]["instance_id"]
    settings = make_settings(
        tmp_path,
        nats_url=nats_server.url,
        evaluator={"runs": 8, "runs_dir": str(tmp_path / "runs")},
        bus={"ack_wait": 10, "stop_grace": 5},
    )
    ops = Counting(settings)
    register = {"evaluator": lambda b, c: evaluator_app.register(b, c, ops=ops)}
    async with connect(settings, nats_server.url) as client:
        await client.store.delete(INSTANCES.name, iid)  # another test's run on this session's bus
        # stored as the builder stores it
        text, ref = await client.store.inline_or_ref(f"record/{iid}", json.dumps(perf.record))
        state = InstanceState(stage=Stage.BUILT, verdict=Verdict.IMPROVED, record=text, record_ref=ref)
        await buckets.put(client.store, INSTANCES, iid, state)
        with pytest.raises(CppPerfError, match="unknown instance"):  # one line, nothing published
            await request_validations(client, ["nobody__x-0123456789ab"], force=False, wait_seconds=5)
        async with run_services(settings, nats_server.url, ["evaluator"], register=register):
            results = await request_validations(client, [iid], force=False, wait_seconds=800)
            block = results[iid]
            assert block["oracle"] == "ctest" and block["can_grade"], block
            assert block["gold"]["verdict"] == "opt" and block["null"]["verdict"] == "correct", block
            record = await instance_record(client.store, iid)
            assert record is not None and record.cppperf.oracle == "ctest"
            assert (await buckets.get(client.store, INSTANCES, iid) or InstanceState()).oracle == "ctest"
            # asked again (another request id: the bus would drop an identical one): the stored
            # validation answers, the evaluations do not run again
            again = m.ValidateRequested(instance_id=iid, request_id="again")
            assert await client.bus.publish(m.VALIDATE_REQUESTED, again)
            for _ in range(100):
                if await client.bus.drained():
                    break
                await asyncio.sleep(0.2)
            assert await client.bus.drained()
            assert ops.runs == [iid]


@dataclass
class SlowValidator(FakeValidator):
    """A validation that takes a while: the drain must wait for it."""

    seconds: float = 2.0

    def validate(self, record: InstanceRecord, *, force: bool) -> InstanceRecord:
        import time

        time.sleep(self.seconds)
        return super().validate(record, force=force)


@pytest.mark.nats
@pytest.mark.usefixtures("ctx")
async def test_builder_and_evaluator_on_one_bus_drain_only_after_the_validation(
    nats_server: Any, tmp_path: Path
) -> None:
    """As in `mine` with `builder.validate_gold`: the builder proves (a stand-in), stores and asks;
    the evaluator validates (a stand-in); the pipeline counts as drained only once the instance's
    oracle is stored, and the evaluator is the one that wrote it. (`ctx`: the session's bus wiped
    first, so no other test's queued commit is proven and validated here too.)"""
    from cppperf.services.builder import app as builder_app
    from cppperf.services.builder.service import BuiltPatch
    from cppperf.shared.bus import wait_drained

    class Proves(FakeBuilderOps):
        def prove(self, c: m.CommitSelected, path: Path, diff: str) -> BuiltPatch:
            built = super().prove(c, path, diff)
            return BuiltPatch(
                decode_record({**RECORD, "cppperf": as_file(built.record)["cppperf"]}),
                built.message,
                built.path,
            )

    settings = make_settings(
        tmp_path, nats_url=nats_server.url, builder={"validate_gold": True}, bus={"stop_grace": 5}
    )
    validator = SlowValidator()
    register = {
        "builder": lambda b, c: builder_app.register(b, c, ops=Proves(tmp_path)),
        "evaluator": lambda b, c: evaluator_app.register(b, c, ops=validator),
    }
    async with run_services(
        settings, nats_server.url, ["builder", "evaluator"], register=register
    ) as running:
        ctx = running.ctx
        await ctx.store.delete(INSTANCES.name, IID)  # another test's run on this session's bus
        item = m.CommitClassified(commit=commit(), label=True, backend="heuristic")
        await ctx.bus.publish(m.COMMIT_CLASSIFIED, item, msg_id=f"drain-{tmp_path.name}")
        await asyncio.sleep(0.5)
        await wait_drained(ctx.bus, timeout=60)
        state = await buckets.get(ctx.store, INSTANCES, IID)
        assert state is not None and state.oracle == Oracle.CTEST, state
        assert validator.ran == [(IID, False)]
        record = await instance_record(ctx.store, IID)
        assert record is not None and record.cppperf.oracle == "ctest"


@pytest.mark.nats
def test_validate_over_the_bus_refuses_an_unknown_id_in_one_line(nats_server: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cppperf.cli.common import app

    res = CliRunner().invoke(
        app,
        ["validate", "nobody__nothing-0123456789ab", "--nats-url", nats_server.url, "--out", str(tmp_path)],
    )
    assert res.exit_code != 0
    assert "unknown instance" in res.output and "instances bucket" in res.output, res.output
    assert "Traceback" not in res.output
