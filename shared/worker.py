"""The ack policy every service handler follows: decode → work (with heartbeats) → ack.

- Malformed payload or `BadInput` → dead letter + term at once (retrying cannot help).
- `TransientError` and unexpected exceptions → nak with an exponentially growing delay
  (`nak_delay` · 2^(attempt-1)); on the last allowed delivery
  → dead letter + term. A delivery beyond `max_deliver` (earlier attempts crashed the process)
  goes straight to the dead-letter queue without running the work again.
- While the work runs, `in_progress()` is sent every `heartbeat` seconds so a long job is never
  redelivered while its worker is alive.
Nothing is dropped silently: every message ends acked or as a `DeadLetter` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal, TypeVar

import msgspec
import structlog
from nats.aio.msg import Msg

from cppperf.shared import messages as m
from cppperf.shared.bus import Bus
from cppperf.shared.errors import BadInput, TransientError
from cppperf.shared.logging import get_logger

log = get_logger(__name__)
M = TypeVar("M", bound=msgspec.Struct)
Outcome = Literal["acked", "nacked", "dead-lettered"]


@contextlib.asynccontextmanager
async def heartbeat(msg: Msg, interval: float) -> AsyncIterator[None]:
    """Send `in_progress()` every `interval` seconds until the block ends."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await msg.in_progress()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _deliveries(msg: Msg) -> int:
    try:
        return int(msg.metadata.num_delivered or 1)
    except Exception:  # a core (non-JetStream) message has no metadata
        return 1


async def handle(
    msg: Msg,
    *,
    bus: Bus,
    service: str,
    subject: str,
    typ: type[M],
    work: Callable[[M], Awaitable[None]],
) -> Outcome:
    """Run `work` on the decoded message with the project's ack/heartbeat/dead-letter policy."""
    settings = bus.settings
    attempt = _deliveries(msg)
    headers = msg.headers or {}
    nats_id = headers.get("Nats-Msg-Id")
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service, subject=subject, attempt=attempt)

    async def to_dlq(error: BaseException | str) -> Outcome:
        await bus.dead_letter(
            subject, msg.data, service=service, error=error, attempts=attempt, msg_id=nats_id
        )
        await msg.term()
        log.warning("dead_lettered", item=nats_id, error=str(error))
        return "dead-lettered"

    if attempt > settings.max_deliver:
        return await to_dlq(
            f"delivery {attempt} exceeds max_deliver={settings.max_deliver} (worker crashed?)"
        )
    try:
        item = m.decode(msg.data, typ)
    except BadInput as exc:
        return await to_dlq(exc)
    item_id = getattr(item, "id", nats_id)
    structlog.contextvars.bind_contextvars(item=item_id)
    try:
        async with heartbeat(msg, settings.effective_heartbeat()):
            await work(item)
    except BadInput as exc:
        return await to_dlq(exc)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await msg.nak()
        raise
    except Exception as exc:
        transient = isinstance(exc, TransientError)
        if attempt >= settings.max_deliver:
            return await to_dlq(exc)
        log.warning(
            "retry_later",
            error=str(exc),
            error_type=type(exc).__name__,
            transient=transient,
            delay=settings.nak_delay,
            exc_info=not transient,
        )
        await msg.nak(delay=settings.nak_delay)
        return "nacked"
    await msg.ack()
    log.info("handled", item=item_id)
    return "acked"
