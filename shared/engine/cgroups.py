"""Per-run cgroups: one sandboxed run's process and memory caps, set from outside it.

A run that asks for a process or memory cap gets a throw-away cgroup in every hierarchy the host
delegates to us, made as a child of *our own* cgroup (read from `/proc/self/cgroup` and
`/proc/self/mountinfo`, so a container whose cgroupfs shows only its own subtree works too):

- cgroup v2 (unified): where our cgroup's `cgroup.subtree_control` enables `memory` / `pids`
  (systemd `Delegate=yes`, a private cgroup namespace with a writable cgroupfs);
- cgroup v1: in the `memory` and `pids` hierarchies (root on a v1 or hybrid host, as here).

Memory: `memory.max` + `memory.swap.max=0` + `memory.oom.group=1` (v2), or
`memory.limit_in_bytes` (+ `memory.memsw.limit_in_bytes`) (v1). It caps the whole run together —
every compiler of a `-j N` build, a test and everything it forks, and the pages they write into
the jail's private tmpfs `/tmp` (tmpfs pages are charged to the writer's cgroup) — which a
per-process `RLIMIT_AS` cannot do. Past it the kernel's OOM killer kills inside the run only;
`oom_killed()` tells (v2 `memory.events`, v1 `memory.oom_control`). Where no memory cgroup can
be made the caller falls back to `RLIMIT_AS` per process (`memory is None`).
Processes: `pids.max` (a fork bomb hits a wall); else the caller sets `RLIMIT_NPROC`.

The child joins every cgroup before exec (`join_self`), so the run starts inside; the jailed code
cannot leave (bwrap gives it a cgroup namespace, uid 65534 and no cgroupfs). Afterwards
`kill_all_and_remove` stops new forks (`pids.max=0`), SIGKILLs every member — also what left the
process group — and removes the directories.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_COUNTER = itertools.count(1)
MOUNTINFO = Path("/proc/self/mountinfo")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class Hierarchy:
    """Where we can make child cgroups for `controller`: our own cgroup's directory there."""

    controller: str  # "memory" | "pids"
    own: Path
    v2: bool


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(root inside the hierarchy, mount point, fstype, super options) of every cgroup mount."""
    out: list[tuple[str, Path, str, set[str]]] = []
    with contextlib.suppress(OSError):
        for line in MOUNTINFO.read_text().splitlines():
            left, sep, right = line.partition(" - ")
            if not sep:
                continue
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
                continue
            out.append((fields[3], Path(fields[4]), tail[0], set(tail[2].split(","))))
    return out


def _own_paths() -> tuple[str | None, dict[str, str]]:
    """Our cgroup path in the unified hierarchy and per v1 controller (`/proc/self/cgroup`)."""
    unified: str | None = None
    v1: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in PROC_CGROUP.read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if parts[0] == "0" and not parts[1]:
                unified = parts[2]
            for ctl in parts[1].split(","):
                if ctl:
                    v1[ctl] = parts[2]
    return unified, v1


def _below(mount_root: str, path: str) -> str | None:
    """`path` relative to a mount whose root is `mount_root` (None when the mount cannot see it)."""
    if mount_root == "/":
        return path.lstrip("/")
    if path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
        return path[len(mount_root) :].lstrip("/")
    return None


def find_hierarchy(controller: str) -> Hierarchy | None:
    """Our own cgroup in a hierarchy where we may make a `controller` child (v2 first)."""
    unified, v1 = _own_paths()
    for root, point, fstype, _opts in _mounts():
        if fstype == "cgroup2" and unified is not None:
            rel = _below(root, unified)
            own = point / rel if rel is not None else None
            if own is None or not os.access(own, os.W_OK):
                continue
            with contextlib.suppress(OSError):
                if controller in (own / "cgroup.subtree_control").read_text().split():
                    return Hierarchy(controller, own, True)
    for root, point, fstype, opts in _mounts():
        if fstype == "cgroup" and controller in opts and controller in v1:
            rel = _below(root, v1[controller])
            own = point / rel if rel is not None else None
            if own is not None and os.access(own, os.W_OK) and (own / "cgroup.procs").exists():
                return Hierarchy(controller, own, False)
    return None


_FOUND: dict[str, Hierarchy | None] = {}


def hierarchy(controller: str) -> Hierarchy | None:
    """`find_hierarchy`, probed once per process (a probe child is made and removed)."""
    if controller not in _FOUND:
        found = find_hierarchy(controller)
        if found is not None:
            probe = found.own / f"cppperf-probe-{os.getpid()}"
            try:
                probe.mkdir(exist_ok=True)
                probe.rmdir()
            except OSError:
                found = None
        _FOUND[controller] = found
    return _FOUND[controller]


def missing_caps() -> list[str]:
    """The whole-run caps this host does not let us set (they fall back to per-process rlimits)."""
    return [c for c in ("memory", "pids") if hierarchy(c) is None]


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


class RunCgroup:
    """The cgroups of one run; `pids` / `memory` are None where that cap could not be set."""

    def __init__(self, *, processes: int | None = None, memory_mb: int | None = None) -> None:
        self.dirs: list[Path] = []
        self.pids: Path | None = None
        self.memory: Path | None = None
        self.memory_v2 = False
        self._oom_seen = False
        name = f"cppperf-{os.getpid()}-{next(_COUNTER)}"
        if processes:
            self.pids = self._make("pids", name, {"pids.max": str(processes)})
        if memory_mb:
            b = str(memory_mb * 1024 * 1024)
            h = hierarchy("memory")
            if h is not None and h.v2:
                self.memory = self._make("memory", name, {"memory.max": b, "memory.swap.max": "0"})
                if self.memory is not None:
                    self.memory_v2 = True
                    _write(self.memory / "memory.oom.group", "1")
            else:
                self.memory = self._make(
                    "memory", name, {"memory.limit_in_bytes": b, "memory.memsw.limit_in_bytes": b}
                )

    def _make(self, controller: str, name: str, settings: dict[str, str]) -> Path | None:
        h = hierarchy(controller)
        if h is None:
            return None
        path = h.own / name
        if path in self.dirs:  # v2: one directory holds both controllers
            return path if self._apply(path, settings) else None
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        self.dirs.append(path)
        if not self._apply(path, settings):
            self._remove(path)
            return None
        return path

    @staticmethod
    def _apply(path: Path, settings: dict[str, str]) -> bool:
        # the first setting is the cap itself; the others only where the kernel has them (swap)
        items = list(settings.items())
        first, rest = items[0], items[1:]
        if not _write(path / first[0], first[1]):
            return False
        for key, value in rest:
            if (path / key).exists():
                _write(path / key, value)
        return True

    def _remove(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.rmdir()
        with contextlib.suppress(ValueError):
            self.dirs.remove(path)

    def join_self(self) -> None:
        """In the child before exec: move this process into every cgroup of the run."""
        pid = str(os.getpid())
        for path in self.dirs:
            (path / "cgroup.procs").write_text(pid)

    def oom_killed(self) -> bool:
        """Did the kernel kill a process of this run for the memory cap?"""
        if self.memory is None or self.memory not in self.dirs:
            return self._oom_seen
        name = "memory.events" if self.memory_v2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
        return False

    def members(self) -> list[int]:
        pids: set[int] = set()
        for path in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return sorted(pids)

    def kill_all_and_remove(self) -> None:
        if not self.dirs:
            return
        if self.pids is not None:  # no new processes from here on (a fork bomb refills otherwise)
            _write(self.pids / "pids.max", "0")
        for _ in range(500):
            pids = self.members()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        self._oom_seen = self.oom_killed()  # read before the directories go
        for path in list(self.dirs):
            self._remove(path)
