"""What every service's `app.py` gets: settings, bus, store, output dir; and `subscribe`, the one
way a service attaches a handler to its work queue (FastStream pull subscriber, manual acks, our
ack/heartbeat/dead-letter policy from `shared.worker`). Each subscriber is tracked in
`ctx.liveness` (health probe, in-flight count, abort on shutdown: `runtime.stop_consuming`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.aio.msg import Msg

from cppperf.shared.bus import WORK_QUEUES, Bus
from cppperf.shared.health import Liveness, Tracked
from cppperf.shared.settings import Settings
from cppperf.shared.store import Store
from cppperf.shared.worker import handle

M = TypeVar("M", bound=msgspec.Struct)
T = TypeVar("T")


@dataclass
class ServiceContext:
    settings: Settings
    bus: Bus
    store: Store
    liveness: Liveness = field(default_factory=Liveness)

    @property
    def out_dir(self) -> Path:
        return Path(self.settings.out_dir)


def subscribe(
    broker: NatsBroker,
    ctx: ServiceContext,
    *,
    subject: str,
    service: str,
    typ: type[M],
    work: Callable[[M], Awaitable[None]],
    batch_size: int = 1,
) -> None:
    q = WORK_QUEUES[subject]
    pull_timeout = 1.0
    tracked: list[Tracked] = []

    async def on_message(msg: NatsMessage) -> None:
        await handle_tracked(
            tracked[0], msg.raw_message, bus=ctx.bus, service=service, subject=subject, typ=typ, work=work
        )

    on_message.__name__ = f"{service}_{subject.replace('.', '_')}"
    subscriber = broker.subscriber(
        q.subject,
        stream=JStream(q.stream, declare=False),
        durable=q.durable,
        pull_sub=PullSub(batch_size=batch_size, timeout=pull_timeout),
        ack_policy=AckPolicy.MANUAL,
    )
    subscriber(on_message)
    tracked.append(ctx.liveness.track(subject, service, subscriber, pull_timeout))


async def handle_tracked(
    t: Tracked,
    msg: Msg,
    *,
    bus: Bus,
    service: str,
    subject: str,
    typ: type[M],
    work: Callable[[M], Awaitable[None]],
) -> None:
    """One fetched message through `worker.handle`, counted in flight on its subscriber's tracker
    (shutdown waits for it, and aborts it past the grace period); one fetched while shutting down
    is handed straight back."""
    if t.stopping:
        await msg.nak()
        return
    t.in_flight += 1
    try:
        await handle(msg, bus=bus, service=service, subject=subject, typ=typ, work=work, abort=t.abort)
    finally:
        t.in_flight -= 1


def call_soon_from_thread(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the service's event loop from a worker thread and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
