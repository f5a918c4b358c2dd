"""Fair scheduling of `eval.requested` (shared/fair.py) on a real nats-server running the shipped
secured configuration, the evaluator as its own service user: one agent's backlog does not hold
another agent's request back; an agent added (server reload) while the evaluator runs is served
without a restart; the evaluator's user creates the per-agent consumers with its own rights;
a failing evaluation is retried and dead-lettered as on any queue. The evaluation itself is a
stand-in (a fake `EvaluatorOps`) that can be held busy."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cppperf.agents import add_agent
from cppperf.client import AgentClient
from cppperf.services.evaluator.instances import EvalInstance
from cppperf.services.evaluator.pipeline import EvalRequest
from cppperf.shared import messages as m
from cppperf.shared.bus import WORK_QUEUES, Bus
from cppperf.shared.domain import EvalReport
from cppperf.shared.fair import turn_order
from cppperf.shared.service import ServiceContext
from tests.integration.test_bus_auth import INSTANCE, FakeOps
from tests.secured_bus import (
    SecuredBus,
    as_user,
    evaluator_service,
    reload_config,
    running_secured_bus,
)

pytestmark = pytest.mark.nats
Q = WORK_QUEUES["eval.requested"]


class GatedOps(FakeOps):
    """FakeOps whose evaluations wait for `gate` (the evaluator is held busy meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Event()

    def evaluate(self, req: EvalRequest, instance: EvalInstance | None) -> EvalReport:
        self.started.set()
        assert self.gate.wait(30), "gate never opened"
        if req.patch.startswith("boom"):
            self.ran.append(req)
            raise RuntimeError("the stand-in evaluation failed")
        return super().evaluate(req, instance)


def test_turn_order_is_least_recently_served_first() -> None:
    assert turn_order(["bob", None, "alice"], {}) == [None, "alice", "bob"]
    assert turn_order(["alice", "bob"], {"alice": 5.0, "bob": 3.0}) == ["bob", "alice"]
    assert turn_order(["alice", "carol"], {"alice": 5.0}) == ["carol", "alice"]  # never served first


def test_waiting_queues_reads_subject_counts() -> None:
    counts = {
        "eval.requested": 2,
        "eval.requested.alice": 3,
        "eval.requested.bob": 0,
        "eval.requested.a.b": 1,
    }
    assert sorted(Q.waiting(counts), key=str) == [None, "alice"]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBus]:
    with running_secured_bus(tmp_path_factory.mktemp("secured-fair"), ["alice", "bob"]) as bus:
        yield bus


@pytest.fixture
async def evaluator(secured: SecuredBus, tmp_path: Path) -> AsyncIterator[tuple[ServiceContext, GatedOps]]:
    ops = GatedOps()
    async with evaluator_service(secured, tmp_path, ops) as ctx:
        try:
            yield ctx, ops
        finally:
            ops.gate.set()


async def wait_started(ops: GatedOps) -> None:
    assert await asyncio.to_thread(ops.started.wait, 20), "the evaluator never started an evaluation"


async def test_one_agents_backlog_does_not_hold_back_another(
    secured: SecuredBus, evaluator: tuple[ServiceContext, GatedOps]
) -> None:
    ctx, ops = evaluator
    async with (
        await AgentClient.connect(secured.url, secured.creds("alice")) as alice,
        await AgentClient.connect(secured.url, secured.creds("bob")) as bob,
    ):
        alice_ids = [await alice.submit(INSTANCE, f"fast {n}", run_id="flood", model="m") for n in range(10)]
        await wait_started(ops)  # alice's first is running; her 9 others wait in her queue
        bob_id = await bob.submit(INSTANCE, "fast bob", run_id="one", model="m")
        ops.gate.set()
        assert (await bob.wait(bob_id, poll=0.1, max_wait=30))["verdict"] == "opt"
        for eid in alice_ids:
            await alice.wait(eid, poll=0.1, max_wait=30)
    runs = [r.run_id for r in ops.ran]
    assert runs.count("alice.flood") == 10
    assert runs.index("bob.one") <= 1, runs  # arrival order would have put bob 11th
    for name, subject in (("evaluator", "eval.requested"), ("evaluator-alice", "eval.requested.alice")):
        assert (await ctx.bus.js.consumer_info(Q.stream, name)).config.filter_subject == subject
    assert (await ctx.bus.js.stream_info(Q.stream)).state.messages == 0  # every request acked
    assert await ctx.bus.dead_letters() == []


async def test_an_agent_added_while_running_is_served(
    secured: SecuredBus, evaluator: tuple[ServiceContext, GatedOps]
) -> None:
    ctx, ops = evaluator
    ops.gate.set()
    add_agent(secured.dir / "agents.conf", "carol", secured.dir / "carol.creds")
    reload_config(secured)  # nats-server reloads its configuration (twice: see reload_config)
    for _ in range(50):
        try:
            carol = await AgentClient.connect(secured.url, secured.creds("carol"))
            break
        except Exception:  # not reloaded yet: the server refuses the new key
            await asyncio.sleep(0.1)
    else:
        pytest.fail("the server never accepted carol's key")
    async with carol:
        eid = await carol.submit(INSTANCE, "fast carol", run_id="new", model="m")
        assert (await carol.wait(eid, poll=0.1, max_wait=30))["verdict"] == "opt"
    assert (await ctx.bus.js.consumer_info(Q.stream, "evaluator-carol")).config.filter_subject


async def test_a_failing_request_is_retried_then_dead_lettered_as_before(
    secured: SecuredBus, evaluator: tuple[ServiceContext, GatedOps], tmp_path: Path
) -> None:
    """The per-agent consumers keep the worker's policy: nak with backoff, then at `max_deliver`
    (3 here) a dead letter with the reason; meanwhile another agent is still served."""
    _, ops = evaluator
    ops.gate.set()
    async with (
        await AgentClient.connect(secured.url, secured.creds("alice")) as alice,
        await AgentClient.connect(secured.url, secured.creds("bob")) as bob,
    ):
        await alice.submit(INSTANCE, "boom", run_id="bad", model="m")
        ok = await bob.submit(INSTANCE, "fast", run_id="good", model="m")
        assert (await bob.wait(ok, poll=0.1, max_wait=30))["verdict"] == "opt"
    admin = await Bus.connect(secured.url, as_user(secured, tmp_path, "admin").bus)
    try:
        for _ in range(100):
            letters = await admin.dead_letters(m.EVAL_REQUESTED)
            if letters:
                break
            await asyncio.sleep(0.1)
        assert [(d.letter.attempts, d.letter.service) for d in letters] == [(3, "evaluator")]
        assert "the stand-in evaluation failed" in letters[0].letter.error
        assert (await admin.js.stream_info(Q.stream)).state.messages == 0  # term'd, not pending
    finally:
        await admin.close()
    assert [r.run_id for r in ops.ran].count("alice.bad") == 3
