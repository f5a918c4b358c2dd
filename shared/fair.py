"""Fair scheduling of a per-agent work queue (`eval.requested`): agents take turns.

One durable pull consumer per agent (`<durable>-<agent>`, filter `<subject>.<agent>`) beside the
bare subject's (`<durable>`, filter `<subject>`): the filters never overlap, as a work-queue
stream requires. Each turn the scheduler reads which subjects hold messages (one
`stream_info(subjects_filter=…)`), and pulls one message from the queue with work that was served
least recently (never-served first, ties by name); so an agent with 16 requests queued gets one
served, then every other waiting agent gets one, and so on. An agent's consumer is created the
first time its subject holds a message: agents added while the service runs are served without a
restart.

The message is handled by `shared.worker.handle` exactly like any other work queue's (heartbeats,
ack/nak/term, `max_deliver`, dead letters). Rejected: nak-with-delay to defer a busy agent (each
deferral is a delivery counted toward `max_deliver`), and one consumer over `<subject>.>` beside
the per-agent ones (the server refuses overlapping filters on a work queue).

The scheduler stands in for a FastStream subscriber in `ServiceContext.liveness` (`running`,
`tasks`): the health probe and `runtime.stop_consuming` treat it like one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import nats.errors
from nats.js.errors import NotFoundError

from cppperf.shared.bus import AWAY_ERRORS, WORK_QUEUES, WorkQueue
from cppperf.shared.logging import get_logger
from cppperf.shared.service import handle_tracked
from cppperf.shared.tasks import stop_task

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from cppperf.shared.health import Tracked
    from cppperf.shared.service import ServiceContext

log = get_logger(__name__)
M = TypeVar("M", bound=msgspec.Struct)
Key = str | None  # an agent's name; None for the bare subject
FETCH_WAIT = 0.2  # seconds a pull waits on a queue whose messages are all in flight elsewhere


def turn_order(waiting: Iterable[Key], last_served: Mapping[Key, float]) -> list[Key]:
    """The queues with work, least recently served first (never served first, then by name)."""
    return sorted(waiting, key=lambda k: (last_served.get(k, 0.0), k or ""))


class FairQueue:
    """Serves one per-agent work queue, one message at a time, agents in turn."""

    def __init__(
        self,
        ctx: ServiceContext,
        q: WorkQueue,
        *,
        service: str,
        typ: type[M],
        work: Callable[[M], Awaitable[None]],
        idle: float = 0.5,
    ) -> None:
        self.ctx = ctx
        self.q = q
        self.service = service
        self.typ: type[Any] = typ
        self.work: Callable[[Any], Awaitable[None]] = work
        self.idle = idle
        self.running = True
        self.tasks: list[asyncio.Task[None]] = []
        self.last_served: dict[Key, float] = {}
        self._subs: dict[Key, Any] = {}  # nats-py PullSubscription per queue
        self.tracked: Tracked | None = None

    def start(self) -> None:
        self.tasks.append(asyncio.create_task(self._loop(), name=f"fair-{self.q.stream}"))

    async def close(self) -> None:
        self.running = False
        for task in self.tasks:
            await stop_task(task)
        for sub in self._subs.values():
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    async def _loop(self) -> None:
        while self.running:
            try:
                served = await self.serve_one()
            except AWAY_ERRORS:
                served = False  # the server is away (nats-py reconnects): try again later
            except NotFoundError:
                served = False  # the stream is gone: the health probe re-creates it
            except Exception as exc:  # e.g. a consumer the server refused: logged, tried again
                log.warning("fair_pull_failed", stream=self.q.stream, error=str(exc) or type(exc).__name__)
                served = False
            if self.tracked is not None:
                self.tracked.last_fetch = time.monotonic()
            if not served:
                await asyncio.sleep(self.idle)

    async def serve_one(self) -> bool:
        """Pull and handle one message, the next queue's in turn; False when none was waiting."""
        bus = self.ctx.bus
        waiting = self.q.waiting(await bus.subject_counts(self.q))
        for key in turn_order(waiting, self.last_served):
            if not self.running:
                return False
            msg = await self._fetch(key)
            if msg is None:
                continue  # its messages are being handled by another replica
            self.last_served[key] = time.monotonic()
            await self._handle(msg)
            return True
        return False

    async def _fetch(self, key: Key) -> Any:
        sub = self._subs.get(key)
        if sub is None:
            if await self.ctx.bus.ensure_consumer(self.q, agent=key):
                log.info("agent_consumer_created", stream=self.q.stream, agent=key)
            sub = await self.ctx.bus.js.pull_subscribe_bind(
                durable=self.q.agent_durable(key), stream=self.q.stream
            )
            self._subs[key] = sub
        try:
            msgs = await sub.fetch(1, timeout=FETCH_WAIT)
        except (TimeoutError, nats.errors.TimeoutError):
            return None
        except Exception as exc:  # the consumer was deleted (stream re-created): bind again next turn
            log.warning("agent_consumer_lost", stream=self.q.stream, agent=key, error=str(exc))
            self._subs.pop(key, None)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            return None
        finally:
            if self.tracked is not None:  # the pull loop is alive (health probe), however many agents
                self.tracked.last_fetch = time.monotonic()
        return msgs[0] if msgs else None

    async def _handle(self, msg: Msg) -> None:
        assert self.tracked is not None, "subscribe_fair tracks it"
        await handle_tracked(
            self.tracked,
            msg,
            bus=self.ctx.bus,
            service=self.service,
            subject=self.q.subject,
            typ=self.typ,
            work=self.work,
        )


def subscribe_fair(
    ctx: ServiceContext,
    *,
    subject: str,
    service: str,
    typ: type[M],
    work: Callable[[M], Awaitable[None]],
) -> FairQueue:
    """`shared.service.subscribe` for a per-agent queue: agents served in turn (started now)."""
    q = WORK_QUEUES[subject]
    assert q.per_agent, subject
    fair = FairQueue(ctx, q, service=service, typ=typ, work=work)
    fair.tracked = ctx.liveness.track(subject, service, fair, pull_timeout=fair.idle + FETCH_WAIT)
    fair.start()
    return fair
