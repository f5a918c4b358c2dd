"""Liveness: is this service really consuming? Probed in-process, published as a heartbeat file.

A service is healthy when its NATS connections are up, every subscriber's pull loop is running
and has returned from a fetch recently (or is busy with a message), its durable consumer
answers on the server, and every check it added (`Liveness.check`: the evaluator's agents' API on
its own connection) passes. The probe runs every `bus.health_interval` seconds and writes
`<health_dir>/<service>.json` (`{"ok", "reason", "at", "pid", "subscribers", "checks"}`) atomically;
`cppperf health SERVICE --max-age S` reads it: unhealthy when `ok` is false or the file is older
than S seconds (the process is hung or gone). A probe that finds the durable consumer missing
re-creates it once with a `consumer_reprovisioned` log line (the service owns its consumer).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.js.errors import NotFoundError

from cppperf.shared.bus import WORK_QUEUES, Bus
from cppperf.shared.logging import get_logger

log = get_logger(__name__)

DEFAULT_MAX_AGE = 60.0


@dataclass
class Tracked:
    """One subscriber: its FastStream object, when its pull loop last returned, what it holds."""

    subject: str
    service: str
    subscriber: Any  # faststream PullStreamSubscriber (untyped library object)
    pull_timeout: float
    last_fetch: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    stopping: bool = False
    abort: asyncio.Event = field(default_factory=asyncio.Event)

    def attach(self) -> None:
        """Wrap the started subscription's `fetch` to note each return of the pull loop."""
        sub = getattr(self.subscriber, "subscription", None)
        if sub is None or getattr(sub, "_cppperf_tracked", False):
            return
        original = sub.fetch

        async def fetch(*args: Any, **kwargs: Any) -> Any:
            try:
                return await original(*args, **kwargs)
            finally:
                self.last_fetch = time.monotonic()

        sub.fetch = fetch
        sub._cppperf_tracked = True

    def problem(self, now: float) -> str | None:
        if not getattr(self.subscriber, "running", False):
            return f"{self.subject}: subscriber stopped"
        tasks = list(getattr(self.subscriber, "tasks", []) or [])
        if not tasks or all(t.done() for t in tasks):
            return f"{self.subject}: pull loop is not running"
        quiet = now - self.last_fetch
        if self.in_flight == 0 and quiet > 3 * self.pull_timeout + 5:
            return f"{self.subject}: no fetch for {quiet:.0f}s"
        return None


@dataclass(frozen=True)
class Check:
    """Something of one service outside its subscribers that must work for it to be healthy (a
    connection of its own): `problem()` is None when it does, else why not."""

    service: str
    name: str
    problem: Callable[[], str | None]


@dataclass
class Liveness:
    trackers: list[Tracked] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    def track(self, subject: str, service: str, subscriber: Any, pull_timeout: float) -> Tracked:
        t = Tracked(subject, service, subscriber, pull_timeout)
        self.trackers.append(t)
        return t

    def check(self, service: str, name: str, problem: Callable[[], str | None]) -> Check:
        """Add `problem` to `service`'s health: its heartbeat is unhealthy while it says why."""
        c = Check(service, name, problem)
        self.checks.append(c)
        return c

    def states(self, service: str) -> list[tuple[str, str | None]]:
        """(name, problem or None) of each of `service`'s checks; a check that raises says so."""
        states: list[tuple[str, str | None]] = []
        for c in self.checks:
            if c.service != service:
                continue
            try:
                states.append((c.name, c.problem()))
            except Exception as exc:
                states.append((c.name, f"{c.name}: check failed: {str(exc) or type(exc).__name__}"))
        return states

    @property
    def in_flight(self) -> int:
        return sum(t.in_flight for t in self.trackers)

    def attach_all(self) -> None:
        for t in self.trackers:
            t.attach()


