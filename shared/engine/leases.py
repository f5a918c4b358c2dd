"""Host-level core leases: which cores time, which build, and who times on which core now.

Every cppperf process on a host (all builder and evaluator replicas, containers included when the
lease directory is a shared volume) takes an exclusive `flock` on `<lease_dir>/core-<n>.lock`
before it times anything on core `n`, and holds it until its measurement ends. Locks belong to
the open file, so they die with the process: a `kill -9`'d replica frees its core at once.

The host's cores are split in two: *timing* cores (leased, one timed test at a time each) and
*build* cores (compiles, test discovery, correctness runs, everything else). Builds never run on
a timing core, so a timed test only shares its core with work that is not ours. Defaults: the
upper half of the cores this process may use time, the rest build (on 2 cores: one each); with
one core both roles share it. `builder.timing_cores` / `builder.build_cores` override.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cppperf.shared.errors import ConfigError, InfraFailure
from cppperf.shared.settings import BuilderSettings

DEFAULT_LEASE_DIR = "/tmp/cppperf-leases"  # noqa: S108 - host-wide on purpose: every replica shares it


@dataclass(frozen=True)
class CorePlan:
    timing: tuple[int, ...]
    build: tuple[int, ...]

    @property
    def all(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.timing) | set(self.build)))

    def cpuset(self) -> str:
        """The cores as a cpuset string (`0,1`) for containers that build and time."""
        return ",".join(str(c) for c in self.all)


# the cores this thread may use before `on_build_cores` narrowed it to the build cores: the plan
# is made from them, so a plan asked for inside that block still has its timing cores
_UNNARROWED: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "cppperf_unnarrowed_cores", default=None
)


def available_cores() -> list[int]:
    wide = _UNNARROWED.get()
    if wide is not None:
        return list(wide)
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def core_plan(settings: BuilderSettings, cores: Sequence[int] | None = None) -> CorePlan:
    """Which cores time and which build, from settings (validated) or the default split."""
    have = sorted(cores) if cores is not None else available_cores()
    timing = sorted(set(settings.timing_cores))
    build = sorted(set(settings.build_cores))
    for key, chosen in (("timing_cores", timing), ("build_cores", build)):
        bad = [c for c in chosen if c not in have]
        if bad:
            raise ConfigError(
                f"builder.{key}: core(s) {bad} not available to this process (it may use {have})"
            )
    if not timing:
        rest = [c for c in have if c not in build] or have
        timing = rest[len(rest) - max(1, len(rest) // 2) :]
    if not build:
        build = [c for c in have if c not in timing] or list(timing)
    if set(timing) & set(build) and len(have) > 1:
        raise ConfigError(f"builder.timing_cores {timing} and builder.build_cores {build} overlap")
    return CorePlan(tuple(timing), tuple(build))


def lease_dir(settings: BuilderSettings) -> Path:
    return Path(settings.lease_dir or DEFAULT_LEASE_DIR)


@dataclass
class CoreLease:
    """One held lease: the core, and the open lock file that holds it."""

    cpu: int
    path: Path
    fd: int
    waited_s: float

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):  # a free core's file says nobody
                os.ftruncate(self.fd, 0)
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def _open_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):  # someone else's directory: fine if writable
            path.chmod(0o1777)
    except OSError as exc:
        raise InfraFailure(f"lease directory {path} unusable (builder.lease_dir): {exc}") from exc


def _holder_line() -> bytes:
    return f"{socket.gethostname()} pid {os.getpid()} since {time.time():.0f}\n".encode()


@dataclass(frozen=True)
class Holder:
    """Who holds a timing core (or waits in its queue), from the line its process wrote."""

    core: int | None  # None: a waiter in the queue
    host: str
    pid: int
    since: float
    priority: int | None = None  # a waiter's place class (evaluations 0, proofs 1)

    def as_dict(self) -> dict[str, object]:
        return {
            "core": self.core,
            "host": self.host,
            "pid": self.pid,
            "since": self.since,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class LeaseView:
    """The host's timing cores as `status` shows them: who holds which, who waits, in order."""

    directory: Path
    holders: tuple[Holder, ...]
    waiting: tuple[Holder, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "lease_dir": str(self.directory),
            "holders": [h.as_dict() for h in self.holders],
            "waiting": [w.as_dict() for w in self.waiting],
        }


