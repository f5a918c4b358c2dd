"""The agents' door on the wire: `eval.api.<agent>.*` as a core NATS queue subscription
(`evaluator-api`, shared by the evaluator replicas) on a connection of its own, answered by
`gateway.answer` while evaluations run.

Its own connection (named `evaluator-api`): the server closes a connection that leaves more than
max_pending (64 MiB) unread, and an agent can send that much faster than any evaluator reads it
(300 requests of 900 kB). On the connection that carries the evaluator's JetStream work (pulls,
heartbeats, acks, KV) such a close cut the work too; on this one it costs only agents' requests,
which the flood had made unanswerable anyway (the connection comes back by itself).

A plain nats-py subscription, not a FastStream subscriber: every request, refused or not, is one
message this process reads and answers in turn, and FastStream's per-message work (~0.5 ms here)
let one agent's burst of 20 000 requests queue ~13 s in front of another agent's request. Here a
request over the agent's rate (`gateway.RateGate`) costs a dictionary lookup and one small reply,
so a flood drains at wire speed and the others' requests are answered in their turn. The body
stays bytes (`gateway.answer` decodes it: no decoder of FastStream's parses an agent's bytes).
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from cppperf.services.evaluator import gateway
from cppperf.shared import messages as m
from cppperf.shared.bus import Bus
from cppperf.shared.logging import get_logger
from cppperf.shared.service import ServiceContext
from cppperf.shared.tasks import stop_task

log = get_logger(__name__)
QUEUE = "evaluator-api"
# what the subscription may hold unread before nats-py drops (a slow consumer): a flood past
# this is dropped unanswered (its reply routes expire on the server: `response_threshold`)
PENDING_MSGS = 20_000
PENDING_BYTES = 64 * 1024 * 1024


class AgentApi:
    """Serves `eval.api.*.*` from `start()` until `close()`."""

    def __init__(self, ctx: ServiceContext, gate: gateway.RateGate | None) -> None:
        self.ctx = ctx
        self.gate = gate
        self.bus: Bus | None = None
        self.sub: Subscription | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._subscribe(), name="evaluator-api")

    def problem(self) -> str | None:
        """None while the agents' API is subscribed on a connected connection, else why not (a
        check of the evaluator's heartbeat: `register` adds it to `ctx.liveness`)."""
        task = self.task
        if task is None:
            return "agents' API (eval.api) not started"
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            return f"agents' API (eval.api) cannot subscribe: {str(exc) or type(exc).__name__}"
        if self.bus is None or self.sub is None:
            return "agents' API (eval.api) connecting"
        if self.bus.nc.is_closed:
            return "agents' API connection (evaluator-api) closed: agents get no answer"
        if not self.bus.nc.is_connected:
            return "agents' API connection (evaluator-api) down (reconnecting)"
        return None

    async def subscribed(self) -> None:
        """Returns once the subscription is in place (raises what subscribing raised; the next
        call, `run_services` retrying, subscribes afresh)."""
        if self.task is not None and self.task.done() and not self.task.cancelled() and self.task.exception():
            self.start()
        if self.task is not None:
            await asyncio.shield(self.task)

    async def _subscribe(self) -> None:
        bus = await Bus.connect(self.ctx.bus.url, self.ctx.bus.settings, name=QUEUE)
        try:
            self.sub = await bus.nc.subscribe(
                f"{m.EVAL_API}.*.*",
                queue=QUEUE,
                cb=self.on_request,
                pending_msgs_limit=PENDING_MSGS,
                pending_bytes_limit=PENDING_BYTES,
            )
        except BaseException:
            await bus.close()  # the next try dials afresh
            raise
        self.bus = bus

    async def on_request(self, msg: Msg) -> None:
        try:
            reply = await gateway.answer(self.ctx, msg.subject, msg.data, self.gate)
        except Exception as exc:  # a bus error mid-answer: the agent gets a refusal, not silence
            log.warning("agent_request_failed", subject=msg.subject[:200], error=str(exc))
            reply = gateway.refused("the evaluator cannot serve this request now: ask again")
        if msg.reply:  # NATS's reply subject: back into the asker's own account, whatever the body says
            with contextlib.suppress(Exception):  # the connection is away: the agent's request times out
                await msg.respond(m.encode(reply))

    async def close(self) -> None:
        if self.task is not None:
            await stop_task(self.task)
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
            self.sub = None
        if self.bus is not None:
            await self.bus.close()
            self.bus = None