async def probe(bus: Bus, liveness: Liveness, *, broker_connected: bool) -> str | None:
    """None when healthy, else the first reason it is not."""
    if not bus.nc.is_connected:
        return "NATS connection down (reconnecting)"
    if not broker_connected:
        return "consumer connection down (reconnecting)"
    now = time.monotonic()
    for t in liveness.trackers:
        why = t.problem(now)
        if why:
            return why
        q = WORK_QUEUES[t.subject]
        try:
            await bus.js.consumer_info(q.stream, q.durable, timeout=5)
        except NotFoundError:
            log.warning("consumer_reprovisioned", stream=q.stream, consumer=q.durable)
            await bus.provision_streams()
            await bus.ensure_consumer(q)
        except Exception as exc:
            return f"{t.subject}: consumer info failed: {str(exc) or type(exc).__name__}"
    return None


def heartbeat_path(health_dir: Path, service: str) -> Path:
    return health_dir / f"{service}.json"


def write_heartbeat(health_dir: Path, service: str, reason: str | None, liveness: Liveness) -> str | None:
    """`service`'s heartbeat: unhealthy for the process-wide `reason`, else for the first of its
    own checks that fails (returned); each check's state is listed under `checks`."""
    health_dir.mkdir(parents=True, exist_ok=True)
    now = time.monotonic()
    states = liveness.states(service)
    reason = reason or next((why for _, why in states if why), None)
    data = {
        "service": service,
        "ok": reason is None,
        "reason": reason or "",
        "at": time.time(),
        "pid": os.getpid(),
        "subscribers": [
            {"subject": t.subject, "in_flight": t.in_flight, "last_fetch_age": round(now - t.last_fetch, 1)}
            for t in liveness.trackers
        ],
        "checks": [{"name": name, "ok": why is None, "reason": why or ""} for name, why in states],
    }
    path = heartbeat_path(health_dir, service)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    return reason


async def heartbeat_loop(
    bus: Bus,
    liveness: Liveness,
    *,
    services: list[str],
    health_dir: Path,
    interval: float,
    broker_connected: Any,  # () -> bool
) -> None:
    """Probe and write each service's heartbeat file every `interval` seconds, for ever."""
    last: str | None = ""
    own_last: dict[str, str | None] = {}  # each service's own checks, logged when they change
    while True:
        try:
            liveness.attach_all()
            reason = await probe(bus, liveness, broker_connected=bool(broker_connected()))
        except Exception as exc:
            reason = f"probe failed: {str(exc) or type(exc).__name__}"
        if reason != last:
            (log.info if reason is None else log.warning)("liveness", healthy=reason is None, reason=reason)
            last = reason
        for service in services:
            try:
                said = write_heartbeat(health_dir, service, reason, liveness)
            except OSError:
                continue
            own = said if reason is None else own_last.get(service)
            if own != own_last.get(service):
                (log.info if own is None else log.warning)(
                    "liveness", service=service, healthy=own is None, reason=own
                )
                own_last[service] = own
        await asyncio.sleep(interval)


def check(health_dir: Path, service: str, max_age: float = DEFAULT_MAX_AGE) -> tuple[bool, str]:
    """(healthy, one line saying why) from the service's heartbeat file."""
    path = heartbeat_path(health_dir, service)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return False, f"{service}: no heartbeat at {path} (not started, or another CPPPERF_HEALTH_DIR)"
    except (OSError, ValueError, RecursionError) as exc:
        why = "JSON nested too deeply" if isinstance(exc, RecursionError) else exc
        return False, f"{service}: unreadable heartbeat {path}: {why}"
    try:
        age = time.time() - float(data.get("at", 0))
        busy = sum(int(s.get("in_flight", 0)) for s in data.get("subscribers", []))
    except (AttributeError, TypeError, ValueError):  # JSON, but not a heartbeat (an array, a text `at`)
        return False, f"{service}: unreadable heartbeat {path}: not a heartbeat object"
    if age > max_age:
        return False, f"{service}: heartbeat is {age:.0f}s old (max {max_age:.0f}s): hung or stopped"
    if not data.get("ok"):
        return False, f"{service}: {data.get('reason') or 'unhealthy'}"
    return True, f"{service}: consuming ({busy} in flight, heartbeat {age:.0f}s ago)"
