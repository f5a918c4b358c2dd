"""An attacker holding one agent's credential (`bob`, and `bob-x`, whose name extends bob's)
against a real nats-server running the shipped deploy/nats configuration and the evaluator service
as its own user: every attack below is refused by the server (a permissions violation), answered
with a refusal the agent sees, or lands only in the attacker's own namespace. A benign agent
(`alice`) keeps working. The evaluation itself is a stand-in (`FakeOps`); the bus is the point."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import nkeys  # type: ignore[import-untyped]
import pytest
from nats.aio.msg import Msg

from cppperf.agents import AGENT_LIMITS, add_agent, agent_entry, list_agents, new_key, remove_agent, render
from cppperf.client import AgentClient, Refused
from cppperf.runtime import connect
from cppperf.services.evaluator.api import LANE_BYTES, LANE_DEPTH
from cppperf.services.evaluator.gateway import MAX_EVALUATION_ID, dedup_id
from cppperf.services.evaluator.instances import EvalInstance
from cppperf.services.evaluator.pipeline import EvalRequest
from cppperf.shared import messages as m
from cppperf.shared.bus import credential_options, read_creds
from cppperf.shared.domain import EvalReport, decode_record
from cppperf.shared.errors import BadInput
from cppperf.shared.service import ServiceContext
from tests.conftest import eval_instance
from tests.integration.test_bus_auth import INSTANCE, FakeOps, as_user, server_refuses
from tests.secured_bus import (
    SecuredBus,
    evaluator_service,
    reload_config,
    running_secured_bus,
    start_secured_bus,
)
from tests.secured_bus import as_user as settings_as

pytestmark = pytest.mark.nats
CAP = 3  # agent_max_pending in these tests
PATCH_CAP = 4096  # agent_max_patch_bytes


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBus]:
    with running_secured_bus(tmp_path_factory.mktemp("attack"), ["alice", "bob", "bob-x"]) as bus:
        yield bus


@pytest.fixture
async def evaluator(secured: SecuredBus, tmp_path: Path) -> AsyncIterator[tuple[ServiceContext, FakeOps]]:
    ops = FakeOps()
    async with evaluator_service(
        secured, tmp_path, ops, agent_max_pending=CAP, agent_max_patch_bytes=PATCH_CAP
    ) as ctx:
        yield ctx, ops


async def ask(nc: nats.NATS, subject: str, body: bytes, **kw: Any) -> m.AgentAnswer:
    """A raw request (no client-side checks): the evaluator's answer, decoded."""
    return m.decode((await nc.request(subject, body, timeout=5, **kw)).data, m.AgentAnswer)


def sink() -> tuple[list[tuple[str, bytes]], Callable[[Msg], Awaitable[None]]]:
    """A list and the subscription callback that appends every message it receives."""
    got: list[tuple[str, bytes]] = []

    async def on(msg: Msg) -> None:
        got.append((msg.subject, msg.data))

    return got, on


async def announcements_to(secured: SecuredBus, agent: str) -> tuple[nats.NATS, list[tuple[str, bytes]]]:
    """A connection of `agent` listening to its own `eval.completed.<agent>`, and what it hears."""
    nc = await as_user(secured, agent)
    got, on = sink()
    await nc.subscribe(f"eval.completed.{agent}", cb=on)
    await nc.flush()
    return nc, got


async def queued(ctx: ServiceContext) -> int:
    return int((await ctx.bus.js.stream_info("EVAL_REQUESTED")).state.last_seq)


# ------------------------------------------------------------------------ the bug this file found
async def test_reply_subject_cannot_land_in_another_agents_inbox_or_announcements(
    secured: SecuredBus, evaluator: tuple[ServiceContext, FakeOps]
) -> None:
    """NATS delivers a service reply in the requester's account on whatever reply subject the
    requester set. With every agent in one account, bob could have the evaluator answer into
    `eval.completed.alice` or `_INBOX_alice.…` (forged announcements, answers to alice's own
    requests). One account per agent: such a reply can only reach bob's own account."""
    ctx, _ = evaluator
    alice = await as_user(secured, "alice")
    bob = await as_user(secured, "bob")
    try:
        stolen, on_alice = sink()
        own, on_bob = sink()
        await alice.subscribe("eval.completed.alice", cb=on_alice)
        await alice.subscribe("_INBOX_alice.>", cb=on_alice)
        await bob.subscribe("_INBOX_bob.mine", cb=on_bob)
        await alice.flush()
        await bob.flush()
        body = json.dumps({"run_id": "r"}).encode()
        # eval.api.*: would the answer loop back into the evaluator as a request (as alice)?
        replies = ("eval.completed.alice", "_INBOX_alice.x.y", "_INBOX_alice.>", "eval.api.alice.submit")
        # the system's services every account imports: an answer sent there has no reply subject,
        # so the server's answer (who bob is, the servers) goes nowhere
        replies += ("$SYS.REQ.USER.INFO", "$SYS.REQ.SERVER.PING", "$SYS.REQ.ACCOUNT.PING.CONNZ")
        for reply in (*replies, "eval.api.bob.submit", "_INBOX_bob.mine"):
            await bob.publish("eval.api.bob.results", body, reply=reply)
        await bob.flush()
        for _ in range(100):  # the control: bob's own reply subject gets its answer
            if own:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert [s for s, _ in own] == ["_INBOX_bob.mine"]
        assert stolen == []
        assert bob.last_error is None  # nothing refused: the replies simply go nowhere else
        assert await queued(ctx) == 0  # an answer taken for a submit queued nothing
    finally:
        await alice.close()
        await bob.close()


async def test_message_tracing_shows_an_agent_nothing_of_the_services(
    secured: SecuredBus, evaluator: tuple[ServiceContext, FakeOps]
) -> None:
    """`Nats-Trace-Dest` asks every server on a message's way to report the hops (subscriptions,
    clients, accounts crossed): a map of the services. The trace events are published as the
    sender, so bob may only name a subject it may publish to (none that it can read): a trace to
    its own inbox is refused by the server, and nothing arrives there."""
    bob = await as_user(secured, "bob")
    try:
        got, on = sink()
        await bob.subscribe("_INBOX_bob.>", cb=on)
        await bob.flush()
        body = json.dumps({"run_id": "r"}).encode()
        for dest in ("_INBOX_bob.trace", "eval.completed.bob"):
            headers = {"Nats-Trace-Dest": dest}
            await bob.publish("eval.api.bob.results", body, reply="_INBOX_bob.answer", headers=headers)
        await bob.flush()
        await asyncio.sleep(0.5)
        assert "for publish" in str(bob.last_error).lower()  # the trace event, not bob's request
        assert [s for s, _ in got if s != "_INBOX_bob.answer"] == []
        assert not any(b"SERVICES" in data or b"evaluator" in data for _, data in got)
    finally:
        await bob.close()


def test_agents_conf_puts_every_agent_in_its_own_account(tmp_path: Path) -> None:
    conf = tmp_path / "agents.conf"
    add_agent(conf, "alice", tmp_path / "a.creds")
    add_agent(conf, "bob", tmp_path / "b.creds")
    text = conf.read_text()
    assert text.count("agent_alice: {users: [") == 1 and text.count("agent_bob: {users: [") == 1
    assert '"eval.api.bob.*"' in text and '"eval.completed.bob"' in text
    # its requests arrive in SERVICES in its own partition (the evaluator reads each on its own connection)
    part = m.api_partition("bob")
    assert (
        f'{{service: {{account: SERVICES, subject: "eval.api.{part}.bob.*"}}, to: "eval.api.bob.*"}}' in text
    )
    # bob may publish the API's three verbs, not `eval.api.bob.*` (a verb of any bytes)
    assert 'publish: {allow: ["eval.api.bob.submit", "eval.api.bob.result", "eval.api.bob.results"]}' in text
    assert "eval.api.*.*" not in text  # each imports only its own API
    assert text.count("limits: {max_connections: 16, max_subscriptions: 128}") == 2  # each its own share
    # an agents.conf of the older one-account format is read, and rewritten per agent
    key = new_key()
    old = tmp_path / "old.conf"
    old.write_text(
        "users: [\n"
        + f'  # agent carol\n  {{nkey: "{key.public}", permissions: {{publish: {{allow: ["x"]}}}}}}\n]\n'
    )
    assert list_agents(old) == {"carol": key.public}
    assert render(list_agents(old)).endswith(agent_entry("carol", key.public))


