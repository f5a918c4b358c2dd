"""The agents' door on the wire: `eval.api.<agent>.*` as core NATS queue subscriptions
(`evaluator-api`, shared by the evaluator replicas), one per partition of the agents, each on a
connection of its own, answered by `gateway.answer` while evaluations run.

Connections of its own (named `evaluator-api`): the server closes a connection that leaves more
than max_pending (64 MiB) unread, and an agent can send that much faster than any evaluator reads
it (300 requests of 900 kB; or, within its account's 16 connections, ~190 000 tiny requests a
second: NATS has no ingress rate limit). On the connection that carries the evaluator's JetStream
work (pulls, heartbeats, acks, KV) such a close cut the work too; on these it costs only agents'
requests. One per partition of the agents (`messages.API_PARTITIONS`: an agent's import puts its
requests on `eval.api.<partition>.<agent>.<verb>`, the partition fixed by its name), plus one for
the open bus's `eval.api.<agent>.<verb>`: a flood closes only its own partition's connection (it
comes back by itself), and the other partitions' agents are answered meanwhile.

A plain nats-py subscription, not a FastStream subscriber: every request, refused or not, is one
message this process reads and answers in turn, and FastStream's per-message work (~0.5 ms here)
let one agent's burst of 20 000 requests queue ~13 s in front of another agent's request. Here a
request over the agent's rate (`gateway.RateGate`) costs a dictionary lookup and one small reply,
so a flood drains at wire speed and the others' requests are answered in their turn. The body
stays bytes (`gateway.answer` decodes it: no decoder of FastStream's parses an agent's bytes).

Each agent has a lane of its own: the subscription's callback only files a request into its
agent's queue (`LANE_DEPTH` deep: past it the request is refused at once) and one task per agent
answers that agent's requests in order, beside the other agents' tasks (`LANE_BYTES` bounds the
bytes a lane holds too: 64 requests of 900 kB would be 58 MB per agent). A request's cost is not
its count: `results` on a run of 3000 evaluations reads 3000 records (~2.4 s), and while the
callback answered each request itself, ten such requests of bob's (well under his rate) held
every other agent's request longer than its reply route lives (`response_threshold`): alice got
no answer at all. Now they hold only bob's own lane.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import MaxPayloadError

from cppperf.services.evaluator import gateway
from cppperf.shared import messages as m
from cppperf.shared.bus import Bus, TolerantClient
from cppperf.shared.logging import get_logger
from cppperf.shared.service import ServiceContext
from cppperf.shared.tasks import stop_task

log = get_logger(__name__)
QUEUE = "evaluator-api"
# what the subscription may hold unread before nats-py drops (a slow consumer): a flood past
# this is dropped unanswered (its reply routes expire on the server: `response_threshold`)
PENDING_MSGS = 20_000
PENDING_BYTES = 64 * 1024 * 1024
# requests, and bytes of them, one agent may have waiting for its lane's answer; the next is
# refused at once (a lane holds what nats-py's pending limits no longer count)
LANE_DEPTH = 64
LANE_BYTES = 4 * 1024 * 1024


class AgentApi:
    """Serves the agents' API (`subjects()`) from `start()` until `close()`."""

    def __init__(self, ctx: ServiceContext, gate: gateway.RateGate | None) -> None:
        self.ctx = ctx
        self.gate = gate
        self.buses: list[Bus] = []  # one connection per subject of `subjects()`
        self.subs: list[Subscription] = []
        self.task: asyncio.Task[None] | None = None
        self.lanes: dict[str, asyncio.Queue[Msg]] = {}  # agent -> its requests not answered yet
        self.workers: dict[str, asyncio.Task[None]] = {}  # agent -> the task answering its lane
        self.lane_bytes: dict[str, int] = {}  # agent -> bytes of the requests in its lane

    def start(self) -> None:
        self.task = asyncio.create_task(self._subscribe(), name="evaluator-api")

    def problem(self) -> str | None:  # noqa: PLR0911 - one reason per state
        """None while the agents' API is subscribed and read (one partition's connection may be
        reconnecting: a flood does that), else why not (a
        check of the evaluator's heartbeat: `register` adds it to `ctx.liveness`)."""
        task = self.task
        if task is None:
            return "agents' API (eval.api) not started"
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            return f"agents' API (eval.api) cannot subscribe: {str(exc) or type(exc).__name__}"
        if len(self.subs) < len(subjects()):
            return "agents' API (eval.api) connecting"
        for bus, subject in zip(self.buses, subjects(), strict=True):
            if bus.nc.is_closed:
                return f"agents' API connection (evaluator-api, {subject}) closed: agents get no answer"
            if isinstance(bus.nc, TolerantClient) and bus.nc.is_connected and not bus.nc.reading:
                # connected, but nothing is read any more (nats-py's read loop ended at an exception)
                return (
                    f"agents' API connection (evaluator-api, {subject}) stopped reading: agents get no answer"
                )
        # one partition's connection away is what an agent's flood does to it (the server cuts a
        # slow consumer; nats-py reconnects): not a reason to restart the evaluator, which would
        # stop every other partition and the evaluations in progress. All of them away is.
        if all(not bus.nc.is_connected for bus in self.buses):
            return "agents' API connections (evaluator-api) down (reconnecting)"
        return None

    async def subscribed(self) -> None:
        """Returns once the subscription is in place (raises what subscribing raised; the next
        call, `run_services` retrying, subscribes afresh)."""
        if self.task is not None and self.task.done() and not self.task.cancelled() and self.task.exception():
            self.start()
        if self.task is not None:
            await asyncio.shield(self.task)

    async def _subscribe(self) -> None:
        try:
            for subject in subjects():
                parts = subject.split(".")  # evaluator-api-p3: which partition's connection a log line names
                name = f"{QUEUE}-{parts[2]}" if len(parts) == 5 else QUEUE
                bus = await Bus.connect(self.ctx.bus.url, self.ctx.bus.settings, name=name)
                self.buses.append(bus)
                sub = await bus.nc.subscribe(
                    subject,
                    queue=QUEUE,
                    cb=self.on_request,
                    pending_msgs_limit=PENDING_MSGS,
                    pending_bytes_limit=PENDING_BYTES,
                )
                self.subs.append(sub)
        except BaseException:
            await self._close_buses()  # the next try dials afresh
            raise

    async def on_request(self, msg: Msg) -> None:
        """File the request into its agent's lane (a subject that names no agent is refused here)."""
        who = gateway.agent_of(msg.subject)
        if who is None:
            await self.serve(msg)
            return
        agent = who[0]
        if self.gate is not None and not self.gate.allow(agent):  # over its rate: refused at once
            await self._respond(msg, gateway.too_fast(self.gate, agent))
            return
        lane = self.lanes.get(agent)
        if lane is None:
            lane = self.lanes[agent] = asyncio.Queue(maxsize=LANE_DEPTH)
            self.workers[agent] = asyncio.create_task(self._drain(agent, lane), name=f"evaluator-api-{agent}")
        held = self.lane_bytes.get(agent, 0)
        if lane.full() or (held and held + len(msg.data) > LANE_BYTES):
            await self._respond(
                msg,
                gateway.refused(
                    f"{lane.qsize()} requests ({held} bytes) of {agent} wait for an answer: slow down"
                ),
            )
            return
        self.lane_bytes[agent] = held + len(msg.data)
        lane.put_nowait(msg)

    async def _drain(self, agent: str, lane: asyncio.Queue[Msg]) -> None:
        while True:
            msg = await lane.get()
            try:
                await self.serve(msg, gated=True)
            finally:
                self.lane_bytes[agent] -= len(msg.data)

    async def serve(self, msg: Msg, *, gated: bool = False) -> None:
        """Answer one request (`gated`: its rate was checked when it was filed)."""
        try:
            reply = await gateway.answer(self.ctx, msg.subject, msg.data, None if gated else self.gate)
        except Exception as exc:  # a bus error mid-answer: the agent gets a refusal, not silence
            log.warning("agent_request_failed", subject=msg.subject[:200], error=str(exc))
            reply = gateway.refused("the evaluator cannot serve this request now: ask again")
        await self._respond(msg, reply)

    @staticmethod
    async def _respond(msg: Msg, reply: m.AgentAnswer) -> None:
        if not msg.reply:  # NATS's reply subject: back into the asker's own account, whatever the body says
            return
        try:
            await msg.respond(m.encode(reply))
        except MaxPayloadError:  # an answer too large to send gets a short refusal, not silence
            log.warning("agent_answer_too_large", subject=msg.subject[:200])
            with contextlib.suppress(Exception):
                too_large = gateway.refused("the answer is larger than a message may be: ask for less")
                await msg.respond(m.encode(too_large))
        except Exception:  # noqa: S110 - the connection is away: the agent's request times out
            pass

    async def close(self) -> None:
        if self.task is not None:
            await stop_task(self.task)
        for sub in self.subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self.subs.clear()
        for worker in self.workers.values():  # after the subscriptions: no request opens a lane now
            await stop_task(worker)
        self.workers.clear()
        self.lanes.clear()
        self.lane_bytes.clear()
        await self._close_buses()

    async def _close_buses(self) -> None:
        self.subs.clear()
        buses, self.buses = self.buses, []
        for bus in buses:
            await bus.close()


def subjects() -> list[str]:
    """What the API subscribes to, each on a connection of its own: every partition of the
    agents (a secured bus), then the open bus's `eval.api.<agent>.<verb>`."""
    return [f"{m.EVAL_API}.p{i}.*.*" for i in range(m.API_PARTITIONS)] + [f"{m.EVAL_API}.*.*"]