def _parse_holder(text: str, *, core: int | None, priority: int | None = None) -> Holder | None:
    parts = text.split()
    if len(parts) != 5 or parts[1] != "pid" or parts[3] != "since":
        return None
    try:
        return Holder(core, parts[0], int(parts[2]), float(parts[4]), priority)
    except ValueError:
        return None


def _held_line(path: Path) -> str | None:
    """The holder line of `path` when a live process holds its flock, else None. The probe is a
    shared, non-blocking lock let go at once: a lease taken in that instant retries its poll."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 256, 0).decode(errors="replace")
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # nobody holds it: a free core, or a ticket whose owner is gone
    finally:
        os.close(fd)


def lease_view(directory: Path) -> LeaseView:
    """Read-only: who holds each core's lease and who waits in the ticket queue (priority, then
    arrival). Dead tickets and free cores are left out; nothing is removed or taken."""
    holders: list[Holder] = []
    waiting: list[tuple[tuple[int, int], Holder]] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return LeaseView(directory, (), ())
    for name in names:
        if not (name.startswith("core-") and name.endswith(".lock") and name[5:-5].isdigit()):
            continue
        line = _held_line(directory / name)
        if line is not None and (h := _parse_holder(line, core=int(name[5:-5]))) is not None:
            holders.append(h)
    queue = directory / "queue"
    with contextlib.suppress(OSError):
        for name in os.listdir(queue):
            if (key := _ticket_key(name)) is None:
                continue
            line = _held_line(queue / name)
            if line is not None and (h := _parse_holder(line, core=None, priority=key[0])) is not None:
                waiting.append((key, h))
    holders.sort(key=lambda h: h.core or 0)
    return LeaseView(directory, tuple(holders), tuple(h for _k, h in sorted(waiting, key=lambda kv: kv[0])))


def try_lease(directory: Path, cpu: int) -> CoreLease | None:
    """The lease on `cpu` if nobody holds it, without waiting."""
    path = directory / f"core-{cpu}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise InfraFailure(f"cannot open lease file {path}: {exc}") from exc
    with contextlib.suppress(OSError):  # open to every uid's builders (a non-root image's too)
        os.fchmod(fd, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    with contextlib.suppress(OSError):  # who holds it, for people (and `status`) looking at it
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder_line(), 0)
    return CoreLease(cpu, path, fd, 0.0)


def _locked(path: Path, flags: int, *, create: bool = True) -> int | None:
    """An open descriptor of `path` holding an exclusive flock (`flags` adds LOCK_NB), or None
    when LOCK_NB found it held or the file is gone (`create=False`: an existing file only)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o666)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InfraFailure(f"cannot open lease file {path}: {exc}") from exc
    with contextlib.suppress(OSError):  # ours: open to every user's processes (umask aside)
        os.fchmod(fd, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | flags)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@dataclass