# ------------------------------------------------------------------------- the server's refusals
PUBLISH_ATTACKS = [
    "eval.api.alice.submit",  # alice's API
    "eval.api.bob-x.submit",  # a name that extends bob's
    "eval.api.*.submit",  # wildcards in a published subject
    "eval.api.>",
    "eval.api.bob",  # too few tokens
    "eval.api.bob.submit.x",  # too many
    f"eval.api.{m.api_partition('bob')}.bob.submit",  # SERVICES' side of its own import
    f"eval.api.{m.api_partition('alice')}.alice.submit",  # alice's partition
    f"eval.api.{m.api_partition('alice')}.bob.submit",  # its own name in alice's partition
    "eval.api.bob\u00e9.submit",  # unicode next to the name
    "eval.api." + "b" * 2000 + ".submit",
    "eval.completed.alice",  # forge alice's announcement
    "eval.completed.bob",  # or one's own
    "eval.requested.bob",  # skip the gateway's checks
    "_INBOX_alice.x",
    "$JS.API.INFO",
    "$JS.cppperf.API.INFO",  # a JetStream domain's API prefix
    "$JS.cppperf.API.STREAM.PURGE.EVAL_REQUESTED",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.CREATE.EVIL",
    "$JS.API.STREAM.UPDATE.EVAL_REQUESTED",
    "$JS.API.CONSUMER.CREATE.EVAL_REQUESTED",
    "$JS.API.CONSUMER.DURABLE.CREATE.EVAL_REQUESTED.evaluator-alice",  # steal alice's work
    "$JS.API.CONSUMER.CREATE.EVAL_REQUESTED.mine.eval.requested.alice",  # the same, filter in the subject
    "$JS.API.CONSUMER.CREATE.KV_evaluations.ord.$KV.evaluations.alice.>",  # an ordered consumer
    "$JS.API.CONSUMER.MSG.NEXT.EVAL_REQUESTED.evaluator-alice",
    "$JS.API.CONSUMER.DELETE.EVAL_REQUESTED.evaluator",
    "$JS.API.DIRECT.GET.KV_evaluations",  # read results directly
    "$JS.API.DIRECT.GET.KV_evaluations.$KV.evaluations.alice.r1/m/x",
    "$JS.API.STREAM.MSG.GET.KV_evaluations",
    "$JS.API.STREAM.PURGE.KV_evaluations",
    "$JS.ACK.EVAL_REQUESTED.evaluator-alice.1.1.1.1.1",  # ack alice's work away
    "$KV.evaluations.bob.r/m/x",  # plant one's own verdict
    "$O.blobs.x",
    "$SYS.REQ.SERVER.PING",
    "$SYS.REQ.USER.INFO",  # every account's import: who am I, what may I do
    "$SYS.REQ.ACCOUNT.SERVICES.CONNZ",
    "_R_.abc",
    "dlq.eval.requested",
    "validate.requested",  # ask for a gold validation
    "$KV.instances.local__demo-0123456789ab",  # write an oracle: forge a finished validation
    "$JS.ACK.VALIDATE_REQUESTED.evaluator-validate.1.1.1.1.1",
    "$JS.API.CONSUMER.MSG.NEXT.VALIDATE_REQUESTED.evaluator-validate",
    "$JS.API.DIRECT.GET.KV_instances.$KV.instances.local__demo-0123456789ab",
]


async def test_agent_may_publish_only_on_its_own_api(secured: SecuredBus, evaluator: Any) -> None:
    ctx, _ = evaluator
    for subject in PUBLISH_ATTACKS:
        assert "for publish" in await server_refuses(secured, "bob", publish=subject), subject
    assert await queued(ctx) == 0
    assert await ctx.store.ids("evaluations") == []


SUBSCRIBE_ATTACKS = [
    ">",
    "*.*",
    "eval.api.>",  # read others' requests (patches)
    "eval.api.alice.*",
    "eval.api.bob.*",
    "eval.requested.>",
    "eval.completed.*",
    "eval.completed.alice",
    "eval.completed.bob-x",
    "_INBOX.>",
    "_INBOX_alice.>",
    "_INBOX_bob-x.>",
    "_INBOX_bo.>",  # a prefix of bob's name
    "_R_.>",
    "$JS.>",
    "$KV.evaluations.>",
    "$O.blobs.>",
    "$SYS.>",
    "dlq.>",
    "validate.>",
    "$KV.instances.>",
]


async def test_agent_can_neither_request_a_validation_nor_write_an_oracle(
    secured: SecuredBus, evaluator: Any, tmp_path: Path
) -> None:
    """`validate.requested` and the `instances` bucket are the builder's and the evaluator's: an
    agent's request, forged oracle or completion is refused by the server and leaves no trace;
    the same request from the builder's user is validated, and only the evaluator's user writes
    the oracle."""
    ctx, ops = evaluator
    iid = "local__demo-0123456789ab"
    state = {"stage": "built", "verdict": "improved", "oracle": "both", "record": "{}"}
    forged = [
        ("validate.requested", m.encode(m.ValidateRequested(instance_id=iid))),
        ("validate.requested", m.encode(m.ValidateRequested(instance_id=iid, force=True, request_id="f"))),
        (f"$KV.instances.{iid}", json.dumps(state).encode()),  # a finished validation, forged
    ]
    for subject, body in forged:
        assert "for publish" in await server_refuses(secured, "bob", publish=subject, body=body), subject
    assert (await ctx.bus.js.stream_info("VALIDATE_REQUESTED")).state.last_seq == 0
    assert await ctx.store.ids("instances") == []
    assert ops.validated == []
    # the builder's user stores the instance and asks; the evaluator's user writes the oracle
    record = {
        "metadata": {"repository_name": "local/demo", "repository": "/nowhere"},
        "commit_info": {"old_sha": "b" * 40, "new_sha": "a" * 40, "patch": ["d"], "files_changed": []},
        "tests": {"tests": []},
        "cppperf": {"instance_id": iid, "verdict": "improved"},
    }
    builder = settings_as(secured, tmp_path / "builder", "builder")
    async with connect(builder, secured.url) as bctx:
        good = {"stage": "built", "verdict": "improved", "record": json.dumps(record)}
        await bctx.store.put("instances", iid, good)
        await bctx.bus.publish(m.VALIDATE_REQUESTED, m.ValidateRequested(instance_id=iid))
        for _ in range(300):
            if (await bctx.store.get("instances", iid) or {}).get("oracle"):
                break
            await asyncio.sleep(0.1)
        assert (await bctx.store.get("instances", iid) or {}).get("oracle") == "ctest"
    assert ops.validated == [iid]


async def test_agent_may_subscribe_only_to_its_inbox_and_announcements(secured: SecuredBus) -> None:
    for subject in SUBSCRIBE_ATTACKS:
        assert "for subscription" in await server_refuses(secured, "bob", subscribe=subject), subject
    for subject in ("_INBOX_bob.>", "eval.completed.bob"):
        assert await server_refuses(secured, "bob", subscribe=subject) == "", subject
    # a queue group does not widen a subscription, nor joins the evaluator's own queue group
    for subject, queue in (("eval.completed.alice", "q"), ("eval.api.bob.*", "evaluator-api")):
        assert "for subscription" in await server_refuses(secured, "bob", subscribe=subject, queue=queue), (
            subject
        )


# ------------------------------------------------------------------ exhausting the server (limits)
MAX_CONNECTIONS = AGENT_LIMITS["max_connections"]  # each agent account's, in agents.conf
MAX_SUBSCRIPTIONS = AGENT_LIMITS["max_subscriptions"]


async def test_an_agent_cannot_open_unbounded_connections(secured: SecuredBus, evaluator: Any) -> None:
    """Each connection holds a socket, buffers and a goroutine on every server: an agent without a
    limit could open thousands (one creds file, one loop) and take the file descriptors every other
    agent and service needs. Its account allows MAX_CONNECTIONS at once; the next is refused by the
    server, while another agent still connects and is served, and a closed connection frees its
    slot."""
    held: list[nats.NATS] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append(await as_user(secured, "bob"))
        bob_seed = read_creds(secured.creds("bob"))[1]
        refusal = (await raw_connect(secured.url, bob_seed)).lower()  # a plain socket, closed after
        assert "maximum account active connections exceeded" in refusal
        async with await AgentClient.connect(secured.url, secured.creds("alice"), request_timeout=5) as alice:
            eid = await alice.submit(INSTANCE, "fast", run_id="r", model="m")
            assert (await alice.wait(eid, poll=0.1, max_wait=90))["verdict"] == "opt"
        await held.pop().close()
        held.append(await as_user(secured, "bob"))  # a freed slot is bob's again
    finally:
        for nc in held:
            with contextlib.suppress(Exception):
                await nc.close()


async def test_an_agent_cannot_hold_unbounded_subscriptions(secured: SecuredBus, evaluator: Any) -> None:
    """Subscriptions to its own inbox are the agent's to make, and each costs the server memory and
    a sublist entry (and each one on `eval.completed.bob` one more delivery of every announcement):
    without a limit one connection held 20 000. The account allows MAX_SUBSCRIPTIONS in all; the
    next is refused by the server, and the agent's own client still gets its answers."""
    bob = await as_user(secured, "bob")
    try:
        for i in range(MAX_SUBSCRIPTIONS - 1):  # one left for the client's own reply inbox
            await bob.subscribe(f"_INBOX_bob.s{i}")
        await bob.flush(timeout=5)
        assert bob.last_error is None
        await bob.subscribe("_INBOX_bob.one-too-many")
        await bob.subscribe("eval.completed.bob")
        with contextlib.suppress(Exception):
            await bob.flush(timeout=2)
        await asyncio.sleep(0.1)
        assert "maximum subscriptions exceeded" in str(bob.last_error).lower()
    finally:
        with contextlib.suppress(Exception):
            await bob.close()
    async with await AgentClient.connect(secured.url, secured.creds("bob"), request_timeout=5) as client:
        eid = await client.submit(INSTANCE, "fast", run_id="r", model="m")
        assert (await client.wait(eid, poll=0.1, max_wait=90))["verdict"] == "opt"


