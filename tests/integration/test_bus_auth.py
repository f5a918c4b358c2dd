"""The shipped NATS accounts and permissions (deploy/nats) on a real nats-server, attacked as agent
`bob` against agent `alice` and against the pipeline: every attack is refused by the server or by
the evaluator, and a benign agent still gets its verdict. The evaluator runs as the `evaluator`
service user only; its evaluation is a stand-in (`FakeOps`): the secured bus is the point here."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from cppperf.agents import list_agents, remove_agent
from cppperf.client import AgentClient, Refused
from cppperf.services.evaluator.gateway import dedup_id
from cppperf.services.evaluator.gold import with_validation
from cppperf.services.evaluator.instances import EvalInstance
from cppperf.services.evaluator.pipeline import EvalRequest
from cppperf.shared import messages as m
from cppperf.shared.bus import credential_options
from cppperf.shared.domain import EvalReport, EvalVerdict, InstanceRecord, Oracle, Validation
from cppperf.shared.service import ServiceContext
from tests.secured_bus import SecuredBus, evaluator_service, running_secured_bus

INSTANCE = "local__demo-0123456789ab"


class FakeOps:
    """Scores a patch `opt` when it contains "fast", else `correct`; records what it ran."""

    def __init__(self) -> None:
        self.ran: list[EvalRequest] = []
        self.validated: list[str] = []

    def validate(self, record: InstanceRecord, *, force: bool) -> InstanceRecord:
        """Gold validation stand-in: every instance grades on its tests."""
        self.validated.append(record.cppperf.instance_id)
        return with_validation(record, Validation(oracle=Oracle.CTEST, can_grade=True))

    def evaluate(self, req: EvalRequest, instance: EvalInstance | None) -> EvalReport:
        self.ran.append(req)
        opt = "fast" in req.patch
        return EvalReport(
            instance_id=req.instance_id,
            model=req.model,
            verdict=EvalVerdict.OPT if opt else EvalVerdict.CORRECT,
            opt=opt,
            patch_sha256=__import__("hashlib").sha256(req.patch.encode()).hexdigest(),
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBus]:
    with running_secured_bus(tmp_path_factory.mktemp("secured"), ["alice", "bob"]) as bus:
        yield bus


@pytest.fixture
async def evaluator(secured: SecuredBus, tmp_path: Path) -> AsyncIterator[tuple[ServiceContext, FakeOps]]:
    """A clean JetStream (wiped as admin), then the evaluator service with only its own user."""
    ops = FakeOps()
    async with evaluator_service(
        secured, tmp_path, ops, agent_max_pending=3, agent_max_patch_bytes=4096
    ) as ctx:
        yield ctx, ops


async def as_user(secured: SecuredBus, who: str) -> NatsClient:
    return await nats.connect(secured.url, allow_reconnect=False, **credential_options(secured.creds(who)))


async def server_refuses(
    secured: SecuredBus,
    who: str,
    *,
    publish: str = "",
    subscribe: str = "",
    body: bytes = b"{}",
    queue: str = "",
) -> str:
    """The server's error when `who` publishes `body` to / subscribes (in `queue`) to a subject
    ("" when allowed). nats-py closes the connection on a permissions error, so each try gets its own."""
    nc = await as_user(secured, who)
    try:
        if publish:
            await nc.publish(publish, body)
        else:
            await nc.subscribe(subscribe, queue=queue)
        with contextlib.suppress(Exception):
            await nc.flush(timeout=1)
        await asyncio.sleep(0.05)
        err = str(nc.last_error or "").lower()
        return err if "permissions violation" in err else ""
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def test_benign_agent_gets_its_verdict(secured: SecuredBus, evaluator: Any) -> None:
    ctx, ops = evaluator
    async with await AgentClient.connect(secured.url, secured.creds("alice")) as alice:
        fast = await alice.submit(INSTANCE, "fast patch", run_id="r1", model="m")
        plain = await alice.submit("local__demo-111111111111", "plain", run_id="r1", model="m")
        assert (await alice.wait(fast, poll=0.1, max_wait=90))["verdict"] == "opt"
        assert (await alice.wait(plain, poll=0.1, max_wait=90))["verdict"] == "correct"
        rows = await alice.results("r1")
    assert {r["id"] for r in rows} == {fast, plain}
    assert fast.startswith("alice.r1/")
    assert {r.run_id for r in ops.ran} == {"alice.r1"}
    rec = await ctx.store.get("evaluations", fast)
    assert rec is not None and rec["agent"] == "alice"


async def test_bob_cannot_read_or_claim_alices_results(secured: SecuredBus, evaluator: Any) -> None:
    async with (
        await AgentClient.connect(secured.url, secured.creds("alice")) as alice,
        await AgentClient.connect(secured.url, secured.creds("bob")) as bob,
    ):
        eid = await alice.submit(INSTANCE, "fast", run_id="r1", model="m")
        await alice.wait(eid, poll=0.1, max_wait=90)
        with pytest.raises(Refused, match="not an evaluation of bob"):
            await bob.result(eid)
        assert await bob.results("r1") == []  # bob's r1 is his own: empty
        # bob speaking on alice's API subject: his permissions stop it at the server
        bob.agent, bob.timeout = "alice", 2.0
        with pytest.raises(Refused):
            await bob.result(eid)
        assert alice.agent == "alice"


async def test_agent_cannot_touch_pipeline_subjects_kv_streams_or_inboxes(
    secured: SecuredBus, evaluator: Any
) -> None:
    ctx, _ = evaluator
    attacks = [
        "eval.requested.alice",  # queue work as alice
        "eval.requested",
        "repo.candidate",
        "patch.built",
        "$KV.instances.x",  # rewrite an instance record
        "$KV.evaluations.alice=2Er1/m/x",  # plant a verdict
        "$JS.API.STREAM.PURGE.PATCH_BUILT",
        "$JS.API.STREAM.DELETE.EVAL_REQUESTED",
        "$JS.API.STREAM.MSG.DELETE.DLQ",
        "$JS.API.STREAM.INFO.EVAL_REQUESTED",
        "dlq.eval.requested",  # forge a dead letter to be replayed
        "_INBOX_alice.abc",  # answer into alice's inbox
        "eval.api.alice.submit",  # speak as alice
    ]
    for subject in attacks:
        assert "for publish" in await server_refuses(secured, "bob", publish=subject), subject
    for subject in ("_INBOX_alice.>", "_INBOX.>", "eval.completed.alice", "eval.completed.>", ">"):
        assert "for subscription" in await server_refuses(secured, "bob", subscribe=subject), subject
    assert await server_refuses(secured, "bob", subscribe="eval.completed.bob") == ""
    info = await ctx.bus.js.stream_info("EVAL_REQUESTED")  # nothing reached the pipeline
    assert info.state.messages == 0
    assert await ctx.store.ids("instances") == []


async def test_agent_sees_only_its_own_announcements(secured: SecuredBus, evaluator: Any) -> None:
    alice = await as_user(secured, "alice")
    try:
        got: list[m.EvalCompleted] = []

        async def on(msg: Any) -> None:
            got.append(m.decode(msg.data, m.EvalCompleted))

        await alice.subscribe("eval.completed.alice", cb=on)
        await alice.flush()
        async with (
            await AgentClient.connect(secured.url, secured.creds("alice")) as ca,
            await AgentClient.connect(secured.url, secured.creds("bob")) as cb,
        ):
            ea = await ca.submit(INSTANCE, "fast a", run_id="r", model="m")
            eb = await cb.submit(INSTANCE, "fast b", run_id="r", model="m")
            await ca.wait(ea, poll=0.1, max_wait=90)
            await cb.wait(eb, poll=0.1, max_wait=90)
        await asyncio.sleep(0.2)
        assert [g.id for g in got] == [ea]
    finally:
        await alice.close()


async def test_evaluator_refuses_bad_requests_before_any_write(secured: SecuredBus, evaluator: Any) -> None:
    ctx, ops = evaluator
    async with await AgentClient.connect(secured.url, secured.creds("bob")) as bob:
        with pytest.raises(Refused, match="over the 4096-byte limit"):
            await bob.submit(INSTANCE, "x" * 5000)
        for run_id, model in (("a/b", "m"), ("r", "../../etc"), ("r", "m m"), ("", "m")):
            with pytest.raises(Refused, match="refused, not rewritten"):
                await bob.submit(INSTANCE, "p", run_id=run_id, model=model)
        with pytest.raises(Refused, match="instance_id"):
            await bob.submit("../x", "p")
        # flooding: the 4th pending request is refused (the evaluator is held busy)
        hold = asyncio.Event()
        real = ops.evaluate

        def slow(req: EvalRequest, inst: EvalInstance | None) -> EvalReport:
            while not hold.is_set():
                __import__("time").sleep(0.02)
            return real(req, inst)

        ops.evaluate = slow
        try:
            for i in range(3):
                await bob.submit(INSTANCE, f"p{i}", run_id="flood")
            with pytest.raises(Refused, match="3 requests of bob pending"):
                await bob.submit(INSTANCE, "p4", run_id="flood")
            async with await AgentClient.connect(secured.url, secured.creds("alice")) as alice:
                assert await alice.submit(INSTANCE, "fair", run_id="flood")  # alice is not blocked
        finally:
            hold.set()
    info = await ctx.bus.js.stream_info("EVAL_REQUESTED")
    assert info.state.last_seq == 4  # only the accepted ones were ever written


async def test_dedup_ids_are_the_evaluators_and_ids_cannot_collide(
    secured: SecuredBus, evaluator: Any
) -> None:
    _, ops = evaluator
    assert m.evaluation_id("a/b", "c", "i") != m.evaluation_id("a", "b/c", "i")
    req = m.AgentSubmit(run_id="r", model="m", instance_id=INSTANCE, patch="fast")
    assert dedup_id("alice", req) != dedup_id("bob", req)
    async with (
        await AgentClient.connect(secured.url, secured.creds("alice")) as alice,
        await AgentClient.connect(secured.url, secured.creds("bob")) as bob,
    ):
        eb = await bob.submit(INSTANCE, "fast", run_id="r", model="m")  # bob first, same request
        ea = await alice.submit(INSTANCE, "fast", run_id="r", model="m")
        assert ea != eb
        assert (await alice.wait(ea, poll=0.1, max_wait=90))["verdict"] == "opt"  # a loaded host
        again = await alice.submit(INSTANCE, "fast", run_id="r", model="m")
        assert again == ea
    assert sorted(r.run_id for r in ops.ran) == ["alice.r", "bob.r"]


async def test_services_work_only_within_their_permissions(secured: SecuredBus) -> None:
    """The evaluator test above runs as the `evaluator` user; here what it and others may not do."""
    for who, subject in (
        ("evaluator", "validate.requested"),  # it consumes validation requests, never makes one
        ("evaluator", "$KV.repos.x"),
        ("classifier", "validate.requested"),
        ("classifier", "$KV.instances.x"),  # the builder and the evaluator (gold validation) only
        ("evaluator", "$JS.API.STREAM.DELETE.EVAL_REQUESTED"),
        ("evaluator", "$JS.API.STREAM.PURGE.EVAL_REQUESTED"),
        ("builder", "$KV.evaluations.x"),
        ("builder", "eval.completed.alice"),  # announce a verdict
        ("filter", "$JS.API.STREAM.MSG.DELETE.DLQ"),
        ("crawler", "patch.built"),
    ):
        assert "for publish" in await server_refuses(secured, who, publish=subject), (who, subject)
    assert await server_refuses(secured, "builder", publish="$KV.instances.x") == ""
    assert await server_refuses(secured, "builder", publish="validate.requested") == ""
    assert await server_refuses(secured, "evaluator", publish="$KV.instances.x") == ""  # the oracle
    assert await server_refuses(secured, "evaluator", publish="$KV.evaluations.x") == ""


async def test_body_fields_cannot_redirect_replies_name_objects_or_claim_an_agent(
    secured: SecuredBus, evaluator: Any
) -> None:
    ctx, ops = evaluator
    await ctx.store.put_blob("patch/alice-secret", b"alice's fast patch")
    bob = await as_user(secured, "bob")
    try:
        body = {
            "run_id": "r",
            "model": "m",
            "instance_id": INSTANCE,
            "patch": "bob's own",
            "reply_to": "$KV.instances.x",  # the evaluator would publish there with its rights
            "patch_ref": "patch/alice-secret",  # be scored on alice's patch
            "agent": "alice",  # claim to be alice
        }
        raw = await bob.request(m.eval_api_subject("bob", "submit"), json.dumps(body).encode(), timeout=5)
        answer = m.decode(raw.data, m.AgentAnswer)
        assert answer.ok and answer.id.startswith("bob.r/")
    finally:
        await bob.close()
    async with await AgentClient.connect(secured.url, secured.creds("bob")) as client:
        assert (await client.wait(answer.id, poll=0.1, max_wait=90))["verdict"] == "correct"
    assert [(r.run_id, r.patch) for r in ops.ran] == [("bob.r", "bob's own")]
    assert await ctx.store.ids("instances") == []


def test_agents_add_list_remove(tmp_path: Path) -> None:
    from cppperf.agents import add_agent
    from cppperf.shared.errors import BadInput

    conf = tmp_path / "agents.conf"
    key = add_agent(conf, "carol", tmp_path / "carol.creds")
    assert list_agents(conf) == {"carol": key.public}
    assert (tmp_path / "carol.creds").stat().st_mode & 0o077 == 0
    assert key.seed not in conf.read_text()
    with pytest.raises(BadInput, match="exists"):
        add_agent(conf, "carol", tmp_path / "c2.creds")
    rotated = add_agent(conf, "carol", tmp_path / "carol.creds", rotate=True)
    assert list_agents(conf) == {"carol": rotated.public}
    with pytest.raises(BadInput, match="agent name"):
        add_agent(conf, "a.b", tmp_path / "x.creds")
    remove_agent(conf, "carol")
    assert list_agents(conf) == {}


def test_agents_cli_add_list_remove_and_service_keys(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cppperf.cli.common import app

    conf = tmp_path / "agents.conf"
    conf.write_text((Path(__file__).resolve().parents[2] / "deploy" / "nats" / "agents.conf").read_text())
    run = CliRunner().invoke
    added = run(app, ["agents", "add", "dave", "--config", str(conf), "--creds", str(tmp_path / "d.creds")])
    assert added.exit_code == 0, added.output
    listed = run(app, ["agents", "list", "--config", str(conf)])
    assert listed.output.split()[0] == "dave" and listed.output.split()[1].startswith("U")
    again = run(app, ["agents", "add", "dave", "--config", str(conf), "--creds", str(tmp_path / "e.creds")])
    assert again.exit_code == 2 and "exists" in again.output
    assert run(app, ["agents", "remove", "dave", "--config", str(conf)]).exit_code == 0
    emptied = run(app, ["agents", "list", "--config", str(conf)]).output
    assert "dave" not in emptied and emptied.startswith("no agents in ")  # said, on stderr
    keys = run(app, ["agents", "service-keys", "--out", str(tmp_path / "creds"), "--k8s"])
    assert "kind: Secret" in keys.output and "  evaluator.creds: |" in keys.output
    assert (tmp_path / "creds" / "evaluator.creds").stat().st_mode & 0o077 == 0


async def test_oversize_patch_ref_is_refused_on_its_metadata(evaluator: Any) -> None:
    from cppperf.services.evaluator.handlers import on_request
    from cppperf.shared.errors import BadInput

    ctx, ops = evaluator
    ref = await ctx.store.put_blob("patch/huge", b"x" * (ctx.settings.evaluator.max_patch_bytes + 1))
    msg = m.EvalRequested(request_id="x", run_id="r", model="m", instance_id=INSTANCE, patch_ref=ref)
    with pytest.raises(BadInput, match=r"over evaluator\.max_patch_bytes"):
        await on_request(ctx, ops, msg)
    assert ops.ran == []
