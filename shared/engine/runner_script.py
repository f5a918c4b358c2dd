"""The test runner copied into every container image (`/opt/cppperf/runner.py`); stdlib only.

It times commands *inside* the container, so the engine's exec overhead never enters a sample.
Takes one JSON request as its argument, writes one JSON answer on stdout:

    {"op": "run", "argv": [...], "cwd": "...", "env": {...}, "timeout": 600, "output_limit": 65536,
     "cpu": 0, "cpus": [0, 1], "uid": 1000, "instructions": false}
        → {"returncode": 0, "wall_s": 0.1, "cpu_s": 0.09, "timed_out": false, "output": "...",
           "truncated": false, "instructions": null, "oom_killed": false}
    (`cpu`: pin a timed run to its leased core; `cpus`: the build cores for builds;
     `instructions`: count user-space instructions with perf_event_open where the kernel allows;
     `reap`: afterwards the runner kills whatever the command left and reaps every process, so CPU
     time spent in children the command never waited for — orphans, reparented to the runner as
     pid 1 of the jail's pid namespace or, in a container, as their subreaper — is in `cpu_s` too)
    (`valgrind`: run the command under Valgrind's Cachegrind, `--cache-sim=no`, children traced,
     its output files in a private temporary directory; `"ir"` in the answer is the instructions
     it counted, summed over every process — exact, whatever else runs on the machine;
     `cache_sim`: `--cache-sim=yes` instead, and `"est_cycles"` in the answer is the estimated
     cycles from its cache misses, `estimated_cycles`; `"valgrind_unhandled"`: null, or one line
     naming the instruction Valgrind could not run, when its log reports one, `valgrind_unhandled`)
    (`views`, with `tree` and `uid`: directories of the read-only `tree` made writable for the run
     and emptied before and after it, the build's entries in them kept read-only: `View`)
    {"op": "probe"} → {"instructions_unsupported": null | "why", "valgrind_unsupported": null | "why"}
    {"op": "hash", "root": "/work/old/build", "replace": ["/work/old", "/work/new"]}
        → {"files": {"test_x": "<sha256>", "lib/libcore.so": "..."}}   (executables and .so files;
           embedded occurrences of the first path are replaced by the second before hashing)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, TextIO


class OutputKeeper:
    """Keeps the head and tail of a byte stream, counting what it dropped (also used on the host)."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head.extend(chunk[:room])
            chunk = chunk[room:]
        if chunk:
            self.tail.extend(chunk)
            if len(self.tail) > self.half:
                self.dropped += len(self.tail) - self.half
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        mid = f"\n[... {self.dropped} bytes dropped ...]\n".encode() if self.dropped else b""
        return bytes(self.head + mid + self.tail).decode("utf-8", "replace")


_PERF_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331, "riscv64": 241}
# perf_event_attr flag bits: disabled, inherit, exclude_kernel, exclude_hv, enable_on_exec
_PERF_FLAGS = (1 << 0) | (1 << 1) | (1 << 5) | (1 << 6) | (1 << 12)
_PERF_FLAG_FD_CLOEXEC = 8


