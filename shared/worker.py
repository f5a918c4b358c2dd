"""The ack policy every service handler follows: decode → work (with heartbeats) → ack.

- Malformed payload, unknown `schema_version` or `BadInput` → dead letter + term at once
  (retrying cannot help).
- `TransientError` and unexpected exceptions → nak with an exponentially growing, capped delay
  (`backoff_delay`: `nak_delay` · 2^(attempt-1), at most `nak_delay_max`), logged with the item
  id and the traceback of unexpected ones; on the `max_deliver`-th delivery → dead letter + term.
  A delivery beyond `max_deliver` (earlier attempts crashed the process) goes straight to the
  dead-letter queue without running the work again.
- While the work runs, `in_progress()` is sent every `heartbeat` seconds so a long job is never
  redelivered while its worker is alive.
- Writing the dead letter can fail (NATS away, object store full): it is retried a few times in
  place, then the message is nak'ed with a delay and logged as `dead_letter_failed`; the
  consumer has no delivery limit of its own, so the message comes back and the dead letter is
  tried again. Nothing is dropped silently: every message ends acked or as a `DeadLetter` with
  the reason.
- Cancellation (SIGTERM past the grace period) naks the message at once for another worker.
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
from cppperf.shared.tasks import sleep_unless, stop_task

log = get_logger(__name__)
M = TypeVar("M", bound=msgspec.Struct)
Outcome = Literal["acked", "nacked", "dead-lettered"]
DLQ_TRIES = 3  # in-place attempts to write a dead letter before nak'ing the message


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Seconds before retry number `attempt` (1-based): base, 2·base, 4·base, … at most `cap`."""
    if base <= 0:
        return 0.0
    exponent = min(max(attempt, 1) - 1, 62)
    return float(min(base * (2**exponent), max(cap, base)))


@contextlib.asynccontextmanager
async def heartbeat(msg: Msg, interval: float) -> AsyncIterator[None]:
    """Send `in_progress()` every `interval` seconds until the block ends."""

    stop = asyncio.Event()

    async def beat() -> None:
        while not await sleep_unless(stop, interval):
            with contextlib.suppress(Exception):
                await msg.in_progress()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        await stop_task(task, stop)


def _deliveries(msg: Msg) -> int:
    try:
        return int(msg.metadata.num_delivered or 1)
    except Exception:  # a core (non-JetStream) message has no metadata
        return 1


def _stream_seq(msg: Msg) -> int | None:
    try:
        seq = msg.metadata.sequence.stream
    except Exception:  # a core (non-JetStream) message has no metadata
        return None
    return int(seq) if seq is not None else None


async def handle(
    msg: Msg,
    *,
    bus: Bus,
    service: str,
    subject: str,
    typ: type[M],
    work: Callable[[M], Awaitable[None]],
    abort: asyncio.Event | None = None,
) -> Outcome:
    """Run `work` on the decoded message with the project's ack/heartbeat/dead-letter policy.
    Never raises except on cancellation: whatever goes wrong is logged with the item id.
    When `abort` is set (shutdown past its grace period) the work is cancelled and the message
    nak'ed at once, so another worker takes it without waiting out `ack_wait`."""
    attempt = _deliveries(msg)
    headers = msg.headers or {}
    nats_id = headers.get("Nats-Msg-Id")
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service, subject=subject, attempt=attempt, item=nats_id)
    try:
        return await _handle(msg, bus=bus, service=service, subject=subject, typ=typ, work=work, abort=abort)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # ack/nak/term themselves failed (NATS away): redelivery follows
        log.exception("handler_failed", item=_item(), error=str(exc) or type(exc).__name__)
        return "nacked"


async def _handle(  # noqa: PLR0911 - one return per ack outcome, in policy order
    msg: Msg,
    *,
    bus: Bus,
    service: str,
    subject: str,
    typ: type[M],
    work: Callable[[M], Awaitable[None]],
    abort: asyncio.Event | None,
) -> Outcome:
    settings = bus.settings
    attempt = _deliveries(msg)
    nats_id = (msg.headers or {}).get("Nats-Msg-Id")

    async def to_dlq(error: BaseException | str) -> Outcome:
        last: Exception | None = None
        for n in range(DLQ_TRIES):
            try:
                await bus.dead_letter(
                    subject,
                    msg.data,
                    service=service,
                    error=error,
                    attempts=attempt,
                    msg_id=nats_id,
                    stream_seq=_stream_seq(msg),
                )
                break
            except Exception as exc:
                last = exc
                await asyncio.sleep(backoff_delay(n + 1, 0.2, 2.0))
        else:
            delay = backoff_delay(attempt, settings.nak_delay, settings.nak_delay_max)
            log.error(
                "dead_letter_failed",
                item=_item(),
                error=str(error),
                dlq_error=str(last) or type(last).__name__,
                retry_in=delay,
            )
            await msg.nak(delay=delay)
            return "nacked"
        await msg.term()
        log.warning("dead_lettered", item=_item(), error=str(error), error_type=_type_name(error))
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
            if not await _run_unless_aborted(work(item), abort):
                with contextlib.suppress(Exception):
                    await msg.nak()
                log.warning("aborted_nacked", reason="shutdown grace period over")
                return "nacked"
    except BadInput as exc:
        return await to_dlq(exc)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await msg.nak()
        log.warning("cancelled_nacked")
        raise
    except Exception as exc:
        transient = isinstance(exc, TransientError)
        if attempt >= settings.max_deliver:
            log.warning(
                "giving_up",
                item=_item(),
                error=str(exc),
                error_type=type(exc).__name__,
                exc_info=not transient,
            )
            return await to_dlq(exc)
        delay = backoff_delay(attempt, settings.nak_delay, settings.nak_delay_max)
        log.warning(
            "retry_later",
            item=_item(),
            error=str(exc),
            error_type=type(exc).__name__,
            transient=transient,
            delay=delay,
            exc_info=not transient,
        )
        await msg.nak(delay=delay)
        return "nacked"
    await msg.ack()
    log.info("handled")
    return "acked"


async def _run_unless_aborted(job: Awaitable[None], abort: asyncio.Event | None) -> bool:
    """Await `job`; False when `abort` was set first (the job is then cancelled)."""
    if abort is None:
        await job
        return True
    task = asyncio.ensure_future(job)
    waiter = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if task.done():
        task.result()  # re-raises the job's exception
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return False


def _item() -> object:
    """The item id bound for this message (explicit in lines that must carry it)."""
    return structlog.contextvars.get_contextvars().get("item")


def _type_name(error: BaseException | str) -> str:
    return type(error).__name__ if isinstance(error, BaseException) else "str"
