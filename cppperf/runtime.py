"""Run services in this process on a (possibly embedded) NATS: used by `mine` and `serve`.

Reliability (README "Failure behaviour"): both connections (the bus's and FastStream's) retry
for ever while NATS is away and consumers resume when it is back; a liveness probe writes each
service's heartbeat file (`shared/health.py`); `run` turns SIGTERM/SIGINT into a graceful stop:
no new pulls, in-flight work gets `bus.stop_grace` seconds to finish and is nak'ed after that,
embedded nats-server stopped. Read-only commands connect with `owner=False`: they never change
a consumer's configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats.errors
from faststream.nats import NatsBroker

from cppperf.shared.bus import Bus, credential_options, servers, until_ready
from cppperf.shared.embedded import EmbeddedNats, running_url, stop_all
from cppperf.shared.health import Liveness, heartbeat_loop
from cppperf.shared.logging import get_logger, register_url
from cppperf.shared.provision import require_provisioned
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import Settings
from cppperf.shared.store import Store
from cppperf.shared.tasks import stop_task

CONSUMING_SERVICES = ("filter", "classifier", "builder")
ALL_SERVICES = ("crawler", "filter", "classifier", "builder", "evaluator")
NOT_YET: dict[str, str] = {}

log = get_logger(__name__)
T = TypeVar("T")


@contextlib.contextmanager
def nats_endpoint(settings: Settings, *, attach: bool = False) -> Iterator[str]:
    """The configured NATS URL, or an embedded nats-server for the duration of the block. With
    `attach` (read-only verbs), the embedded server another process already runs on this
    output folder's store, found by the address it wrote beside the store."""
    if settings.nats_url:
        register_url(settings.nats_url)
        yield settings.nats_url
        return
    if attach and (url := running_url(settings.nats_data_dir())) is not None:
        yield url
        return
    with EmbeddedNats(settings.nats_data_dir()) as server:
        yield server.url


@contextlib.asynccontextmanager
async def connect(
    settings: Settings,
    url: str,
    *,
    owner: bool = False,
    services: list[str] | None = None,
    wait: bool = False,
) -> AsyncIterator[ServiceContext]:
    """Bus + store. `owner=True` (services) applies the configuration of the consumers of
    `services` (all when None); the default (read-only commands) only creates missing streams
    and never changes a consumer. On a bus the admin provisions (`BusSettings.self_provisioning`
    false) nothing is created but consumers: a missing stream or bucket is `NotProvisioned`.
    `wait` (services): a JetStream that does not answer yet (a cluster still electing its meta
    leader, or busy creating R=3 streams) is waited for (`until_ready`) instead of failing."""
    bus = await Bus.connect(url, settings.bus)
    try:

        async def provisioned() -> Store:
            if not bus.provisioning:  # a secured bus: only `cppperf bus provision` creates streams
                await require_provisioned(bus.js)
            await bus.provision(owner=owner, services=services)
            return await Store.open(
                bus.js,
                replicas=settings.bus.replicas,
                kv_max_bytes=settings.bus.kv_max_bytes,
                blob_max_bytes=settings.bus.blob_max_bytes,
                create=bus.provisioning,
            )

        store = await (
            until_ready(provisioned, bus, wait=settings.bus.reconnect_wait) if wait else provisioned()
        )
        yield ServiceContext(settings=settings, bus=bus, store=store)
    finally:
        await bus.close()


