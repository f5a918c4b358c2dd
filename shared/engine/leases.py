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
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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
            with contextlib.suppress(OSError):
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


def try_lease(directory: Path, cpu: int) -> CoreLease | None:
    """The lease on `cpu` if nobody holds it, without waiting."""
    path = directory / f"core-{cpu}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise InfraFailure(f"cannot open lease file {path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    with contextlib.suppress(OSError):  # who holds it, for people looking at the directory
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()} pid {os.getpid()} since {time.time():.0f}\n".encode(), 0)
    return CoreLease(cpu, path, fd, 0.0)


def acquire(
    directory: Path,
    cores: Sequence[int],
    *,
    timeout: float,
    poll: float = 0.25,
    on_wait: Callable[[float], None] | None = None,
) -> CoreLease:
    """Lease the first free core of `cores`, waiting (polling) up to `timeout` seconds."""
    if not cores:
        raise ConfigError("no timing cores to lease (builder.timing_cores)")
    _open_dir(directory)
    start = time.monotonic()
    # start at a per-process offset so replicas spread over the cores instead of racing for one
    offset = os.getpid() % len(cores)
    order = [*cores[offset:], *cores[:offset]]
    while True:
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
        if on_wait is not None:
            on_wait(waited)
        time.sleep(poll)


@contextlib.contextmanager
def leased_core(
    settings: BuilderSettings, *, on_wait: Callable[[float], None] | None = None
) -> Iterator[CoreLease]:
    """Hold a lease on one of this host's timing cores for the duration of the block."""
    lease = acquire(
        lease_dir(settings), core_plan(settings).timing, timeout=settings.lease_timeout, on_wait=on_wait
    )
    try:
        yield lease
    finally:
        lease.release()


@contextlib.contextmanager
def timing_core(
    settings: BuilderSettings, phase: Callable[[str, int, int], None] | None = None
) -> Iterator[int | None]:
    """The leased timing core for the block (None when `builder.pin_cpu` is off); while waiting
    for one, `phase("wait for a core", seconds, 0)` reports progress."""
    if not settings.pin_cpu:
        yield None
        return
    report = phase or (lambda _p, _d, _t: None)
    with (
        leased_core(settings, on_wait=lambda s: report("wait for a core", int(s), 0)) as lease,
        on_build_cores(settings),
    ):
        yield lease.cpu


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