RESPONSE_THRESHOLD = 10.0  # seconds: the `response_threshold` of the `eval.api.*.*.*` export


def pending_responses(secured: SecuredBus) -> int:
    """The reply routes the server holds in SERVICES for requests not yet answered (its own
    monitoring endpoint, `accountz`: one route per agent request with a reply subject)."""
    import urllib.request

    url = f"http://127.0.0.1:{secured.monitor_port}/accountz?acc=SERVICES"
    with urllib.request.urlopen(url, timeout=5) as reply:
        detail = json.load(reply)["account_detail"]
    return len(detail.get("responses") or {})


@pytest.mark.slow
async def test_unanswered_requests_do_not_pile_up_reply_routes(tmp_path: Path) -> None:
    """Every request an agent sends with a reply subject makes the server hold a reply route
    (`_R_.…` back into the agent's account) in SERVICES until the evaluator answers. While the
    evaluator lags behind a flood, or hangs, they pile up: 100 000 requests in two seconds held
    97 000 routes and 250 MB on the server, and unanswered ones lived NATS's default two minutes.
    The export's `response_threshold` drops a route once it is RESPONSE_THRESHOLD seconds old,
    answered or not (the server sweeps every threshold, so a route lives at most twice as long).
    Here the API's responder is a stand-in that never answers: bob's 5 000 routes are gone within
    twice the threshold; an answer in time still reaches bob."""
    bus = start_secured_bus(tmp_path / "bus", ["bob"], monitor=True)
    try:
        stalled = await nats.connect(bus.url, allow_reconnect=False, **credential_options(bus.creds("admin")))
        held: list[Msg] = []

        async def hold(msg: Msg) -> None:
            held.append(msg)

        await stalled.subscribe("eval.api.*.*.*", queue="evaluator-api", cb=hold)
        await stalled.flush()
        bob = await as_user(bus, "bob")
        answered, on = sink()
        await bob.subscribe("_INBOX_bob.answer", cb=on)
        await bob.publish("eval.api.bob.results", b"{}", reply="_INBOX_bob.answer")  # the control
        for i in range(5000):
            await bob.publish("eval.api.bob.results", b"{}", reply=f"_INBOX_bob.r{i}")
        await bob.flush()
        start = asyncio.get_running_loop().time()
        for _ in range(100):
            if len(held) == 5001:
                break
            await asyncio.sleep(0.05)
        assert pending_responses(bus) == 5001  # the server holds a route per request
        await held[0].respond(b"in time")
        for _ in range(100):
            if answered:
                break
            await asyncio.sleep(0.05)
        assert answered == [("_INBOX_bob.answer", b"in time")]
        while (
            pending_responses(bus) and asyncio.get_running_loop().time() - start < 2 * RESPONSE_THRESHOLD + 5
        ):
            await asyncio.sleep(0.5)
        assert pending_responses(bus) == 0
        assert bob.last_error is None and stalled.last_error is None
        await bob.close()
        await stalled.close()
    finally:
        bus.server.stop()


