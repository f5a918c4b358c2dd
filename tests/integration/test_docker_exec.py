"""`exec_bounded`: a command in a container always returns — with its output and exit code when
the engine closes the stream, with them too when the engine keeps a finished exec's stream open
(podman under load), and with InfraFailure past its deadline. The unit tests drive it through a
socket pair standing in for the engine's hijacked connection; the last test runs it on the real
engine."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from cppperf.shared.engine.docker_exec import HEADER, exec_bounded
from cppperf.shared.errors import InfraFailure


def frame(stream: int, data: bytes) -> bytes:
    return HEADER.pack(stream, len(data)) + data


class FakeEngine:
    """The docker SDK's low-level exec calls, over a socket pair: `script` is what the engine
    sends (bytes, or a float to sleep), then it closes the stream unless `keep_open`."""

    def __init__(
        self, script: list[bytes | float], *, keep_open: bool, runs_for: float, code: int = 0
    ) -> None:
        self.script, self.keep_open, self.runs_for, self.code = script, keep_open, runs_for, code
        self.ours, self.engine = socket.socketpair()
        self.started = 0.0
        self.inspects = 0

    def exec_create(self, container_id: str, argv: list[str], **kw: Any) -> dict[str, str]:
        assert container_id == "c1" and kw["user"] == "0"
        return {"Id": "e" * 64}

    def exec_start(self, exec_id: str, socket: bool) -> Any:
        assert socket
        self.started = time.monotonic()
        threading.Thread(target=self._send, daemon=True).start()
        return self.ours

    def _send(self) -> None:
        for step in self.script:
            if isinstance(step, float):
                time.sleep(step)
            else:
                self.engine.sendall(step)
        if not self.keep_open:
            self.engine.close()

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        self.inspects += 1
        running = time.monotonic() - self.started < self.runs_for
        return {"Running": running, "ExitCode": None if running else self.code}


def container(engine: FakeEngine) -> Any:
    return SimpleNamespace(id="c1", client=SimpleNamespace(api=engine))


def test_output_of_both_streams_in_order_and_the_exit_code() -> None:
    body = frame(1, b"hello ") + frame(2, b"warn ") + frame(1, b"world")
    # frames cut at arbitrary points, as a socket delivers them
    engine = FakeEngine([body[:3], 0.05, body[3:13], 0.05, body[13:]], keep_open=False, runs_for=0.0, code=3)
    code, out = exec_bounded(container(engine), ["x"], user="0", deadline_s=30, idle_check_s=5)
    assert (code, out) == (3, b"hello warn world")
    assert engine.inspects == 1  # the stream ended: only the exit code was asked for


def test_a_stream_left_open_after_the_exec_ended_returns() -> None:
    # the hang seen with podman: output sent, process gone, connection never closed
    answer = b'{"returncode": 0}'
    engine = FakeEngine([frame(1, answer)], keep_open=True, runs_for=0.3, code=0)
    t0 = time.monotonic()
    code, out = exec_bounded(container(engine), ["x"], user="0", deadline_s=60, idle_check_s=0.2)
    assert (code, out) == (0, answer)
    assert time.monotonic() - t0 < 10  # not the deadline: the engine said the exec had ended


def test_output_still_on_its_way_when_the_exec_ends_is_kept() -> None:
    engine = FakeEngine([frame(1, b"first "), 0.6, frame(1, b"late")], keep_open=True, runs_for=0.25, code=0)
    _code, out = exec_bounded(container(engine), ["x"], user="0", deadline_s=60, idle_check_s=0.2)
    assert out == b"first late"


def test_an_exec_that_never_ends_is_an_infra_failure_at_the_deadline() -> None:
    engine = FakeEngine([frame(1, b"tick")], keep_open=True, runs_for=1e9)
    t0 = time.monotonic()
    with pytest.raises(InfraFailure, match="no end within"):
        exec_bounded(container(engine), ["sleep", "forever"], user="0", deadline_s=1.0, idle_check_s=0.2)
    assert 0.9 < time.monotonic() - t0 < 10


def test_an_engine_that_stops_answering_is_an_infra_failure() -> None:
    engine = FakeEngine([], keep_open=True, runs_for=1e9)

    def refuse(exec_id: str) -> dict[str, Any]:
        raise ConnectionError("engine gone")

    engine.exec_inspect = refuse  # type: ignore[method-assign]
    with pytest.raises(InfraFailure, match="did not answer"):
        exec_bounded(container(engine), ["x"], user="0", deadline_s=30, idle_check_s=0.1)


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a fresh machine debootstraps the base image first
def test_on_the_real_engine() -> None:
    from tests.integration.test_docker import _engine

    client = _engine()
    if client is None:
        pytest.skip("no container engine reachable: set DOCKER_HOST (.ci/run starts podman's Docker API)")
    from cppperf.shared.engine.images import base_name, bootstrap_base

    bootstrap_base(client, "bookworm")
    box = client.containers.run(
        base_name("bookworm"), ["sleep", "infinity"], detach=True, network_mode="none"
    )
    try:
        code, out = exec_bounded(
            box, ["sh", "-c", "printf out; printf err >&2; exit 7"], user="0", deadline_s=120
        )
        assert code == 7 and sorted(out.decode()) == sorted("outerr")
        big = 300_000  # more than one frame and one read
        code, out = exec_bounded(box, ["head", "-c", str(big), "/dev/zero"], user="0", deadline_s=120)
        assert code == 0 and out == b"\0" * big
        with pytest.raises(InfraFailure, match="no end within"):
            exec_bounded(box, ["sleep", "30"], user="0", deadline_s=2, idle_check_s=0.5)
    finally:
        box.remove(force=True)
        client.close()


def test_an_answer_the_engine_lost_is_asked_for_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # podman drops a short exec's whole output now and then (exit 0, empty stream)
    from cppperf.shared.engine import docker_exec

    replies = iter([(0, b""), (0, b""), (0, b'{"ok": 1}')])
    calls: list[list[str]] = []

    def flaky(container: Any, argv: list[str], **kw: Any) -> tuple[int, bytes]:
        calls.append(argv)
        return next(replies)

    monkeypatch.setattr(docker_exec, "exec_bounded", flaky)
    assert docker_exec.exec_answer(None, ["runner"], user="0", deadline_s=5) == (0, b'{"ok": 1}')
    assert len(calls) == 3
    # never more than ANSWER_TRIES runs: the caller sees the empty answer and says so
    replies = iter([(0, b"")] * 10)
    calls.clear()
    assert docker_exec.exec_answer(None, ["runner"], user="0", deadline_s=5) == (0, b"")
    assert len(calls) == docker_exec.ANSWER_TRIES
