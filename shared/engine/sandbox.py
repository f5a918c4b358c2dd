"""Run one command the way the builder measures it: sandboxed, timed, output bounded.

- Network: unshared (`bwrap --unshare-net` when installed, else `unshare --net`, with
  `--map-root-user` when not root); `sandbox=False` runs it plainly.
- rlimits: CPU seconds, address space, file size; own process group, killed whole on timeout.
  A timeout is a value (`timed_out=True`), not an exception.
- Processes: a pids cgroup (`pids.max`) per run where one can be created (root, cgroup v1 `pids`
  hierarchy or v2 with the pids controller) so a fork bomb hits a wall and every leftover
  process is killed afterwards; else RLIMIT_NPROC (effective for non-root users only).
- Pinned to one CPU when asked (`os.sched_setaffinity`).
- Output: a pipe drained by a thread that keeps the first and last `output_limit/2` bytes.
- Time: wall via `perf_counter_ns`, CPU via `os.wait4` rusage (user + sys of the process tree
  that was waited for).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cppperf.shared.engine.runner_script import InstructionCounter, OutputKeeper, set_affinity, supervise


@dataclass(frozen=True)
class Limits:
    timeout: float = 600.0
    cpu_seconds: int | None = None
    memory_mb: int | None = 4096
    file_size_mb: int | None = 1024
    processes: int | None = None
    network: bool = False  # False = unshare the network namespace
    cpu: int | None = None  # pin to this CPU (a timed run: the leased core)
    cpus: tuple[int, ...] = ()  # else run on these CPUs (builds: the build cores)
    instructions: bool = False  # count user-space instructions (perf_event_open)


@dataclass(frozen=True)
class RunResult:
    returncode: int
    wall_s: float
    cpu_s: float
    output: str
    timed_out: bool
    truncated: bool
    max_rss_kb: int = 0
    instructions: int | None = None  # user-space instructions when counted and allowed

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _network_prefix(sandbox: bool) -> list[str]:
    if not sandbox:
        return []
    if shutil.which("bwrap"):
        return ["bwrap", "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--"]
    if shutil.which("unshare"):
        return (
            ["unshare", "--net", "--"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user", "--"]
        )
    return []


_NET_CHECKED: dict[bool, list[str]] = {}


def network_prefix(sandbox: bool = True) -> list[str]:
    """The prefix that isolates the network, verified once per process (empty if unavailable)."""
    if sandbox not in _NET_CHECKED:
        prefix = _network_prefix(sandbox)
        if prefix:
            ok = subprocess.run([*prefix, "true"], capture_output=True, check=False).returncode == 0
            prefix = prefix if ok else []
        _NET_CHECKED[sandbox] = prefix
    return _NET_CHECKED[sandbox]


def _pids_root() -> Path | None:
    for cand in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        procs = cand / "cgroup.procs"
        if not procs.exists() or not os.access(cand, os.W_OK):
            continue
        if cand.name == "cgroup":  # v2: the pids controller must be enabled for children
            ctl = cand / "cgroup.subtree_control"
            if not ctl.exists() or "pids" not in ctl.read_text():
                continue
        return cand
    return None


class PidsCgroup:
    """A throw-away pids cgroup limiting one run's process count."""

    _counter = 0

    def __init__(self, limit: int) -> None:
        root = _pids_root()
        self.path: Path | None = None
        if root is None:
            return
        PidsCgroup._counter += 1
        path = root / f"cppperf-{os.getpid()}-{PidsCgroup._counter}"
        try:
            path.mkdir(exist_ok=True)
            (path / "pids.max").write_text(str(limit))
        except OSError:
            return
        self.path = path

    def join_self(self) -> None:  # runs in the child before exec
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def kill_all_and_remove(self) -> None:
        if self.path is None:
            return
        # no new processes from here on (a fork bomb would otherwise refill what we kill)
        with contextlib.suppress(OSError):
            (self.path / "pids.max").write_text("0")
        for _ in range(500):
            pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _preexec(limits: Limits, cgroup: PidsCgroup | None, counter: InstructionCounter | None = None) -> None:
    os.setsid()
    if cgroup is not None:
        cgroup.join_self()
    if limits.cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    if limits.memory_mb:
        b = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (b, b))
    if limits.file_size_mb:
        b = limits.file_size_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (b, b))
    if limits.processes and (cgroup is None or cgroup.path is None):
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    set_affinity({limits.cpu} if limits.cpu is not None else set(limits.cpus))
    if counter is not None:
        counter.in_child()