async def raw_connect(url: str, seed: str = "") -> str:
    """The server's first answer to a CONNECT (signed with `seed`, or with no identity at all),
    on a plain socket: `+OK`/`PONG` when let in, `-ERR 'Authorization Violation'` when not."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        info = json.loads((await reader.readline()).split(b" ", 1)[1])
        connect: dict[str, Any] = {"verbose": False, "pedantic": False, "protocol": 1}
        if seed:
            kp = nkeys.from_seed(seed.encode())
            connect["nkey"] = kp.public_key.decode()
            connect["sig"] = base64.urlsafe_b64encode(kp.sign(info["nonce"].encode())).decode().rstrip("=")
        writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        await writer.drain()
        return (await reader.readline()).decode().strip()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_unknown_keys_and_renamed_creds_get_nothing(secured: SecuredBus, tmp_path: Path) -> None:
    assert "authorization violation" in (await raw_connect(secured.url)).lower()
    assert "authorization violation" in (await raw_connect(secured.url, new_key().seed)).lower()
    bob_seed = read_creds(secured.creds("bob"))[1]
    assert await raw_connect(secured.url, bob_seed) == "PONG"  # the control: bob's own key is let in
    # bob's seed in a creds file that says `agent-alice`: still bob, with alice's inbox refused
    fake = tmp_path / "fake.creds"
    fake.write_text(f"name: agent-alice\nseed: {bob_seed}\n")
    client = await AgentClient.connect(secured.url, str(fake), request_timeout=2)
    try:
        with pytest.raises(Refused):
            await client.submit(INSTANCE, "fast")
    finally:
        with contextlib.suppress(Exception):
            await client.close()


# ------------------------------------------------------------------------- the gateway's refusals
async def test_no_agent_request_makes_the_evaluator_write_the_instances_bucket(
    secured: SecuredBus, evaluator: Any, tmp_path: Path
) -> None:
    """The evaluator may now write `$KV.instances.>` (gold validation); nothing an agent sends
    makes it write there: submits for a stored instance (graded), for ids made of dots or
    wildcards or naming the bucket's subjects, a `validate` verb, results and result lookups with
    such ids. The bucket's stream has not moved and the stored oracle is the builder's."""
    ctx, ops = evaluator
    builder = settings_as(secured, tmp_path / "builder", "builder")
    record = {
        "metadata": {"repository_name": "local/demo", "repository": "/nowhere"},
        "commit_info": {"old_sha": "b" * 40, "new_sha": "a" * 40, "patch": ["d"], "files_changed": []},
        "tests": {"tests": []},
        "cppperf": {"instance_id": INSTANCE, "verdict": "improved", "oracle": "ctest"},
    }
    async with connect(builder, secured.url) as bctx:
        state = {"stage": "built", "verdict": "improved", "oracle": "ctest", "record": json.dumps(record)}
        await bctx.store.put("instances", INSTANCE, state)
    before = (await ctx.bus.js.stream_info("KV_instances")).state.last_seq
    ids = (
        ".",
        "..",
        "a..b",
        f"{INSTANCE}.x",
        f"$KV.instances.{INSTANCE}",
        f"{INSTANCE}>",
        "\u2024",
        INSTANCE,
    )
    verdicts: dict[str, str] = {}
    async with await AgentClient.connect(secured.url, secured.creds("bob")) as client:
        for iid in ids:  # one at a time: under the pending cap
            try:
                eid = await client.submit(iid, "fast", run_id="r", model="m")
            except Refused:
                continue
            verdicts[iid] = (await client.wait(eid, poll=0.1, max_wait=90))["verdict"]
    # the refused ones never reached the queue; each other one was evaluated on its own (".."
    # once shared "."'s bucket key, and was answered from its record)
    assert sorted(verdicts) == sorted([".", "..", "a..b", f"{INSTANCE}.x", INSTANCE]), verdicts
    assert sorted(r.instance_id for r in ops.ran) == sorted(verdicts)
    assert verdicts[INSTANCE] == "opt"
    for verb in ("validate", "validate_requested"):  # no such verb: the server refuses it
        body = m.encode(m.ValidateRequested(instance_id=INSTANCE))
        assert "for publish" in await server_refuses(
            secured, "bob", publish=f"eval.api.bob.{verb}", body=body
        )
    assert (await ctx.bus.js.stream_info("KV_instances")).state.last_seq == before
    stored = await ctx.store.get("instances", INSTANCE) or {}
    assert stored.get("oracle") == "ctest" and json.loads(stored["record"]) == record
    assert ops.validated == []


def test_bucket_keys_are_one_per_id() -> None:
    """Ids reach bucket keys from agents' requests (`run_id`, `model`, `instance_id`: dots
    allowed anywhere). Keys once dropped leading and trailing dots, so `bob.r/m/.` and
    `bob.r/m/..` (and `x`, `x.`) shared one evaluation record. Every id now has its own key, a
    valid one, and decodes back."""
    import re

    from cppperf.shared.store import decode_key, encode_key

    ids = ["", ".", "..", "...", "x", "x.", ".x", "a..b", "a...b", "a.=2Eb", "=00", "\x00", "?"]
    ids += ["\u2024", "\u2025", "bob.r/m/.", "bob.r/m/..", "bob.r./m/x", "bob.r/m./x", "o/n@" + "a" * 40]
    keys = [encode_key(i) for i in ids]
    assert len(set(keys)) == len(ids), list(zip(ids, keys, strict=True))
    assert [decode_key(k) for k in keys] == ids
    token = r"[-/_=a-zA-Z0-9]+"
    assert all(re.fullmatch(rf"{token}(\.{token})*", k) for k in keys), keys


def deep(n: int) -> str:
    return "[" * n + "]" * n


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("submit", b"not json", "cannot decode"),
    ("submit", b"[]", "cannot decode"),
    ("submit", b"", "cannot decode"),
    ("submit", b"\xff\xfe{}", "cannot decode"),
    (
        "submit",
        json.dumps({"run_id": 1, "model": "m", "instance_id": INSTANCE, "patch": "p"}).encode(),
        "cannot decode",
    ),
    ("submit", json.dumps({"model": "m", "instance_id": INSTANCE, "patch": "p"}).encode(), "cannot decode"),
    (
        "submit",
        json.dumps({"run_id": "r", "model": "m", "instance_id": INSTANCE, "patch": ["p"]}).encode(),
        "cannot decode",
    ),
    (
        "submit",
        json.dumps(
            {"schema_version": 99, "run_id": "r", "model": "m", "instance_id": INSTANCE, "patch": "p"}
        ).encode(),
        "schema",
    ),
    (
        "submit",
        (
            '{"run_id":"r","model":"m","instance_id":"' + INSTANCE + '","patch":"p","x":' + deep(5000) + "}"
        ).encode(),
        "cannot decode",
    ),
    ("result", b"{", "cannot decode"),
    ("results", json.dumps({"run_id": ">"}).encode(), "refused, not rewritten"),
    ("results", json.dumps({"run_id": "*"}).encode(), "refused, not rewritten"),
    ("results", json.dumps({"run_id": "r" * 129}).encode(), "refused, not rewritten"),
    ("results", json.dumps({"run_id": ".."}).encode(), "refused, not rewritten"),
]
# verbs the gateway does not have: the server refuses them from an agent (it may publish only
# the three), and the gateway still refuses them from whoever may publish them (the admin)
BAD_VERBS = ("delete", "SUBMIT", "validate")


def submit_body(**fields: str) -> bytes:
    return json.dumps({"run_id": "r", "model": "m", "instance_id": INSTANCE, "patch": "p", **fields}).encode()


BAD_FIELDS = [
    {"run_id": "\uff52"},  # fullwidth r
    {"run_id": "r\u0000"},
    {"run_id": "a/b"},
    {"run_id": ""},  # run folders named as given: these would have been renamed (`model`, `r`)
    {"run_id": ".."},
    {"run_id": "_r"},
    {"run_id": "r."},
    {"model": "../../../etc/passwd"},
    {"model": "m\nx"},
    {"instance_id": "$KV.instances.x"},
    {"instance_id": "x" * 129},
    {"instance_id": "a b"},
    {"instance_id": "*"},
]


async def test_gateway_refuses_malformed_requests_before_any_write(
    secured: SecuredBus, evaluator: Any
) -> None:
    ctx, ops = evaluator
    bob = await as_user(secured, "bob")
    try:
        for verb, body, why in BAD_BODIES:
            answer = await ask(bob, f"eval.api.bob.{verb}", body)
            assert not answer.ok and why in answer.error.lower(), (verb, body[:40], answer.error)
        for fields in BAD_FIELDS:
            answer = await ask(bob, "eval.api.bob.submit", submit_body(**fields))
            assert not answer.ok and "refused, not rewritten" in answer.error, (fields, answer.error)
        # a content-type header that lies: the gateway decodes the bytes itself
        for ctype, body in (
            ("application/json", b"not json"),
            ("text/plain", b"\xff\xfe"),
            ("application/json", deep(5000).encode()),
        ):
            answer = await ask(bob, "eval.api.bob.submit", body, headers={"content-type": ctype})
            assert not answer.ok and "cannot decode" in answer.error, ctype
        # over the patch cap, as a field and as a whole body below the server's max_payload
        answer = await ask(bob, "eval.api.bob.submit", submit_body(patch="x" * (PATCH_CAP + 1)))
        assert not answer.ok and "over the 4096-byte limit" in answer.error
        answer = await ask(bob, "eval.api.bob.submit", b" " * (PATCH_CAP + 70 * 1024))
        assert not answer.ok and "patches are capped" in answer.error
        # huge headers, and a dedup id of its choosing: ignored (the evaluator derives its own)
        req = m.AgentSubmit(run_id="r", model="m", instance_id=INSTANCE, patch="fast")
        planted = {
            "Nats-Msg-Id": dedup_id("alice", req),
            "X-Pad": "p" * 200_000,
            # identity claims in headers: the evaluator reads the agent from the subject only
            "agent": "alice",
            "Nats-Request-Info": json.dumps({"acc": "agent_alice", "user": "alice"}),
        }
        answer = await ask(bob, "eval.api.bob.submit", m.encode(req), headers=planted)
        assert answer.ok and answer.id.startswith("bob.r/") and not answer.duplicate
    finally:
        await bob.close()
    admin = await as_user(secured, "admin")
    try:
        for verb in BAD_VERBS:
            subject = f"eval.api.bob.{verb}"
            assert "for publish" in await server_refuses(secured, "bob", publish=subject), verb
            refusal = await ask(admin, subject, b"{}")
            assert not refusal.ok and "is not eval.api" in refusal.error, (verb, refusal.error)
    finally:
        await admin.close()
    assert await queued(ctx) == 1  # only the one valid request was ever written
    async with await AgentClient.connect(secured.url, secured.creds("alice")) as alice:
        eid = await alice.submit(INSTANCE, "fast", run_id="r", model="m")  # not a "duplicate" of bob's
        assert (await alice.wait(eid, poll=0.1, max_wait=90))["verdict"] == "opt"
    async with await AgentClient.connect(secured.url, secured.creds("bob")) as bob_client:
        await bob_client.wait(answer.id, poll=0.1, max_wait=90)  # bob's own, queued before alice's
    assert sorted(r.run_id for r in ops.ran) == ["alice.r", "bob.r"]


async def test_ids_cannot_reach_another_agents_results(secured: SecuredBus, evaluator: Any) -> None:
    ctx, _ = evaluator
    async with (
        await AgentClient.connect(secured.url, secured.creds("alice")) as alice,
        await AgentClient.connect(secured.url, secured.creds("bob-x")) as bobx,
    ):
        ea = await alice.submit(INSTANCE, "fast secret-a", run_id="r", model="m")
        ex = await bobx.submit(INSTANCE, "fast secret-x", run_id="r", model="m")
        await alice.wait(ea, poll=0.1, max_wait=90)
        await bobx.wait(ex, poll=0.1, max_wait=90)
    bob = await as_user(secured, "bob")
    try:
        for foreign in (ea, ex, "bob-x.r/m/" + INSTANCE):
            answer = await ask(bob, "eval.api.bob.result", json.dumps({"id": foreign}).encode())
            assert not answer.ok and "not an evaluation of bob" in answer.error, foreign
        tricks = [
            f"bob.r/../../{ea}",
            f"bob./../{ea}",
            "bob.>",
            "bob.*",
            "bob.r/m/*",
            "bob.\u2024r/m/x",  # one dot leader, not a dot
            "bob." + "a" * 200_000,
            f"bob.{ea}",
        ]
        for trick in tricks:
            answer = await ask(bob, "eval.api.bob.result", json.dumps({"id": trick}).encode())
            # bob has nothing queued: none of them is an evaluation of his, pending or stored
            if len(trick) > MAX_EVALUATION_ID:  # longer than any id: refused before any read
                assert not answer.ok and "none is longer than" in answer.error
                continue
            assert answer.ok and answer.status == "lost" and answer.result is None, trick[:40]
        for run_id in ("r", "r/m", ".", ".."):
            answer = await ask(bob, "eval.api.bob.results", json.dumps({"run_id": run_id}).encode())
            assert answer.results == [], run_id
    finally:
        await bob.close()
    assert await ctx.store.ids("evaluations", under="bob") == []


async def test_concurrent_flood_stays_within_the_pending_cap_and_alice_is_served(
    secured: SecuredBus, evaluator: Any
) -> None:
    """40 submits at once (distinct patches) while the evaluator is busy: at most CAP queued,
    every other one refused with the reason; alice, after the flood, is still accepted."""
    ctx, ops = evaluator
    hold = asyncio.Event()
    real = ops.evaluate

    def slow(req: EvalRequest, inst: EvalInstance | None) -> EvalReport:
        while not hold.is_set():
            __import__("time").sleep(0.02)
        return real(req, inst)

    ops.evaluate = slow
    bob = await as_user(secured, "bob")
    try:
        answers = await asyncio.gather(
            *(ask(bob, "eval.api.bob.submit", submit_body(patch=f"p{i}", run_id="flood")) for i in range(40))
        )
        accepted = [a for a in answers if a.ok]
        assert 1 <= len(accepted) <= CAP
        assert all("pending (limit 3)" in a.error for a in answers if not a.ok)
        async with await AgentClient.connect(secured.url, secured.creds("alice")) as alice:
            assert await alice.submit(INSTANCE, "fair", run_id="flood")
    finally:
        hold.set()
        await bob.close()
    assert await queued(ctx) == len(accepted) + 1


@pytest.mark.slow
async def test_an_api_flood_is_refused_cheaply_and_does_not_lock_out_another_agent(
    secured: SecuredBus, evaluator: Any
) -> None:
    """1000 `results` requests at once (each would read the bucket through a consumer of its own):
    beyond the agent's rate (20/s, bursts of 40) they are refused before any JetStream call, so
    the bucket's consumers are not exhausted and alice, right after, is served."""
    bob = await as_user(secured, "bob")
    try:
        answers, on = sink()
        await bob.subscribe("_INBOX_bob.flood", cb=on)
        start = asyncio.get_running_loop().time()
        body = json.dumps({"run_id": "r"}).encode()
        for _ in range(1000):
            await bob.publish("eval.api.bob.results", body, reply="_INBOX_bob.flood")
        await bob.flush()
        for _ in range(400):
            if len(answers) == 1000:
                break
            await asyncio.sleep(0.05)
        elapsed = asyncio.get_running_loop().time() - start
        decoded = [m.decode(data, m.AgentAnswer) for _, data in answers]
        assert len(decoded) == 1000  # every request answered
        served = [a for a in decoded if a.ok]
        assert 40 <= len(served) <= 40 + 20 * elapsed + 1
        assert {a.error for a in decoded if not a.ok} == {
            "more than 20 requests a second from bob: slow down"
        }
    finally:
        await bob.close()
    async with await AgentClient.connect(secured.url, secured.creds("alice"), request_timeout=5) as alice:
        eid = await alice.submit(INSTANCE, "fast", run_id="r", model="m")
        assert (await alice.wait(eid, poll=0.1, max_wait=90))["verdict"] == "opt"
        assert [r["id"] for r in await alice.results("r")] == [eid]