def _perf_open_self() -> int:
    """A user-space instruction counter on the calling process and its future children, enabled
    at the next exec; raises OSError (with the kernel's errno) where the kernel refuses."""
    import ctypes
    import platform
    import struct

    nr = _PERF_SYSCALL.get(platform.machine())
    if nr is None:
        raise OSError(38, f"perf_event_open: unknown syscall number on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    # type=PERF_TYPE_HARDWARE, size=128, config=PERF_COUNT_HW_INSTRUCTIONS
    attr = ctypes.create_string_buffer(struct.pack("<IIQQQQQ", 0, 128, 1, 0, 0, 0, _PERF_FLAGS), 128)
    fd = int(libc.syscall(nr, attr, 0, -1, -1, _PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open: {os.strerror(err)}")
    return fd


def instructions_unsupported() -> str | None:
    """Why hardware instruction counting is not possible here, or None when it is."""
    try:
        os.close(_perf_open_self())
    except OSError as exc:
        hint = {
            2: "no hardware performance counters (PMU) exposed, e.g. in a VM",
            1: "not permitted (kernel.perf_event_paranoid, seccomp or missing CAP_PERFMON)",
            13: "not permitted (kernel.perf_event_paranoid, seccomp or missing CAP_PERFMON)",
        }.get(exc.errno or 0, "refused by the kernel")
        return f"{exc.strerror or exc}: {hint}"
    return None


def valgrind_unsupported() -> str | None:
    """Why commands cannot run under Valgrind here, or None when they can."""
    import shutil

    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt-get install valgrind)"
    return None


def valgrind_argv(argv: list[str], out_dir: str, *, cache_sim: bool = False) -> list[str]:
    """`argv` under Cachegrind counting instructions only (`--cache-sim=no`, the cheapest tool
    that counts; `cache_sim`: also simulating the I1/D1/LL caches, about twice as slow), every
    exec'd child traced, its output and messages into `out_dir` (never the test's own output,
    which CTest's pass/fail expressions read)."""
    return [
        "valgrind",
        "--tool=cachegrind",
        f"--cache-sim={'yes' if cache_sim else 'no'}",
        "--trace-children=yes",
        f"--cachegrind-out-file={out_dir}/cachegrind.out.%p",
        f"--log-file={out_dir}/valgrind.%p.log",
        *argv,
    ]


def _open_regular(path: str) -> TextIO | None:
    """`path` opened for reading when it is a regular file itself; None for a symlink, a FIFO, a
    device or a directory. The count directory is writable by the counted test: what it leaves
    there must neither block the runner (a FIFO) nor count a file elsewhere (a symlink)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, errors="replace")


def cachegrind_counts(out_dir: str) -> dict[str, int] | None:
    """Every event of every `cachegrind.out.<pid>` in `out_dir` (its `events:` names the columns
    of its `summary:` line), summed per event over the processes that counted `Ir`; None when no
    process wrote one. Without `--cache-sim=yes` the only event is `Ir`. Regular files
    only (`_open_regular`)."""
    totals: dict[str, int] = {}
    found = False
    for name in sorted(os.listdir(out_dir)):
        if not name.startswith("cachegrind.out."):
            continue
        fh = _open_regular(os.path.join(out_dir, name))
        if fh is None:
            continue
        events = ["Ir"]
        with fh:
            for line in fh:
                if line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith("summary:"):
                    counts = dict(zip(events, line.split()[1:], strict=False))
                    if not counts.get("Ir", "").isdigit():
                        continue
                    found = True
                    for event, value in counts.items():
                        if value.isdigit():
                            totals[event] = totals.get(event, 0) + int(value)
    return totals if found else None


UNHANDLED_NOTE = "\ncppperf: Valgrind cannot run this program: {}\n"
_LOG_READ_LIMIT = 1 << 16  # a log's head: Valgrind's report of the instruction comes early


def valgrind_unhandled(log_text: str) -> str | None:
    """One short line naming the instruction Valgrind could not run and where, when its log
    (`--log-file`) says it met one — `vex amd64->IR: unhandled instruction bytes: …` then
    `valgrind: Unrecognised instruction at address …` and its first `at` frame (Valgrind 3.19
    lacks AVX-512, which `-march=native` emits on a host that has it); None otherwise."""
    bytes_line = where = None
    unrecognised = False
    for line in log_text.splitlines():
        if bytes_line is None and "unhandled instruction bytes:" in line:
            bytes_line = "unhandled instruction bytes:" + line.split("unhandled instruction bytes:", 1)[1]
        elif "valgrind: Unrecognised instruction" in line:
            unrecognised = True
        elif unrecognised and where is None and line.split("== ", 1)[-1].lstrip().startswith("at 0x"):
            frame = line.split("== ", 1)[-1].strip()
            where = frame.split(": ", 1)[1] if ": " in frame else frame
    if bytes_line is None and not unrecognised:
        return None
    parts = [" ".join((bytes_line or "unrecognised instruction").split())]
    if where:
        parts.append(f"in {where}")
    line = " ".join(parts)
    return line if len(line) <= 240 else line[:237] + "..."


def valgrind_logs_unhandled(out_dir: str) -> str | None:
    """`valgrind_unhandled` of the first `valgrind.<pid>.log` in `out_dir` that reports one.
    Regular files only, each read up to `_LOG_READ_LIMIT` (`_open_regular`: the directory is
    the test's to write)."""
    for name in sorted(os.listdir(out_dir)):
        if not (name.startswith("valgrind.") and name.endswith(".log")):
            continue
        fh = _open_regular(os.path.join(out_dir, name))
        if fh is None:
            continue
        with fh:
            found = valgrind_unhandled(fh.read(_LOG_READ_LIMIT))
        if found is not None:
            return found
    return None


def cachegrind_ir(out_dir: str) -> int | None:
    """The `Ir` of every `cachegrind.out.<pid>` in `out_dir`, summed; None when none was written."""
    counts = cachegrind_counts(out_dir)
    return None if counts is None else counts["Ir"]


# Cachegrind's event names (`--cache-sim=yes`): first-level misses and last-level misses
L1_MISSES = ("I1mr", "D1mr", "D1mw")
LL_MISSES = ("ILmr", "DLmr", "DLmw")


def estimated_cycles(counts: dict[str, int] | None) -> int | None:
    """The standard estimate (as cg_annotate/KCachegrind users compute it): Ir + 10·(I1mr + D1mr
    + D1mw) + 100·(ILmr + DLmr + DLmw) — an estimate from a simulated cache, not a measurement.
    None unless the cache was simulated (every miss event present)."""
    if counts is None or any(e not in counts for e in (*L1_MISSES, *LL_MISSES)):
        return None
    return counts["Ir"] + 10 * sum(counts[e] for e in L1_MISSES) + 100 * sum(counts[e] for e in LL_MISSES)


def valgrind_dir(uid: int | None) -> str:
    """A fresh directory for Cachegrind's files, writable by the uid the command runs as."""
    import tempfile

    out = tempfile.mkdtemp(prefix="cppperf-cg-")
    if uid is not None and os.geteuid() == 0:
        os.chown(out, uid, uid)
    return out


class InstructionCounter:
    """Counts user-space instructions of one child's process tree. The child opens the counter on
    itself just before exec (`in_child`, from preexec) and hands the descriptor to the parent over
    a socket pair (`receive`), so nothing it runs escapes the count; `read` after the exit."""

    def __init__(self) -> None:
        import socket

        self._parent, self._child = socket.socketpair()
        self.fd = -1

    def in_child(self) -> None:
        import socket

        try:
            fd = _perf_open_self()
        except OSError:
            self._child.send(b"-")
            return
        socket.send_fds(self._child, [b"+"], [fd])
        os.close(fd)

    def receive(self) -> None:
        import socket

        self._child.close()
        self._parent.settimeout(10)
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self._parent, 1, 1)
        except OSError:
            msg, fds = b"", []
        if msg == b"+" and fds:
            self.fd = fds[0]

    def read(self) -> int | None:
        try:
            if self.fd < 0:
                return None
            data = os.read(self.fd, 8)
            return int.from_bytes(data, "little") if len(data) == 8 else None
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._parent.close()
        self._child.close()


def set_affinity(cpus: set[int]) -> None:
    """Pin the calling process (before exec) to `cpus`; a core outside the cpuset is ignored."""
    if cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


def _preexec(
    cpu: int | None, uid: int | None, cpus: set[int] | None = None, counter: InstructionCounter | None = None
) -> None:
    os.setsid()
    set_affinity(cpus or set())
    if cpu is not None:
        set_affinity({cpu})
    if uid is not None:
        os.setgroups([])  # not root's supplementary groups
        os.setgid(uid)
        os.setuid(uid)
    if counter is not None:  # last: count from the exec on, as the test's own user
        counter.in_child()


def supervise(
    proc: subprocess.Popen[bytes],
    keep: OutputKeeper,
    timeout: float,
    start_ns: int,
    *,
    tee: BinaryIO | None = None,
    after_exit: Callable[[], None] | None = None,
) -> tuple[int, Any, float, bool]:
    """Drain the output into `keep` (and `tee`), kill the process group at `timeout`, wait with
    rusage. Returns (wait status, rusage, wall seconds since `start_ns`, timed out). Shared by
    this runner and the host sandbox, so both measure the same way."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()

    def drain() -> None:
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            keep.feed(chunk)
            if tee is not None:
                tee.write(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    wall = (time.perf_counter_ns() - start_ns) / 1e9
    # children left behind in the group would keep the pipe open: end them
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if after_exit is not None:
        after_exit()
    reader.join(timeout=5)
    return status, usage, wall, timed_out.is_set()


def _empty_temp_dirs() -> None:
    """A fresh /tmp for every run: nothing one run leaves there is seen by the next."""
    import shutil

    for top in ("/tmp", "/var/tmp", "/dev/shm"):  # noqa: S108 - inside the container, as root
        if not os.path.isdir(top):
            continue
        for name in os.listdir(top):
            path = os.path.join(top, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> bool:
    """Not pid 1 (a container's `docker exec`): become the subreaper of what we start, so every
    orphan of the command is reparented to us, not to the container's init."""
    try:
        import ctypes

        return int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
                out.append(int(name))
    return out


def _reap_all() -> None:
    """Kill every process the command left behind, then reap them all (their CPU time then counts
    in our RUSAGE_CHILDREN, whoever their parent was). As pid 1 of a pid namespace (the host's
    jail): everything else in it. As a subreaper (containers): our children, again and again, as
    each one's own orphans are reparented to us when it dies; never `kill(-1)` there."""
    if os.getpid() != 1:
        for _ in range(1000):  # a child we may not kill (no CAP_KILL) is left; never block on it
            kids = _children()
            if not kids:
                return
            for pid in kids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            time.sleep(0.005)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")  # v2, v1


def oom_kills() -> int | None:
    """The kernel's OOM kills in this process's memory cgroup so far (in a container: the
    container's memory limit); None where no cgroup file says (not mounted, no memory controller)."""
    for path in OOM_FILES:
        try:
            with open(path) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


VIEW_ROOT = "/work/"  # views only ever inside a tree under it (the containers' /work volume)
_RM_BATCH = 512  # names per `rm -rf` (a test may leave any number)


def _open_dir_inside(tree: str, path: str, gid: int) -> int | None:
    """A descriptor of the directory `path`, strictly inside `tree` (itself under VIEW_ROOT), walked
    from / one component at a time without following a symlink, every component from `tree` down
    a directory of root's with the group `gid` (what the build made, handed to root for the tests);
    None otherwise (not normalized, outside, a symlink, a test's own directory, another tree's)."""
    if os.path.normpath(tree) != tree or os.path.normpath(path) != path:
        return None
    if not tree.startswith(VIEW_ROOT) or not path.startswith(tree + "/"):
        return None
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    first = len(tree.strip("/").split("/"))  # the tree's own component
    fd = os.open("/", flags)
    try:
        for depth, part in enumerate(path.strip("/").split("/"), 1):
            below = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = below
            st = os.fstat(fd)
            if depth >= first and (st.st_uid != 0 or st.st_gid != gid):
                raise PermissionError(path)
    except OSError:
        os.close(fd)
        return None
    return fd


def _clear_dir(fd: int, path: str) -> None:
    """Remove every entry of the directory `fd` (at `path`) that is not root's, whatever is below it;
    root's entries (the build's) stay. Never through a symlink: a symlink is unlinked itself,
    directories go with `rm -rf --one-file-system` (which never follows one, however deep)."""
    files: list[str] = []
    dirs: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != 0:
                    (dirs if stat.S_ISDIR(st.st_mode) else files).append(entry.name)
    for name in files:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=fd)
    for i in range(0, len(dirs), _RM_BATCH):
        batch = [os.path.join(path, name) for name in dirs[i : i + _RM_BATCH]]
        subprocess.run(
            ["rm", "-rf", "--one-file-system", "--", *batch],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )


class View:
    """A directory of a read-only tree (root's, group-readable by the test's uid) made writable for
    one run: emptied of what is not root's, then group-writable and sticky (1770-like), so the test
    may create entries in it but not change, remove or rename the build's (root's, without group
    write); `close` empties it again and takes the group's write back. Its times are put back
    each time: a run cannot tell from them that another ran before."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path
        self.st = os.fstat(fd)
        self.closed_mode = stat.S_IMODE(self.st.st_mode) & ~(stat.S_ISVTX | stat.S_IWGRP)

    def _times(self) -> None:
        os.utime(self.fd, ns=(self.st.st_atime_ns, self.st.st_mtime_ns))

    def open(self) -> None:
        _clear_dir(self.fd, self.path)  # what a run that never closed its views left
        # the test's group only, sticky: it cannot touch root's entries (the build's)
        os.chmod(self.fd, self.closed_mode | stat.S_ISVTX | stat.S_IRWXG)  # noqa: S103
        self._times()

    def close(self) -> None:
        """Write taken back first (nothing more can be made in it), then emptied."""
        try:
            os.chmod(self.fd, self.closed_mode)
            _clear_dir(self.fd, self.path)
            self._times()
        finally:
            os.close(self.fd)


def open_views(tree: str, paths: list[str], gid: int) -> list[View]:
    """The views of one run (`views` in the request): each of `paths` that `_open_dir_inside`
    accepts, made writable; any other stays as the tree has it (read-only)."""
    views: list[View] = []
    for path in dict.fromkeys(paths):
        fd = _open_dir_inside(tree, path, gid)
        if fd is None:
            continue
        view = View(fd, path)
        views.append(view)
        try:
            view.open()
        except OSError:
            continue  # closed (and emptied) again with the others after the run
    return views


def close_views(views: list[View]) -> None:
    for view in views:
        with contextlib.suppress(OSError):
            view.close()


def _run(req: dict[str, Any]) -> dict[str, Any]:
    if req.get("fresh_tmp"):
        _empty_temp_dirs()
    views: list[View] = []
    if req.get("views") and req.get("uid") is not None and os.geteuid() == 0:
        views = open_views(str(req["tree"]), [str(v) for v in req["views"]], int(req["uid"]))
    try:
        return _run_command(req)
    finally:
        close_views(views)


def _run_command(req: dict[str, Any]) -> dict[str, Any]:
    keep = OutputKeeper(int(req.get("output_limit", 65536)))
    cpu = None if req.get("cpu") is None else int(req["cpu"])
    uid = None if req.get("uid") is None else int(req["uid"])
    cpus = {int(c) for c in req.get("cpus") or []}
    counter = InstructionCounter() if req.get("instructions") else None
    reap = bool(req.get("reap")) and (os.getpid() == 1 or _become_subreaper())
    cg_dir = valgrind_dir(uid) if req.get("valgrind") else None
    cache_sim = bool(req.get("cache_sim"))
    argv = valgrind_argv(list(req["argv"]), cg_dir, cache_sim=cache_sim) if cg_dir else req["argv"]
    ooms = oom_kills()
    start = time.perf_counter_ns()
    try:
        proc = subprocess.Popen(
            argv,
            cwd=req.get("cwd") or None,
            env=req.get("env") or None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: _preexec(cpu, uid, cpus, counter),  # noqa: PLW1509 - single-threaded here
        )
    except OSError as exc:
        if counter is not None:
            counter.close()
        return {
            "returncode": 127,
            "wall_s": 0.0,
            "cpu_s": 0.0,
            "timed_out": False,
            "output": f"cannot start: {exc}",
            "truncated": False,
        }
    if counter is not None:
        counter.receive()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # reaping before the output is drained: a daemon the command left holding its stdout would
    # otherwise keep the pipe open until the reader's 5 s wait ran out, on every run
    status, usage, wall, timed_out = supervise(
        proc, keep, float(req.get("timeout", 600)), start, after_exit=_reap_all if reap else None
    )
    cpu_s = usage.ru_utime + usage.ru_stime
    if reap:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert proc.stdout is not None
    proc.stdout.close()
    ooms_after = None if ooms is None else oom_kills()
    counts = unhandled = None
    if cg_dir is not None:
        import shutil

        counts = cachegrind_counts(cg_dir)
        unhandled = valgrind_logs_unhandled(cg_dir)
        shutil.rmtree(cg_dir, ignore_errors=True)
    output = keep.text() + (UNHANDLED_NOTE.format(unhandled) if unhandled else "")
    return {
        "ir": None if counts is None else counts["Ir"],
        "est_cycles": estimated_cycles(counts),
        "instructions": counter.read() if counter is not None else None,
        "returncode": os.waitstatus_to_exitcode(status),
        "wall_s": wall,
        "cpu_s": cpu_s,
        "timed_out": timed_out,
        "output": output,
        "truncated": keep.dropped > 0,
        "max_rss_kb": usage.ru_maxrss,
        "valgrind_unhandled": unhandled,
        # the OOM killer struck in our memory cgroup during the run; null: cannot tell
        "oom_killed": None if ooms is None or ooms_after is None else ooms_after > ooms,
    }


def _hash(req: dict[str, Any]) -> dict[str, Any]:
    old, new = req.get("replace") or ["", ""]
    root = req["root"]
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not (os.access(path, os.X_OK) or ".so" in name):
                continue
            with open(path, "rb") as fh:
                data = fh.read()
            if old:
                data = data.replace(old.encode(), new.encode())
            out[os.path.relpath(path, root)] = hashlib.sha256(data).hexdigest()
    return {"files": out}


def _not_dumpable() -> None:
    """Other processes of our uid (the command we run, in the host's jail) may not open our
    /proc/<pid>/fd nor ptrace us: they cannot write a forged answer on our stdout."""
    with contextlib.suppress(Exception):  # not Linux, or no libc: nothing to protect here
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def main() -> None:
    _not_dumpable()
    req = json.loads(sys.argv[1])
    if req["op"] == "probe":
        probe = {
            "instructions_unsupported": instructions_unsupported(),
            "valgrind_unsupported": valgrind_unsupported(),
        }
        sys.stdout.write(json.dumps(probe))
        return
    sys.stdout.write(json.dumps(_run(req) if req["op"] == "run" else _hash(req)))


if __name__ == "__main__":
    main()