class BrokerLog:
    """FastStream's logger protocol onto the project's structlog configuration, so connection
    losses and handler errors FastStream sees are logged, not swallowed."""

    def __init__(self) -> None:
        self._log = get_logger("faststream")

    def log(self, level: int, msg: Any, /, *, exc_info: Any = None, extra: Any = None) -> None:
        if level < logging.WARNING:
            return  # per-message "Received"/"Processed" lines: our handlers log one summary each
        fields = {k: v for k, v in dict(extra or {}).items() if isinstance(v, str | int | float) and v != ""}
        text = str(msg)
        if text.startswith("Connection broken with"):
            # nats-py's reconnect attempts while a server restarts (its error callback through
            # FastStream): one line naming the error, no traceback; nats_reconnected follows
            self._log.log(
                level, "broker_connection_error", error=text.removeprefix("Connection broken with ")
            )
            return
        if "raised an exception, retrying" in text and isinstance(exc_info, BaseException):
            # FastStream restarts a pull loop whose fetch failed (nats-py's TimeoutError while the
            # server is away or slow): one line naming the error, no traceback — nothing is lost
            quiet = isinstance(exc_info, TimeoutError | nats.errors.TimeoutError)
            self._log.log(
                logging.INFO if quiet else logging.WARNING,
                "pull_loop_restarted",
                task=text.split(" raised", 1)[0],
                error=f"{type(exc_info).__name__}: {exc_info}".rstrip(": "),
                **fields,
            )
            return
        self._log.log(level, text, exc_info=exc_info, **fields)


@dataclass
class Running:
    ctx: ServiceContext
    broker: NatsBroker
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


def make_broker(settings: Settings, url: str) -> NatsBroker:
    """A FastStream broker that reconnects for as long as NATS is away."""
    return NatsBroker(
        servers(url),
        logger=BrokerLog(),
        max_reconnect_attempts=-1,
        reconnect_time_wait=settings.bus.reconnect_wait,  # type: ignore[arg-type]  # nats-py sleeps a float
        graceful_timeout=settings.bus.stop_grace,
        connect_timeout=5,
        **broker_credentials(settings.bus.creds, settings.bus.nkey_seed),
    )


def broker_credentials(creds: str, nkey_seed: str = "") -> dict[str, Any]:
    """FastStream's form of `credential_options` (its `security=` object for an NKey seed)."""
    opts = credential_options(creds, nkey_seed)
    if "nkeys_seed_str" not in opts:
        return opts
    from faststream.nats.security import NatsNKey

    return {**opts, "nkeys_seed_str": None, "security": NatsNKey.from_seed(opts["nkeys_seed_str"])}


Register = Callable[[NatsBroker, ServiceContext], Any]


@contextlib.asynccontextmanager
async def run_services(
    settings: Settings, url: str, services: list[str], *, register: dict[str, Register] | None = None
) -> AsyncIterator[Running]:
    """Start the consuming services named in `services` on one broker; stop them on exit.
    `register` replaces a service's wiring (tests: a builder with a stand-in build)."""
    from cppperf.services.builder import app as builder_app
    from cppperf.services.classifier import app as classifier_app
    from cppperf.services.evaluator import app as evaluator_app
    from cppperf.services.filter import app as filter_app

    wiring: dict[str, Register] = {
        "filter": filter_app.register,
        "classifier": classifier_app.register,
        "builder": builder_app.register,
        "evaluator": evaluator_app.register,
        **(register or {}),
    }
    async with connect(settings, url, owner=True, services=services, wait=True) as ctx:
        broker = make_broker(settings, url)
        closers = []
        for name in ("filter", "classifier", "builder", "evaluator"):
            if name not in services:
                continue
            made = wiring[name](broker, ctx)  # what a service returns owns its startup and close
            if hasattr(made, "close"):
                closers.append(made)
            if hasattr(made, "startup"):  # the builder's worker lease is a KV write: the claims
                # bucket of a new cluster may still be electing its leader
                await until_ready(made.startup, ctx.bus, wait=settings.bus.reconnect_wait)
        await broker.start()
        ctx.liveness.attach_all()
        running = Running(ctx, broker)
        running.tasks.append(
            asyncio.create_task(
                heartbeat_loop(
                    ctx.bus,
                    ctx.liveness,
                    services=[s for s in services if s != "crawler"],
                    health_dir=settings.health_path(),
                    interval=settings.bus.health_interval,
                    broker_connected=lambda: _broker_connected(broker),
                )
            )
        )
        try:
            yield running
        finally:
            await stop_consuming(running, grace=settings.bus.stop_grace)
            for c in closers:
                await c.close()