@pytest.mark.slow
async def test_a_flood_faster_than_the_evaluator_refuses_does_not_hold_another_agent_back(
    secured: SecuredBus, evaluator: Any
) -> None:
    """The rate gate refuses cheaply, but every refusal is still one message the evaluator reads
    and answers in turn: 20 000 `results` requests sent in a burst (bob's own connections, well
    under its limit) queued in front of alice's request, which then waited for all of them
    (~13 s here) and timed out: FastStream's per-message work was the cost, not the refusal.
    The API is now a plain core subscription, where a refusal is a dictionary lookup and one small
    reply: alice, asking right after bob's burst, is answered (twice) within a few seconds."""
    conns = [await as_user(secured, "bob") for _ in range(4)]
    try:
        body = json.dumps({"run_id": "r"}).encode()
        for i in range(20_000):
            await conns[i % 4].publish("eval.api.bob.results", body, reply=f"_INBOX_bob.f{i}")
        for nc in conns:
            await nc.flush()
        async with await AgentClient.connect(secured.url, secured.creds("alice"), request_timeout=5) as alice:
            start = asyncio.get_running_loop().time()
            assert await alice.results("r") == []
            eid = await alice.submit(INSTANCE, "fast", run_id="r", model="m")
            assert eid.startswith("alice.r/")
            assert asyncio.get_running_loop().time() - start < 5
    finally:
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.close()


@pytest.mark.slow
async def test_a_flood_of_large_requests_does_not_cut_the_evaluators_own_connection(
    secured: SecuredBus, evaluator: Any
) -> None:
    """The server closes a connection that leaves more than max_pending (64 MiB) unread: a slow
    consumer. 300 requests of 900 kB from bob (270 MB in ~3 s, each refused at once as too large)
    outran the evaluator's reading, and the server closed the evaluator's connection, the one that
    also carries its JetStream work (pulls, heartbeats, acks, KV), twice. The API has a connection
    of its own now: only it can be cut (the agents' requests were lost anyway); the evaluator's
    work connection stays up, and alice's evaluation is done."""
    ctx, _ = evaluator
    reconnects = ctx.bus.nc.stats["reconnects"]
    conns = [await as_user(secured, "bob") for _ in range(4)]
    try:
        body = b" " * 900_000
        for i in range(300):
            await conns[i % 4].publish("eval.api.bob.results", body, reply=f"_INBOX_bob.big{i}")
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.flush(timeout=30)
    finally:
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.close()
    await asyncio.sleep(1)
    slow = [
        line
        for line in secured.server.log_path.read_text().splitlines()
        if "Slow Consumer" in line and ':cppperf"' in line
    ]
    assert slow == [] and ctx.bus.nc.stats["reconnects"] == reconnects and ctx.bus.nc.is_connected
    async with await AgentClient.connect(secured.url, secured.creds("alice"), request_timeout=10) as alice:
        eid = await alice.submit(INSTANCE, "fast", run_id="r", model="m")
        assert (await alice.wait(eid, poll=0.1, max_wait=90))["verdict"] == "opt"


def test_rate_gate_refills_per_agent() -> None:
    from cppperf.services.evaluator.gateway import RateGate

    now = [0.0]
    gate = RateGate(2.0, clock=lambda: now[0])
    assert [gate.allow("bob") for _ in range(5)] == [True] * 4 + [False]  # a burst of 2 * rate
    assert gate.allow("alice")  # alice has her own bucket
    now[0] = 0.5  # one token back
    assert [gate.allow("bob") for _ in range(2)] == [True, False]
    now[0] = 100.0  # never more than the burst
    assert sum(gate.allow("bob") for _ in range(10)) == 4


# ------------------------------------------------------- what the evaluator does with a queued patch
def _diff(*lines: str) -> str:
    return "\n".join(lines) + "\n"


_HUNK = ("@@ -1 +1 @@", "-a", "+b")
HOSTILE_PATCHES = {  # (more, applied in the jail: tests/integration/test_hostile.py)
    "octal-escaped-dotdot": (
        _diff(
            'diff --git "a/\\056\\056/x.cpp" "b/\\056\\056/x.cpp"',
            '--- "a/\\056\\056/x.cpp"',
            '+++ "b/\\056\\056/x.cpp"',
            *_HUNK,
        ),
        "unsafe-patch",
    ),
    "header-names-disagree": (
        _diff("diff --git a/src/x.cpp b/src/x.cpp", "--- a/src/x.cpp", "+++ b/../../etc/x.cpp", *_HUNK),
        "unsafe-patch",
    ),
    "rename-out-of-the-tree": (
        _diff(
            "diff --git a/src/x.cpp b/src/y.cpp",
            "similarity index 100%",
            "rename from src/x.cpp",
            "rename to ../y.cpp",
        ),
        "unsafe-patch",
    ),
    "copy-from-outside": (
        _diff(
            "diff --git a/../../etc/passwd b/src/p.cpp",
            "similarity index 100%",
            "copy from ../../etc/passwd",
            "copy to src/p.cpp",
        ),
        "unsafe-patch",
    ),
    "absolute-names": (_diff("--- /etc/passwd", "+++ /etc/passwd", *_HUNK), "unsafe-patch"),
    "timestamp-after-a-tab": (
        _diff("--- a/src/x.cpp\t2020-01-01", "+++ b/../x.cpp\t2020-01-01", *_HUNK),
        "unsafe-patch",
    ),
    "git-binary-patch": (
        _diff(
            "diff --git a/src/x.cpp b/src/x.cpp",
            "index 1..2 100644",
            "GIT binary patch",
            "literal 5",
            "zcmZ",
            "",
        ),
        "unsafe-patch",
    ),
    "mode-to-symlink": (
        _diff("diff --git a/src/x.cpp b/src/x.cpp", "old mode 100644", "new mode 120000"),
        "unsafe-patch",
    ),
    "gzip-bytes": ("\x1f\x8b\x08\x00" + "compressed", "unsafe-patch"),
    "second-file-into-dot-git": (
        _diff("--- a/src/x.cpp", "+++ b/src/x.cpp", *_HUNK, "--- a/src/x.cpp", "+++ b/.git/config", *_HUNK),
        "unsafe-patch",
    ),
    "no-file-at-all": (_diff("--- /dev/null", "+++ /dev/null", "@@ -0,0 +1 @@", "+x"), "malformed-patch"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_PATCHES))
def test_hostile_patch_is_refused_before_it_is_applied(name: str) -> None:
    from cppperf.services.evaluator.checks import check_patch
    from cppperf.shared.rules import Rules
    from cppperf.shared.settings import MiningSettings

    text, verdict = HOSTILE_PATCHES[name]
    result = check_patch(text, Rules.from_settings(MiningSettings()), max_bytes=1 << 20)
    assert not result.ok and result.verdict == verdict, (name, result)


UNGRADABLE = "local__demo-0badc0ffee00"
COMMENT_ONLY = _diff(
    "diff --git a/src/core.cpp b/src/core.cpp",
    "--- a/src/core.cpp",
    "+++ b/src/core.cpp",
    "@@ -1 +1,2 @@",
    ' #include "core.h"',
    "+// faster now",
)


def ungradable_record(iid: str = UNGRADABLE) -> dict[str, Any]:
    """An instance whose gold validation found that it cannot grade: a comment-only patch scored
    `opt` on it (the measurement cannot tell a change from none), so its oracle is `none`."""
    null = {"verdict": "opt", "opt": True}
    validation = {"gold": {"verdict": "opt", "opt": True}, "null": null, "oracle": "none", "can_grade": False}
    return {
        "metadata": {"repository_name": "local/demo", "repository": "/nowhere"},
        "commit_info": {"old_sha": "b" * 40, "new_sha": "a" * 40, "patch": ["d"], "files_changed": []},
        "tests": {"tests": []},
        "cppperf": {"instance_id": iid, "verdict": "improved", "oracle": "none", "validation": validation},
    }


def test_an_instance_that_cannot_grade_scores_no_patch(tmp_path: Path) -> None:
    """Gold validation writes `oracle: none` into the record of an instance on which a
    comment-only patch scores `opt`; an agent that picks exactly those instances must not farm
    `opt` with a comment. The evaluation refuses before anything is built (`instance-broken`)."""
    from cppperf.services.evaluator.instances import from_record
    from cppperf.services.evaluator.pipeline import evaluate
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, evaluator={"runs_dir": str(tmp_path / "runs")})
    inst = from_record(decode_record(ungradable_record()))
    req = EvalRequest(run_id="bob.r", model="m", instance_id=UNGRADABLE, patch=COMMENT_ONLY)
    report = evaluate(req, settings, instance=inst)
    assert report["verdict"] == "instance-broken" and not report["opt"], report
    assert "cannot grade" in report["reason"] and "oracle none" in report["reason"]
    assert not (tmp_path / "work").exists()  # nothing was exported or built