_MOUNT_SCRIPT = 'mount --bind "$1" "$2" && cd "$3" && shift 3 && exec "$@"'


def mount_namespace_available() -> bool:
    """Can we bind-mount in a private mount namespace (root, or unprivileged user namespaces)?"""
    if not _MOUNT_CHECKED:
        with tempfile.TemporaryDirectory() as d:
            a, b = Path(d) / "a", Path(d) / "b"
            a.mkdir()
            b.mkdir()
            probe = _mount_prefix(False, (a, b, str(b)))
            ok = (
                bool(probe)
                and subprocess.run([*probe, "true"], capture_output=True, check=False).returncode == 0
            )
        _MOUNT_CHECKED.append(ok)
    return _MOUNT_CHECKED[0]


_MOUNT_CHECKED: list[bool] = []


def _mount_prefix(isolate_net: bool, mount: tuple[Path, Path, str]) -> list[str]:
    if not shutil.which("unshare"):
        return []
    flags = ["--mount", *(["--net"] if isolate_net else [])]
    if os.geteuid() != 0:
        flags.append("--map-root-user")
    src, dst, cwd = mount
    return ["unshare", *flags, "--", "sh", "-c", _MOUNT_SCRIPT, "sh", str(src), str(dst), cwd]


def run(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    limits: Limits = Limits(),
    output_limit: int = 64 * 1024,
    sandbox: bool = True,
    log_file: Path | None = None,
    mount: tuple[Path, Path] | None = None,
) -> RunResult:
    """Run `argv`; never raises for the command's own failure or timeout.

    `mount=(src, dst)` runs it in a private mount namespace with `src` bind-mounted on `dst`
    (and `cwd` entered after the mount): the builder gives every tree the same absolute path."""
    isolate = sandbox and not limits.network
    if mount is not None:
        full = [
            *_mount_prefix(
                isolate and bool(network_prefix(True)), (mount[0], mount[1], str(cwd or mount[1]))
            ),
            *argv,
        ]
        cwd = None
    else:
        prefix = network_prefix(sandbox) if not limits.network else []
        full = [*prefix, *argv]
    keep = OutputKeeper(output_limit)
    cgroup = PidsCgroup(limits.processes) if limits.processes else None
    counter = InstructionCounter() if limits.instructions else None
    start = time.perf_counter_ns()
    try:
        proc = subprocess.Popen(
            full,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: _preexec(limits, cgroup, counter),  # noqa: PLW1509 - rlimits need preexec
        )
    except OSError as exc:
        if counter is not None:
            counter.close()
        if cgroup is not None:
            cgroup.kill_all_and_remove()
        return RunResult(127, 0.0, 0.0, f"cannot start {argv[0]}: {exc}", False, False)
    if counter is not None:
        counter.receive()
    log_handle = log_file.open("ab") if log_file else None
    try:
        status, usage, wall, timed_out = supervise(
            proc,
            keep,
            limits.timeout,
            start,
            tee=log_handle,
            # also what left the process group (setsid'd daemons)
            after_exit=cgroup.kill_all_and_remove if cgroup is not None else None,
        )
    finally:
        if log_handle is not None:
            log_handle.close()
    assert proc.stdout is not None
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return RunResult(
        returncode=proc.returncode,
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        output=keep.text(),
        timed_out=timed_out,
        truncated=keep.dropped > 0,
        max_rss_kb=usage.ru_maxrss,
        instructions=counter.read() if counter is not None else None,
    )
