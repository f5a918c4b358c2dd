"""`mine` whose own embedded NATS server dies for good (not an outage it can wait out): one error
line at once, exit 1, never an endless "bus: connection lost"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cppperf.demo import create_demo_repo

pytestmark = pytest.mark.stage2


def _nats_child(pid: int) -> int | None:
    for kid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"nats-server" in Path(f"/proc/{kid}/cmdline").read_bytes():
                return int(kid)
        except OSError:
            continue
    return None


@pytest.mark.nats
@pytest.mark.build
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mine_fails_in_one_line_when_its_embedded_server_is_killed(tmp_path: Path) -> None:
    demo = create_demo_repo(tmp_path / "demo")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cppperf", "mine", "--repo", str(demo.path), "--runs", "6", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: lines.extend((time.monotonic(), ln) for ln in iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    try:
        deadline = time.monotonic() + 120
        # the builder has taken the commit: mine is waiting for the pipeline to drain
        while time.monotonic() < deadline and not any('"commit.classified"' in ln for _, ln in lines):
            time.sleep(0.1)
        server = _nats_child(proc.pid)
        assert server is not None, "".join(ln for _, ln in lines)[-3000:]
        os.kill(server, signal.SIGKILL)
        killed = time.monotonic()
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    proc.stdout.close()  # type: ignore[union-attr]
    text = "".join(ln for _, ln in lines)
    errors = [(t, ln) for t, ln in lines if ln.startswith("error: ")]
    assert rc == 1, text[-3000:]
    assert len(errors) == 1 and "Traceback" not in text, text[-3000:]
    when, line = errors[0]
    assert f"the embedded NATS server (pid {server})" in line and "killed by signal 9" in line
    assert when - killed < 10  # said at once, not after the services' stop grace