async def test_an_agent_gets_no_score_on_an_instance_that_cannot_grade(
    secured: SecuredBus, tmp_path: Path
) -> None:
    """The same over the shipped bus, the evaluator service running the real pipeline: bob submits
    a comment to the instance the builder stored with `oracle: none`; the answer is
    `instance-broken`, at once (nothing built, no repository fetched)."""
    from cppperf.services.evaluator.handlers import PipelineOps
    from tests.conftest import make_settings

    ops = PipelineOps(make_settings(tmp_path / "eval", evaluator={"runs_dir": str(tmp_path / "runs")}))
    async with evaluator_service(secured, tmp_path, ops):
        builder = settings_as(secured, tmp_path / "builder", "builder")
        async with connect(builder, secured.url) as bctx:
            state = {"stage": "built", "verdict": "improved", "oracle": "none"}
            await bctx.store.put(
                "instances", UNGRADABLE, {**state, "record": json.dumps(ungradable_record())}
            )
        async with await AgentClient.connect(secured.url, secured.creds("bob")) as bob:
            eid = await bob.submit(UNGRADABLE, COMMENT_ONLY, run_id="r", model="m")
            report = await bob.wait(eid, poll=0.1, max_wait=60)
    assert report["verdict"] == "instance-broken" and not report["opt"], report
    assert "cannot grade" in report["reason"]


@pytest.mark.parametrize("instance_id", [".", "..", "...", "-", "evaluations"])
def test_instance_id_that_is_no_instance_builds_no_path(tmp_path: Path, instance_id: str) -> None:
    """The gateway's alphabet lets `.` and `..` through; the evaluation refuses them before a run
    directory is derived from them (`runs/<run>/<model>/..` would be the run's own directory)."""
    from cppperf.services.evaluator.pipeline import evaluate
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, evaluator={"runs_dir": str(tmp_path / "runs")})
    req = EvalRequest(run_id="bob.r", model="m", instance_id=instance_id, patch="x")
    assert evaluate(req, settings)["verdict"] == "unknown-instance"
    assert not (tmp_path / "runs").exists()


async def test_removed_or_rotated_agent_is_shut_out_at_the_reload(tmp_path: Path) -> None:
    """`agents remove` (and `--rotate`'s old key) then a reload: the old key is refused and an open
    connection of a removed agent is closed; the other agents keep working."""
    bus = start_secured_bus(tmp_path / "bus", ["carol", "dave"])
    try:
        conf = bus.dir / "agents.conf"
        old_dave = read_creds(bus.creds("dave"))[1]
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        carol = await nats.connect(
            bus.url, allow_reconnect=False, closed_cb=on_closed, **credential_options(bus.creds("carol"))
        )
        remove_agent(conf, "carol")
        add_agent(conf, "dave", bus.dir / "dave.creds", rotate=True)
        reload_config(bus)
        await asyncio.wait_for(closed.wait(), 10)
        assert (
            "authorization violation"
            in (await raw_connect(bus.url, read_creds(bus.creds("carol"))[1])).lower()
        )
        assert "authorization violation" in (await raw_connect(bus.url, old_dave)).lower()
        assert await raw_connect(bus.url, read_creds(bus.creds("dave"))[1]) == "PONG"
        assert carol.is_closed
    finally:
        bus.server.stop()


def test_agent_names_cannot_smuggle_subject_syntax(tmp_path: Path) -> None:
    conf = tmp_path / "agents.conf"
    for name in ("a.b", "a*", "a>", "b" * 33, "B", "\u00e4", "", " a", "a b", "-a", "a\n", 'a"'):
        with pytest.raises(BadInput, match="agent name"):
            add_agent(conf, name, tmp_path / "x.creds")
    assert list_agents(conf) == {}
    add_agent(conf, "b" * 32, tmp_path / "long.creds")  # the longest name is one plain token
    assert list(list_agents(conf)) == ["b" * 32]


def test_compose_publishes_no_nats_or_monitor_port() -> None:
    """The monitor (8222) has no login and lists connections and reply inboxes: no NATS node in
    the shipped compose file publishes any port."""
    import yaml

    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
    nodes = {k: v for k, v in compose["services"].items() if k.startswith("nats")}
    assert len(nodes) == 3
    for name, node in nodes.items():
        assert not node.get("ports"), name
        assert "network_mode" not in node, name  # `host` would expose 8222 as well


# ------------------------------------------------ bytes nats-py cannot parse (a deaf evaluator-api)
async def raw_publish(secured: SecuredBus, who: str, subject: bytes, header: bytes, body: bytes) -> bytes:
    """One HPUB from `who`, written on a socket byte for byte (nats-py builds only well-formed
    headers and UTF-8 subjects): what the server answered (`-ERR …` or nothing before PONG)."""
    host, port = secured.url.removeprefix("nats://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        info = json.loads((await reader.readline()).split(b" ", 1)[1])
        key = nkeys.from_seed(read_creds(secured.creds(who))[1].encode())
        sig = base64.urlsafe_b64encode(key.sign(info["nonce"].encode())).decode().rstrip("=")
        hello = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1}
        hello |= {"nkey": key.public_key.decode(), "sig": sig, "lang": "raw", "version": "0"}
        writer.write(b"CONNECT " + json.dumps(hello).encode() + b"\r\nPING\r\n")
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"PONG")
        head = b"HPUB %s _INBOX_%s.raw %d %d\r\n" % (
            subject,
            who.encode(),
            len(header),
            len(header) + len(body),
        )
        writer.write(head + header + body + b"\r\nPING\r\n")
        answer = b""
        while not answer.endswith(b"PONG\r\n") and b"-ERR" not in answer:
            line = await asyncio.wait_for(reader.readline(), 5)
            if not line:
                break
            answer += line if not line.startswith(b"INFO") else b""
        return answer
    finally:
        writer.close()


BAD_HEADERS = [
    b"NATS/1.0 \xff\xfe\xfd\r\n\r\n",  # a status line that is not UTF-8
    b"NATS/1.0 503 \xff\xfe\r\nx: y\r\n\r\n",  # a description that is not UTF-8
    b"NATS/1.0 \r\n\r\n",
]


async def test_a_header_nats_py_cannot_parse_does_not_deafen_the_api(
    secured: SecuredBus, evaluator: Any
) -> None:
    """nats-py parses a message's header block inside its read loop, which stops for good at the
    first exception while the connection still looks connected: one request of bob's with a
    status line that is not UTF-8 left every agent's request unanswered (alice's timed out). The
    evaluator's connections parse such a block as no headers: bob's malformed request is read
    (and refused like any body), and alice is answered right after each."""
    for header in BAD_HEADERS:
        assert b"-ERR" not in await raw_publish(secured, "bob", b"eval.api.bob.results", header, b"{}")
        async with await AgentClient.connect(secured.url, secured.creds("alice"), request_timeout=5) as alice:
            assert await asyncio.wait_for(alice.results("r1"), 10) == [], header


async def test_an_api_subject_nats_py_cannot_decode_is_refused_and_does_not_deafen_the_api(
    secured: SecuredBus, evaluator: Any
) -> None:
    """`eval.api.bob.*` let bob publish a verb of any bytes; nats-py decodes a subject as UTF-8 in
    its read loop, so `eval.api.bob.\\xff` stopped the evaluator's API for every agent. Now bob may
    publish only the three verbs (the server refuses the rest), and the evaluator's connection
    reads a subject that is not UTF-8 (here from the admin, who may publish anything) as text the
    gateway refuses."""
    for subject in (b"eval.api.bob.\xff", b"eval.api.bob.x", b"eval.api.bob.submit\xc3"):
        answer = await raw_publish(secured, "bob", subject, b"NATS/1.0\r\n\r\n", b"{}")
        assert b"permissions violation for publish" in answer.lower(), subject
    assert b"-ERR" not in await raw_publish(
        secured, "admin", b"eval.api.bob.\xff", b"NATS/1.0\r\n\r\n", b"{}"
    )
    async with await AgentClient.connect(secured.url, secured.creds("alice"), request_timeout=5) as alice:
        assert await asyncio.wait_for(alice.results("r1"), 10) == []


# ------------------------------------------------------ one agent's costly requests hold only its own
async def test_costly_requests_of_one_agent_do_not_hold_another_agents_answer(
    secured: SecuredBus, tmp_path: Path
) -> None:
    """A request's cost is not its count: `results` on a run of 2000 evaluations reads 2000
    records (seconds). An agent gets there by submitting instance ids that do not exist (each an
    `unknown-instance` evaluation of milliseconds, 16 at a time); written here directly as the
    evaluator would. While the API answered requests one after the other, ten such requests of
    bob's — under his rate — kept alice's request waiting past her client's timeout (and past the
    reply route's `response_threshold`: she got no answer at all). Each agent has its own lane
    now: alice is answered at once while bob's run is read, and bob's requests past his lane's
    depth or bytes are refused at once ("slow down"). No rate gate here (`agent_api_rate` 0), so
    every request reaches the lanes."""
    async with evaluator_service(secured, tmp_path, FakeOps(), agent_api_rate=0) as ctx:
        await flood_costly_results(secured, ctx)