class Ticket:
    """A place in the host's lease queue: `<lease_dir>/queue/<priority>-<seq>-<pid>`, flocked by
    its owner for as long as it waits, so a `kill -9`'d waiter's ticket is found unlocked (dead)
    and removed by whoever sees it next."""

    path: Path
    fd: int
    key: tuple[int, int]

    def drop(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        if self.fd >= 0:
            os.close(self.fd)  # the flock goes with it
            self.fd = -1


def _queue_mutex(directory: Path) -> int:
    fd = _locked(directory / "queue.lock", 0)
    assert fd is not None  # blocking, and the file is created
    return fd


def _ticket_key(name: str) -> tuple[int, int] | None:
    parts = name.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def take_ticket(directory: Path, priority: int) -> Ticket:
    """Join the queue: a new ticket, numbered under the queue's mutex and locked before the mutex
    is let go (so a listed ticket that is not locked belongs to a process that is gone)."""
    queue = directory / "queue"
    queue.mkdir(exist_ok=True)
    with contextlib.suppress(PermissionError):
        queue.chmod(0o1777)
    mutex = _queue_mutex(directory)
    try:
        # arrival order: the clock, taken under the mutex, and always after every ticket waiting
        # (no shared counter file: the directory is shared by processes of different users)
        waiting = [k[1] for name in os.listdir(queue) if (k := _ticket_key(name)) is not None]
        seq = max([time.time_ns(), *(w + 1 for w in waiting)])
        path = queue / f"{priority:03d}-{seq:020d}-{os.getpid()}"
        # locked under a name no one reads as a ticket, then renamed into the queue: a waiter
        # scanning the queue (without the mutex) never sees our ticket unlocked and takes it
        # for a dead one
        draft = queue / f".draft.{os.getpid()}.{seq}"
        fd = _locked(draft, fcntl.LOCK_NB)
        if fd is None:
            raise InfraFailure(f"cannot lock the new lease ticket {path}")
        with contextlib.suppress(OSError):
            os.pwrite(fd, _holder_line(), 0)
        try:
            draft.rename(path)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                draft.unlink()
            raise InfraFailure(f"cannot queue the lease ticket {path}: {exc}") from exc
        return Ticket(path, fd, (priority, seq))
    finally:
        os.close(mutex)


def first_in_queue(directory: Path, ticket: Ticket) -> bool:
    """Whether no live ticket comes before `ticket` (priority, then arrival); dead ones ahead of
    it (their owner gone: their flock is free) are removed on the way."""
    queue = directory / "queue"
    ahead = sorted(
        (key, name)
        for name in os.listdir(queue)
        if (key := _ticket_key(name)) is not None and key < ticket.key
    )
    for _key, name in ahead:
        fd = _locked(queue / name, fcntl.LOCK_NB, create=False)
        if fd is None:
            if (queue / name).exists():
                return False  # alive and ahead of us
            continue
        with contextlib.suppress(OSError):  # its owner is gone (or just left): not in the way
            (queue / name).unlink()
        os.close(fd)
    return True


def acquire(
    directory: Path,
    cores: Sequence[int],
    *,
    timeout: float,
    poll: float = 0.02,
    on_wait: Callable[[float], None] | None = None,
    priority: int = 1,
    policy: str = "fifo",
) -> CoreLease:
    """Lease a free core of `cores`, waiting up to `timeout` seconds. `fifo` (the default): in
    the order of the host's ticket queue (lower `priority` first, then arrival); only the first
    ticket tries the cores, so a late comer never overtakes a waiter. `poll`: the old way, every
    waiter trying every 0.25 s (whoever tries first when a core frees wins)."""
    if not cores:
        raise ConfigError("no timing cores to lease (builder.timing_cores)")
    _open_dir(directory)
    start = time.monotonic()
    # start at a per-process offset so replicas spread over the cores instead of racing for one
    offset = os.getpid() % len(cores)
    order = [*cores[offset:], *cores[:offset]]
    ticket = take_ticket(directory, priority) if policy == "fifo" else None
    poll = poll if ticket is not None else max(poll, 0.25)
    last_report = -math.inf
    try:
        while True:
            if ticket is None or first_in_queue(directory, ticket):
                for cpu in order:
                    lease = try_lease(directory, cpu)
                    if lease is not None:
                        lease.waited_s = time.monotonic() - start
                        return lease
            waited = time.monotonic() - start
            if waited >= timeout:
                raise InfraFailure(
                    f"no timing core free after {waited:.0f} s (cores {list(cores)} leased in {directory})"
                )
            if on_wait is not None and waited - last_report >= 1.0:
                last_report = waited
                on_wait(waited)
            time.sleep(poll)
    finally:
        if ticket is not None:
            ticket.drop()


def exact_metric(settings: BuilderSettings) -> bool:
    """Whether timed runs count instructions under Valgrind: exact whatever else runs on the
    core, so they need no timing core and run on every core at once."""
    return settings.metric in EXACT_METRICS


EXACT_METRICS = ("cachegrind",)


@contextlib.contextmanager
def leased_core(
    settings: BuilderSettings,
    *,
    on_wait: Callable[[float], None] | None = None,
    priority: int | None = None,
) -> Iterator[CoreLease]:
    """Hold a lease on one of this host's timing cores for the duration of the block."""
    lease = acquire(
        lease_dir(settings),
        core_plan(settings).timing,
        timeout=settings.lease_timeout,
        on_wait=on_wait,
        priority=settings.lease_priority if priority is None else priority,
        policy="poll" if settings.lease_policy == "poll" else "fifo",
    )
    try:
        yield lease
    finally:
        lease.release()


@contextlib.contextmanager
def timing_core(
    settings: BuilderSettings,
    phase: Callable[[str, int, int], None] | None = None,
    *,
    priority: int | None = None,
) -> Iterator[int | None]:
    """The leased timing core for the block (None when `builder.pin_cpu` is off or the metric is
    exact); while waiting for one, `phase("wait for a core", seconds, 0)` reports progress."""
    if not settings.pin_cpu or exact_metric(settings):
        yield None
        return
    report = phase or (lambda _p, _d, _t: None)
    with (
        leased_core(
            settings, on_wait=lambda s: report("wait for a core", int(s), 0), priority=priority
        ) as lease,
        on_build_cores(settings),
    ):
        yield lease.cpu


@dataclass
class Turns:
    """Timing-core leases for one measurement. `builder.lease_policy=round`: each `turn()` (one
    interleaved round) takes a lease and gives it back, so a waiter queued meanwhile gets the core
    after at most one round; `whole` (FIFO) and `poll` (the old way) lease once for the whole
    block and `turn()` does nothing. `cpu`: the core of the turn under way (None: not pinned)."""

    settings: BuilderSettings
    report: Callable[[str, int, int], None]
    priority: int | None = None
    cpu: int | None = None
    cores_used: list[int] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)
    per_round: bool = False

    @contextlib.contextmanager
    def turn(self) -> Iterator[int | None]:
        if not self.per_round:
            yield self.cpu
            return
        with leased_core(
            self.settings,
            on_wait=lambda s: self.report("wait for a core", int(s), 0),
            priority=self.priority,
        ) as lease:
            self._note(lease)
            try:
                yield lease.cpu
            finally:
                self.cpu = None

    def _note(self, lease: CoreLease) -> None:
        self.cpu = lease.cpu
        self.waits_s.append(round(lease.waited_s, 3))
        if lease.cpu not in self.cores_used:
            self.cores_used.append(lease.cpu)

    def facts(self) -> dict[str, object]:
        """What the record says about the leases: cores, waits, policy."""
        return {
            "leased_core": self.cores_used[0] if self.cores_used else None,
            "leased_cores": list(self.cores_used),
            "lease_policy": "none"
            if not self.settings.pin_cpu or exact_metric(self.settings)
            else self.settings.lease_policy,
            "lease_waits": len(self.waits_s),
            "lease_wait_max_s": max(self.waits_s, default=0.0),
            "lease_wait_total_s": round(sum(self.waits_s), 3),
        }


