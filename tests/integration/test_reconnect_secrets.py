"""A service connected with `nats://user:password@host:port` whose real server is restarted logs
its disconnect and reconnect (shared/bus.py's callbacks, FastStream's own lines) without the
password: the server appears as host:port only (#25 item 4)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cppperf.shared.embedded import EmbeddedNats, free_port

CLI = [sys.executable, "-m", "cppperf"]


def _server(tmp_path: Path, port: int, password: str) -> EmbeddedNats:
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f"listen: 127.0.0.1:{port}\n"
        f'jetstream {{\n  store_dir: "{tmp_path / "store"}"\n}}\n'
        f'authorization {{\n  user: cppperf\n  password: "{password}"\n}}\n'
    )
    return EmbeddedNats(tmp_path / "store", port=port, config=conf).start()


def _wait_for(log: Path, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if text in content:
            return content
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never logged:\n{log.read_text()[-3000:]}")


@pytest.mark.nats
@pytest.mark.slow
def test_reconnect_lines_name_host_and_port_only(tmp_path: Path) -> None:
    password = "pw-" + secrets.token_hex(12)
    port = free_port()
    server = _server(tmp_path, port, password)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CPPPERF_")},
        "CPPPERF_NATS_URL": f"nats://cppperf:{password}@127.0.0.1:{port}",
        "CPPPERF_OUT_DIR": str(tmp_path / "out"),
        "CPPPERF_HEALTH_DIR": str(tmp_path / "health"),
        "CPPPERF_BUS_RECONNECT_WAIT": "0.5",
        "CPPPERF_MINING_MIRROR_DIR": str(tmp_path / "mirrors"),
    }
    log = tmp_path / "filter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*CLI, "serve", "filter"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(log, "filter running", 60)
        server.stop()
        _wait_for(log, "nats_disconnected", 30)
        server = _server(tmp_path, port, password)
        text = _wait_for(log, "nats_reconnected", 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        server.stop()
    text = log.read_text(errors="replace")
    assert code == 0, text[-2000:]
    reconnected = [line for line in text.splitlines() if "nats_reconnected" in line]
    assert any(f"127.0.0.1:{port}" in line for line in reconnected), reconnected
    assert password not in text, [line for line in text.splitlines() if password in line]
    assert "Traceback" not in text, text[text.find("Traceback") :][:1500]  # one line per reconnect error
    assert "cppperf:" + password not in text


def test_a_broken_broker_connection_is_one_line_without_traceback() -> None:
    """FastStream hands nats-py's reconnect errors (a restarting server answering without INFO)
    to its logger with the exception: one `broker_connection_error` line, no traceback."""
    import io
    import json

    import nats.errors

    from cppperf.runtime import BrokerLog
    from cppperf.shared.logging import configure_logging

    buf = io.StringIO()
    configure_logging("info", json=True, file=buf)
    try:
        try:
            raise nats.errors.Error("nats: empty response from server when expecting INFO message")
        except nats.errors.Error as exc:
            error = exc
        text = f"Connection broken with {error!r}"
        BrokerLog().log(30, text, exc_info=error, extra={"subject": "", "queue": ""})
    finally:
        configure_logging("info")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    entry = json.loads(lines[0])
    assert entry["event"] == "broker_connection_error" and "expecting INFO" in entry["error"]