async def flood_costly_results(secured: SecuredBus, ctx: ServiceContext) -> None:
    report = json.dumps({"verdict": "unknown-instance", "opt": False, "reason": "no such instance"})
    for i in range(2000):
        iid = f"local__demo-{i:012x}"
        state = {"verdict": "unknown-instance", "run_id": "big", "model": "m", "instance_id": iid}
        await ctx.store.put(
            "evaluations",
            m.evaluation_id(m.agent_run("bob", "big"), "m", iid),
            state
            | {
                "agent": "bob",
                "report": report,
            },
        )
    bob = await as_user(secured, "bob")
    got, on = sink()
    try:
        await bob.subscribe("_INBOX_bob.flood", cb=on)
        body = json.dumps({"run_id": "big"}).encode()
        for _ in range(10):
            await bob.publish("eval.api.bob.results", body, reply="_INBOX_bob.flood")
        await bob.flush()
        async with await AgentClient.connect(secured.url, secured.creds("alice"), request_timeout=5) as alice:
            loop = asyncio.get_running_loop()
            start = loop.time()
            assert await asyncio.wait_for(alice.results("r1"), 10) == []
            assert loop.time() - start < 3

        async def refusals(wanted: int) -> int:
            for _ in range(100):
                if sum(b"wait for an answer: slow down" in data for _, data in got) >= wanted:
                    break
                await asyncio.sleep(0.05)
            return sum(b"wait for an answer: slow down" in data for _, data in got)

        # more bytes than bob's lane holds (behind his costly `results`): refused at once
        big = b" " * (700 * 1024)
        for _ in range(LANE_BYTES // len(big) + 3):
            await bob.publish("eval.api.bob.submit", big, reply="_INBOX_bob.flood")
        await bob.flush()
        assert await refusals(1) >= 1
        # more requests than bob's lane holds: the rest is refused at once
        before = await refusals(0)
        for _ in range(LANE_DEPTH + 10):
            await bob.publish("eval.api.bob.result", b'{"id": "bob.x/m/i"}', reply="_INBOX_bob.flood")
        await bob.flush()
        assert await refusals(before + 10) >= before + 10
    finally:
        await bob.close()


async def test_results_of_a_run_larger_than_one_reply_come_in_pages(
    secured: SecuredBus, evaluator: Any
) -> None:
    """`results` answered a whole run in one reply; past NATS's 1 MiB payload the reply could not
    be sent and the agent got no answer at all (its client timed out, every time). Now a reply
    holds a page (`MAX_RESULTS_REPLY`), says `more`, and the next page starts `after` its last id;
    the client reads every page."""
    ctx, _ = evaluator
    reason = "no such instance " + "x" * 400
    report = json.dumps({"verdict": "unknown-instance", "opt": False, "reason": reason})
    ids = []
    for i in range(2500):  # ~1.4 MB of rows
        iid = f"local__demo-{i:012x}"
        ids.append(m.evaluation_id(m.agent_run("bob", "big"), "m", iid))
        state = {"verdict": "unknown-instance", "run_id": "big", "model": "m", "instance_id": iid}
        await ctx.store.put("evaluations", ids[-1], state | {"agent": "bob", "report": report})
    bob = await as_user(secured, "bob")
    try:
        raw = await bob.request("eval.api.bob.results", json.dumps({"run_id": "big"}).encode(), timeout=30)
        first = m.decode(raw.data, m.AgentAnswer)
        assert first.ok and first.more and 0 < len(first.results) < len(ids)
        assert len(raw.data) < 1024 * 1024
    finally:
        await bob.close()
    async with await AgentClient.connect(secured.url, secured.creds("bob"), request_timeout=30) as client:
        rows = await client.results("big")
    assert [r["id"] for r in rows] == sorted(ids)
    assert all(r["reason"] == reason for r in rows)


async def test_an_agent_gets_no_score_on_an_instance_that_is_not_proven(
    secured: SecuredBus, evaluator: Any, tmp_path: Path
) -> None:
    """A not-improved instance was never gold-validated and its expert's speed-up (the bar an
    `opt` is held to) is not significant: an agent is not graded on it (`instance-broken`, no
    evaluation run); a proven one beside it is."""
    _, ops = evaluator

    def record(iid: str, verdict: str) -> dict[str, Any]:
        return {
            "metadata": {"repository_name": "local/demo", "repository": "/nowhere"},
            "commit_info": {
                "old_sha": "b" * 40,
                "new_sha": iid[-12:] * 3 + "0" * 4,
                "patch": ["d"],
                "files_changed": [],
            },
            "tests": {"tests": []},
            "cppperf": {"instance_id": iid, "verdict": verdict},
        }

    unproven, proven = "local__demo-222222222222", "local__demo-333333333333"
    async with connect(settings_as(secured, tmp_path / "builder", "builder"), secured.url) as bctx:
        for iid, verdict in ((unproven, "not-improved"), (proven, "improved")):
            state = {"stage": "built", "verdict": verdict, "record": json.dumps(record(iid, verdict))}
            await bctx.store.put("instances", iid, state)
    async with await AgentClient.connect(secured.url, secured.creds("bob")) as bob:
        refused = await bob.wait(
            await bob.submit(unproven, "fast", run_id="np", model="m"), poll=0.1, max_wait=90
        )
        graded = await bob.wait(
            await bob.submit(proven, "fast", run_id="np", model="m"), poll=0.1, max_wait=90
        )
    ran = {r.instance_id for r in ops.ran}
    assert refused["verdict"] == "instance-broken" and unproven not in ran, refused
    assert graded["verdict"] != "instance-broken" and proven in ran, graded


# ------------------------------------------------------------------- shared state an agent fills
QUOTA = 5  # agent_max_evaluations in the test below


async def test_an_agent_cannot_fill_the_shared_evaluations_bucket_with_new_ids(
    secured: SecuredBus, tmp_path: Path
) -> None:
    """Every new (run, model, instance) of an agent is one more key of `evaluations` and one more
    folder under runs/ (its patch.diff of up to 512 KiB, its report.json), kept for good; an
    instance id that does not exist is answered `unknown-instance` in milliseconds, so under its
    rate and pending cap bob could still add a few a second for ever, until the bucket — one for
    every agent and the services, `bus.kv_max_bytes`, refusing writes when full — or the
    evaluator's disk is full and nobody's evaluation can be recorded. The evaluations an agent
    has (stored and queued) are capped (`agent_max_evaluations`): a submit that would add one more
    is refused, whichever part of the id is new; asking again for an id it has (a new patch)
    replaces that evaluation and is accepted; another agent is not affected."""
    ops = FakeOps()
    async with (
        evaluator_service(
            secured,
            tmp_path,
            ops,
            agent_max_pending=CAP,
            agent_max_patch_bytes=PATCH_CAP,
            agent_max_evaluations=QUOTA,
        ) as ctx,
        await AgentClient.connect(secured.url, secured.creds("bob")) as bob,
    ):
        first = [await bob.submit(f"nope__x-{i:012d}", "p", run_id=f"r{i}", model="m") for i in range(CAP)]
        for eid in first:  # queued ones count too: the next two fill the quota, then they are done
            await bob.wait(eid, poll=0.05, max_wait=30)
        for i in range(CAP, QUOTA):
            await bob.wait(await bob.submit(f"nope__x-{i:012d}", "p", run_id=f"r{i}"), poll=0.05, max_wait=30)
        for run_id, model, instance in (
            ("r99", "m", INSTANCE),
            ("r0", "m2", "nope__x-000000000000"),
            ("r0", "m", INSTANCE),
        ):
            with pytest.raises(Refused, match=f"{QUOTA} evaluations of bob"):
                await bob.submit(instance, "p", run_id=run_id, model=model)
        again = await bob.submit("nope__x-000000000000", "another patch", run_id="r0", model="m")
        assert (await bob.wait(again, poll=0.05, max_wait=30))["verdict"] == "correct"
        async with await AgentClient.connect(secured.url, secured.creds("alice")) as alice:
            done = await alice.wait(await alice.submit(INSTANCE, "fast", run_id="a"), poll=0.05, max_wait=30)
            assert done["verdict"] == "opt"
        assert len(await ctx.store.ids("evaluations", under="bob")) == QUOTA


# ------------------------------------------------------------------------ the expert's hidden patch
HOTSPOT = "src/hidden_hotspot_7f3a.cpp"  # a file only the expert's commit names


def proven_record(iid: str) -> dict[str, Any]:
    """A proven (improved) instance whose expert commit changed `HOTSPOT` and one header."""
    files = [
        {"filename": HOTSPOT, "status": "modified"},
        {"filename": "include/hidden_7f3a.h", "status": "modified"},
    ]
    return {
        "metadata": {"repository_name": "local/demo", "repository": "/nowhere"},
        "commit_info": {"old_sha": "b" * 40, "new_sha": "c" * 40, "patch": ["d"], "files_changed": files},
        "tests": {"tests": []},
        "cppperf": {"instance_id": iid, "verdict": "improved"},
    }


async def test_an_agents_answers_do_not_name_the_files_the_expert_changed(
    secured: SecuredBus, tmp_path: Path
) -> None:
    """The expert's patch is the hidden answer; which files it changes is half of it (the agent's
    whole localisation problem). Every report carried `files` (the expert commit's changed files),
    even that of a patch refused before anything runs, so an empty patch — answered in
    milliseconds, nothing built — told an agent where to look on any proven instance. An agent's
    report (`result`, `results`, `eval.completed.<agent>`) names none of them; the report on the
    evaluator's disk keeps them (the operator's summary)."""
    from cppperf.services.evaluator.handlers import PipelineOps
    from tests.conftest import make_settings

    iid = "local__demo-cccccccccccc"
    runs = tmp_path / "runs"
    ops = PipelineOps(make_settings(tmp_path / "eval", evaluator={"runs_dir": str(runs)}))
    async with evaluator_service(secured, tmp_path, ops):
        async with connect(settings_as(secured, tmp_path / "builder", "builder"), secured.url) as bctx:
            state = {"stage": "built", "verdict": "improved", "record": json.dumps(proven_record(iid))}
            await bctx.store.put("instances", iid, state)
        nc, announced = await announcements_to(secured, "bob")
        try:
            async with await AgentClient.connect(secured.url, secured.creds("bob")) as bob:
                reports = [
                    await bob.wait(
                        await bob.submit(iid, patch, run_id="peek", model=model), poll=0.05, max_wait=60
                    )
                    for model, patch in (("empty", ""), ("garbage", "not a diff\n"))
                ]
                rows = await bob.results("peek")
            for _ in range(100):
                if len(announced) == 2:
                    break
                await asyncio.sleep(0.05)
        finally:
            await nc.close()
    assert [r["verdict"] for r in reports] == ["empty-patch", "malformed-patch"], reports
    assert len(rows) == 2 and len(announced) == 2
    for seen in (*map(json.dumps, reports), json.dumps(rows), *(data.decode() for _, data in announced)):
        assert "hidden_hotspot_7f3a" not in seen and "hidden_7f3a.h" not in seen, seen
    on_disk = json.loads((runs / "bob.peek" / "empty" / iid / "report.json").read_text())
    assert on_disk["files"] == [HOTSPOT, "include/hidden_7f3a.h"]


# ------------------------------------------------------------------- one id, another patch
async def test_a_new_patch_for_an_id_gets_its_own_report_and_announcement(
    secured: SecuredBus, evaluator: tuple[ServiceContext, FakeOps]
) -> None:
    """An agent asks for one (run, model, instance) with patch A, then B, then A again (the CLI's
    `evaluate --predictions` run again after editing a prediction). Each patch's report is that
    patch's: `wait` took whatever report the id had, so B was answered at once with A's verdict
    (and `keep_reports` wrote it as B's), and A again was a JetStream duplicate of the first A
    (`Nats-Msg-Id` from agent, ids and patch, 24 h window): nothing queued, B's verdict returned;
    and each evaluation is announced, where the announcement's id (the evaluation id) made every
    one after the first a duplicate, dropped by JetStream."""
    from cppperf.client import evaluate_predictions
    from cppperf.services.evaluator.pipeline import patch_sha256

    _, ops = evaluator
    nc, announced = await announcements_to(secured, "alice")
    try:
        async with await AgentClient.connect(secured.url, secured.creds("alice")) as alice:
            seen = []
            for patch in ("slow a", "fast b", "slow a"):
                row = {"instance_id": INSTANCE, "model_name_or_path": "m", "model_patch": patch}
                async with asyncio.timeout(30):
                    (report,) = await evaluate_predictions(alice, [row], "again", poll=0.05)
                seen.append((report["verdict"], report["patch_sha256"] == patch_sha256(patch)))
            again = await alice.submit(INSTANCE, "slow a", run_id="again", model="m")  # the stored one
        for _ in range(100):
            if len(announced) >= 3:
                break
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    assert seen == [("correct", True), ("opt", True), ("correct", True)]
    assert [r.patch for r in ops.ran] == ["slow a", "fast b", "slow a"]
    assert again.endswith(INSTANCE) and len(ops.ran) == 3  # answered from the store, nothing queued
    assert [json.loads(data)["verdict"] for _, data in announced] == ["correct", "opt", "correct"]


class _Stopped(Exception):
    pass


def test_two_evaluations_of_one_id_never_share_a_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workspace (exported trees, builds) was `work_dir/eval/<hash of the evaluation id>`, and
    the id is the agent's to repeat: bob sends patches A and B for one (run, model, instance) at
    once, and evaluator processes sharing a work dir (a supported setup: `builder.work_dir`) take
    one each — both in one folder, B's build (its tree writable while it builds) rewriting the
    binaries A's correctness or timed runs execute, one's cleanup removing the other's trees. Each
    evaluation now has a folder of its own; nothing of it outlives it."""
    from cppperf.services.evaluator import pipeline
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, evaluator={"runs_dir": str(tmp_path / "runs")})
    workspaces: list[Path] = []

    def backend(_cfg: object, ws: Path, **_kw: object) -> None:
        assert ws.parent == settings.work_dir() / "eval"
        workspaces.append(ws)
        raise _Stopped

    monkeypatch.setattr(pipeline, "make_backend", backend)
    monkeypatch.setattr(pipeline, "ensure_local", lambda *_a: tmp_path / "mirror")
    monkeypatch.setattr(pipeline, "jail_problem", lambda: None)
    inst = eval_instance(instance_id=INSTANCE, repo="local/demo")
    for body in ("a", "b", "a"):
        patch = f"--- a/src/x.cpp\n+++ b/src/x.cpp\n@@ -1 +1 @@\n-int x;\n+int {body};\n"
        req = EvalRequest(run_id="bob.r", model="m", instance_id=INSTANCE, patch=patch, for_agent=True)
        with pytest.raises(_Stopped):
            pipeline.evaluate_report(req, settings, instance=inst, force=True)
    assert len(set(workspaces)) == 3, workspaces
    assert not any(ws.exists() for ws in workspaces)
    assert list((settings.work_dir() / "eval").iterdir()) == []  # nor their lock files


FLOODER = """
import asyncio, sys, time
import nats
from cppperf.shared.bus import credential_options

async def main(url, creds, seconds):
    conns = [await nats.connect(url, allow_reconnect=False, pending_size=64 * 1024 * 1024,
                                **credential_options(creds)) for _ in range(15)]
    body, end = b'{"id":"bob.x"}', time.monotonic() + seconds
    async def flood(nc):
        while time.monotonic() < end:
            for _ in range(500):
                await nc.publish("eval.api.bob.result", body)
            await asyncio.sleep(0)
    await asyncio.gather(*(flood(nc) for nc in conns), return_exceptions=True)

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


@pytest.mark.slow
async def test_one_agents_flood_of_its_own_subject_does_not_silence_the_api_for_another(
    secured: SecuredBus, evaluator: Any
) -> None:
    """NATS has no ingress rate limit: within its account's 16 connections bob can publish tiny
    requests on its own `eval.api.bob.result` faster than any evaluator reads them (a process
    of its own here, ~100 000+ a second). With every agent's requests on one connection the
    server closed it as a slow consumer and alice got NoResponders or timeouts for as long as
    bob went on (2 of 34 answered). Each partition of the agents has a connection of its own
    (`messages.api_partition`; alice and bob are in different ones): alice is answered
    throughout, and her partition's connection is never closed."""
    import subprocess
    import sys

    assert m.api_partition("alice") != m.api_partition("bob")
    seconds = 8.0
    flooder = subprocess.Popen(
        [sys.executable, "-c", FLOODER, secured.url, secured.creds("bob"), str(seconds)],
    )
    answered: list[float] = []
    failed: list[str] = []
    try:
        async with await AgentClient.connect(secured.url, secured.creds("alice"), request_timeout=5) as alice:
            await asyncio.sleep(1.0)  # the flood is on
            loop = asyncio.get_running_loop()
            while flooder.poll() is None:
                start = loop.time()
                try:
                    assert await alice.results("r") == []
                    answered.append(loop.time() - start)
                except Refused as exc:  # a timeout or no responders
                    failed.append(str(exc))
                await asyncio.sleep(0.25)
    finally:
        flooder.kill()
        flooder.wait()
    # (on 2 busy cores the evaluator reads bob's flood beside alice's requests: seconds, not 5)
    assert len(answered) >= 3 and len(failed) <= 1, (failed, answered)
    assert sorted(answered)[len(answered) // 2] < 3.0, answered  # the median answer


async def test_a_result_id_of_a_megabyte_gets_a_refusal_not_silence(
    secured: SecuredBus, evaluator: Any
) -> None:
    """The answer to `result` echoes the id: an id just under NATS's 1 MiB payload made the answer
    too large to send, and the agent waited out its timeout with no word. Ids longer than any
    evaluation id are refused (one line, without the id); the control, a long but possible id,
    is answered."""
    bob = await as_user(secured, "bob")
    try:
        huge = "bob." + "x" * (1024 * 1024 - 200)
        answer = await ask(bob, "eval.api.bob.result", json.dumps({"id": huge}).encode())
        assert not answer.ok and "none is longer than" in answer.error and len(answer.error) < 200
        answer = await ask(bob, "eval.api.bob.result", json.dumps({"id": "bob.r/m/" + "y" * 200}).encode())
        assert answer.ok and answer.status == "lost"
    finally:
        await bob.close()