@contextlib.contextmanager
def timing_turns(
    settings: BuilderSettings,
    phase: Callable[[str, int, int], None] | None = None,
    *,
    priority: int | None = None,
) -> Iterator[Turns]:
    """The leases of one measurement (`Turns`); the calling thread on the build cores throughout."""
    report = phase or (lambda _p, _d, _t: None)
    turns = Turns(settings, report, priority)
    if not settings.pin_cpu or exact_metric(settings):
        yield turns
        return
    if settings.lease_policy == "round":
        turns.per_round = True
        with on_build_cores(settings):
            yield turns
        return
    with leased_core(
        settings, on_wait=lambda s: report("wait for a core", int(s), 0), priority=priority
    ) as lease:
        turns._note(lease)
        with on_build_cores(settings):
            yield turns


@contextlib.contextmanager
def on_build_cores(settings: BuilderSettings) -> Iterator[None]:
    """Run the calling thread (the orchestration: statistics between runs, bookkeeping) on the
    build cores for the block, so no cppperf work lands on a core another replica times on.
    Timed runs still go to their leased core: a child's affinity may leave its parent's mask.
    Nothing changes with `builder.pin_cpu` off."""
    if not settings.pin_cpu:
        yield
        return
    try:
        before = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        yield
        return
    token = _UNNARROWED.set(tuple(available_cores()))
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, set(core_plan(settings).build))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)
        _UNNARROWED.reset(token)