def _broker_connected(broker: NatsBroker) -> bool:
    conn = getattr(broker, "_connection", None)
    return bool(conn is not None and conn.is_connected)


async def stop_consuming(running: Running, *, grace: float) -> None:
    """Stop pulling; let in-flight work finish for `grace` seconds, then abort (nak) the rest."""
    live = running.ctx.liveness
    for t in live.trackers:
        t.stopping = True
        t.subscriber.running = False  # the pull loop ends after its current fetch
    if live.in_flight:
        log.info("stopping_wait_in_flight", in_flight=live.in_flight, grace=grace)
    await _wait_idle(live, grace)
    if live.in_flight:
        log.warning("stopping_abort_in_flight", in_flight=live.in_flight)
        for t in live.trackers:
            t.abort.set()
        await _wait_idle(live, 10.0)
    for task in running.tasks:
        await stop_task(task)
    with contextlib.suppress(Exception):
        await running.broker.stop()


async def _wait_idle(live: Liveness, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while live.in_flight and time.monotonic() < deadline:  # noqa: ASYNC110 - a counter many handlers share
        await asyncio.sleep(0.05)


class _CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor (`asyncio.to_thread`), knowing whether work is still running."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="cppperf-work")
        self.pending: set[Future[Any]] = set()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        fut = super().submit(fn, *args, **kwargs)
        self.pending.add(fut)
        fut.add_done_callback(self.pending.discard)
        return fut


async def unless_stopped_early(
    body: Coroutine[Any, Any, None], stop: asyncio.Event, *, started: asyncio.Event, grace: float
) -> None:
    """Run `body` (a service: connect, then consume until `stop`). A stop that comes before it has
    `started` (still connecting to a bus that is not there: nats-py retries forever) cancels it at
    once, as nothing is in flight yet; after that it gets `grace` (plus time to close) to finish
    by itself, then it is cancelled, so a stop always ends within the grace period."""
    task = asyncio.ensure_future(body)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            if started.is_set():
                await asyncio.wait({task}, timeout=grace + 10.0)
            if not task.done():
                log.warning("stop_cancelling", connected=started.is_set())
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return
        await task
    finally:
        stopped.cancel()


def run(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, T]],
    *,
    announce: Callable[[signal.Signals], None] | None = None,
) -> T:
    """`asyncio.run(main(stop))` where SIGTERM/SIGINT set `stop` (a second signal cancels at once);
    `announce(sig)` runs at once on the first signal (the CLI prints what it waits for).

    `main` should return soon after `stop` is set (leaving `run_services` does the graceful
    part). If worker threads are still busy after that (a build's subprocesses past the grace
    period, already nak'ed), the embedded server is stopped and the process exits without
    waiting for them: their claims expire and another worker redoes the job."""
    executor = _CountingExecutor()
    signalled: list[int] = []
    forced: list[int] = []

    async def wrapper() -> T:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(executor)
        stop = asyncio.Event()
        me = asyncio.current_task()

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set() and me is not None:
                log.warning("stop_now", signal=sig.name)
                forced.append(int(sig))
                me.cancel()
                return
            log.warning("stopping", signal=sig.name)
            if announce is not None:
                announce(sig)
            signalled.append(int(sig))
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await main(stop)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if executor.pending and signalled:
                log.warning("exit_abandoning_work", threads=len(executor.pending))
                stop_all()
                sys.stderr.flush()
                os._exit(0 if signalled else 1)

    try:
        return asyncio.run(wrapper())
    except asyncio.CancelledError:
        if not forced:
            raise
        # a second signal: stop now, one line (no traceback), the shell's code for that signal
        stop_all()
        sys.stderr.flush()
        raise SystemExit(128 + forced[-1]) from None
