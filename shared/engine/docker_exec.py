"""A command in a running container that always returns: `exec_bounded`.

The docker SDK's `Container.exec_run` reads the exec's output stream with no timeout at all (it
disables the socket's timeout and polls without one). When the engine keeps that stream open
after the process has exited — podman does this now and then under load: the exec is gone from
the container, its output was sent, and the connection stays open — the caller waits forever,
and a build worker hangs with it (seen proving a CppPerf-DB instance on the docker backend: one
exec among thousands, the builder blocked for good).

`exec_bounded` starts the exec itself and reads the multiplexed stream with `poll` timeouts:
- every `idle_check_s` without output it asks the engine whether the exec still runs; an exec
  that has ended is read for one more short moment and then taken as finished (its exit code
  from the engine, its output as received) — the engine's open stream no longer matters;
- past `deadline_s` in all it gives up: `InfraFailure` (the machine failed us, never a verdict;
  the builder's message is redelivered and retried).

The output is stdout and stderr together in the order received, as `exec_run` returns them.

Lost output: podman (4.3) also drops a short exec's whole output now and then — exit code 0,
nothing on the stream (3 in 300 `exec_run`s of a 700-byte `python3 -c` beside a build, the
SDK's own call as often as ours). A command whose answer is its output (the runner's JSON, a
record, a version line) goes through `exec_answer`, which runs it again when the output is
empty (`ANSWER_TRIES` in all); every command sent that way may run twice — a test run
re-taken, a build resumed, a read repeated — and each retry is logged.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import time
from typing import Any

from cppperf.shared.errors import InfraFailure
from cppperf.shared.logging import get_logger

log = get_logger(__name__)

HEADER = struct.Struct(">BxxxL")  # the engine's stream frame: stream id, 3 zero bytes, length
DRAIN_S = 1.0  # after the exec has ended: how long to wait for output still on its way
ANSWER_TRIES = 3  # runs of a command whose answer the engine returned empty


def _demux(buf: bytes) -> tuple[bytes, bytes]:
    """Payloads of the complete frames in `buf`, and what remains (a frame not yet complete)."""
    out = bytearray()
    pos = 0
    while len(buf) - pos >= HEADER.size:
        _stream, size = HEADER.unpack_from(buf, pos)
        if len(buf) - pos - HEADER.size < size:
            break
        out += buf[pos + HEADER.size : pos + HEADER.size + size]
        pos += HEADER.size + size
    return bytes(out), buf[pos:]


def _read_some(sock: Any, wait_s: float) -> bytes | None:
    """Bytes from the socket within `wait_s` (b"" at end of stream), or None when none came."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI | select.POLLHUP)
    if not poller.poll(max(0, int(wait_s * 1000))):
        return None
    try:
        data = sock.recv(65536) if hasattr(sock, "recv") else os.read(sock.fileno(), 65536)
    except BlockingIOError:
        return None
    return bytes(data)


def _inspect(api: Any, exec_id: str) -> dict[str, Any]:
    try:
        info: dict[str, Any] = api.exec_inspect(exec_id)
    except Exception as exc:  # docker.errors.APIError, requests' timeouts: the engine failed us
        raise InfraFailure(f"the container engine did not answer on exec {exec_id[:12]}: {exc}") from exc
    return info


def exec_bounded(
    container: Any,
    argv: list[str],
    *,
    user: str,
    deadline_s: float,
    idle_check_s: float = 15.0,
) -> tuple[int, bytes]:
    """Run `argv` in `container` as `user`; (exit code, stdout+stderr). Never waits past
    `deadline_s` (then `InfraFailure`), nor on an engine that keeps a finished exec's stream open."""
    api = container.client.api
    what = " ".join(argv)[:80]
    try:
        exec_id = api.exec_create(container.id, argv, stdout=True, stderr=True, user=user)["Id"]
        sock = api.exec_start(exec_id, socket=True)
    except Exception as exc:  # docker.errors.APIError: container gone, engine down
        raise InfraFailure(f"cannot start `{what}` in the container: {exc}") from exc
    end = time.monotonic() + deadline_s
    pending = b""
    out = bytearray()
    ended_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if now >= end:
                raise InfraFailure(f"`{what}` in the container gave no end within {deadline_s:.0f} s")
            wait = min(idle_check_s, end - now) if ended_at is None else DRAIN_S
            data = _read_some(sock, wait)
            if data == b"":
                break  # end of stream: the normal way out
            if data is None:
                if ended_at is not None:
                    break  # ended, drained: the engine just kept the stream open
                if not _inspect(api, exec_id).get("Running", True):
                    ended_at = time.monotonic()
                continue
            payload, pending = _demux(pending + data)
            out += payload
    finally:
        with contextlib.suppress(Exception):
            sock.close()
    code = _inspect(api, exec_id).get("ExitCode")
    if code is None:
        raise InfraFailure(f"the engine has no exit code for `{what}`")
    return int(code), bytes(out)


def exec_answer(container: Any, argv: list[str], *, user: str, deadline_s: float) -> tuple[int, bytes]:
    """`exec_bounded` for a command that always prints its answer: run again while the engine
    returns no output at all (up to `ANSWER_TRIES` runs); the last try's result otherwise."""
    for attempt in range(1, ANSWER_TRIES + 1):
        code, out = exec_bounded(container, argv, user=user, deadline_s=deadline_s)
        if out.strip():
            break
        log.warning("exec_output_lost", command=" ".join(argv)[:80], exit_code=code, attempt=attempt)
    return code, out
