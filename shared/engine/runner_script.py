"""The test runner copied into every container image (`/opt/cppperf/runner.py`); stdlib only.

It times commands *inside* the container, so the engine's exec overhead never enters a sample.
Takes one JSON request as its argument, writes one JSON answer on stdout:

    {"op": "run", "argv": [...], "cwd": "...", "env": {...}, "timeout": 600, "output_limit": 65536,
     "cpu": 0, "uid": 1000}
        → {"returncode": 0, "wall_s": 0.1, "cpu_s": 0.09, "timed_out": false, "output": "...",
           "truncated": false}
    {"op": "hash", "root": "/work/old/build", "replace": ["/work/old", "/work/new"]}
        → {"files": {"test_x": "<sha256>", "lib/libcore.so": "..."}}   (executables and .so files;
           embedded occurrences of the first path are replaced by the second before hashing)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO


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


def _preexec(cpu: int | None, uid: int | None) -> None:
    os.setsid()
    if cpu is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cpu})
    if uid is not None:
        os.setgroups([])  # not root's supplementary groups
        os.setgid(uid)
        os.setuid(uid)


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


def _run(req: dict[str, Any]) -> dict[str, Any]:
    if req.get("fresh_tmp"):
        _empty_temp_dirs()
    keep = OutputKeeper(int(req.get("output_limit", 65536)))
    cpu = None if req.get("cpu") is None else int(req["cpu"])
    uid = None if req.get("uid") is None else int(req["uid"])
    start = time.perf_counter_ns()
    try:
        proc = subprocess.Popen(
            req["argv"],
            cwd=req.get("cwd") or None,
            env=req.get("env") or None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: _preexec(cpu, uid),  # noqa: PLW1509 - the runner is single-threaded here
        )
    except OSError as exc:
        return {
            "returncode": 127,
            "wall_s": 0.0,
            "cpu_s": 0.0,
            "timed_out": False,
            "output": f"cannot start: {exc}",
            "truncated": False,
        }
    status, usage, wall, timed_out = supervise(proc, keep, float(req.get("timeout", 600)), start)
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "timed_out": timed_out,
        "output": keep.text(),
        "truncated": keep.dropped > 0,
        "max_rss_kb": usage.ru_maxrss,
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
    sys.stdout.write(json.dumps(_run(req) if req["op"] == "run" else _hash(req)))


if __name__ == "__main__":
    main()
