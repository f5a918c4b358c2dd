"""The agents' API subscription (`services/evaluator/api.py`): a failed start is retried afresh."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from cppperf.services.evaluator import api


class FakeNc:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    async def subscribe(self, subject: str, **kw: Any) -> str:
        if self.fail:
            raise ConnectionError("subscribe refused")
        return f"sub:{subject}:{kw['queue']}"


class FakeBus:
    def __init__(self, fail: bool) -> None:
        self.nc = FakeNc(fail)
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def test_a_failed_start_is_retried_and_leaves_no_connection_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """One connection per subject (every partition of the agents, then the open bus's); a failed
    dial or subscription is retried afresh, the connections of the failed try closed."""
    wanted = api.subjects()
    serving = [FakeBus(fail=False) for _ in wanted]
    first_ok = FakeBus(fail=False)
    outcomes: list[Exception | FakeBus] = [OSError("no route"), first_ok, FakeBus(fail=True), *serving]
    dialled: list[FakeBus] = []

    async def connect(url: str, settings: Any, *, name: str) -> FakeBus:
        got = outcomes.pop(0)
        if isinstance(got, Exception):
            raise got
        dialled.append(got)
        return got

    monkeypatch.setattr(api.Bus, "connect", connect)
    ctx: Any = SimpleNamespace(bus=SimpleNamespace(url="nats://x", settings=None))

    async def scenario() -> None:
        door = api.AgentApi(ctx, None)
        door.start()
        with pytest.raises(OSError):
            await door.subscribed()  # the dial failed
        with pytest.raises(ConnectionError):
            await door.subscribed()  # dialled again; the second subscription failed
        assert first_ok.closed and dialled[1].closed  # neither connection is left behind
        await door.subscribed()  # the third try serves
        assert door.subs == [f"sub:{s}:evaluator-api" for s in wanted] and door.buses == serving
        assert len(wanted) == api.m.API_PARTITIONS + 1 and wanted[-1] == "eval.api.*.*"
        await door.subscribed()  # in place: nothing dialled again
        assert not outcomes and len(dialled) == 2 + len(wanted)
        await door.close()
        assert all(b.closed for b in serving) and door.buses == []

    asyncio.run(scenario())


def test_a_request_names_its_agent_by_its_subject_and_partition() -> None:
    """`eval.api.<agent>.<verb>` (an open bus) and `eval.api.<partition>.<agent>.<verb>` (where a
    secured bus's import puts it): the agent and verb; a partition that is not the agent's own,
    or any other shape, names no one (the request is refused)."""
    from cppperf.services.evaluator.gateway import agent_of
    from cppperf.shared import messages as m

    part = m.api_partition("bob")
    other = next(f"p{i}" for i in range(m.API_PARTITIONS) if f"p{i}" != part)
    assert agent_of("eval.api.bob.submit") == ("bob", "submit")
    assert agent_of(m.eval_api_service_subject("bob", "results")) == ("bob", "results")
    assert m.eval_api_service_subject("bob", "results") == f"eval.api.{part}.bob.results"
    for subject in (
        f"eval.api.{other}.bob.submit",
        f"eval.api.{part}.Bob.submit",
        f"eval.api.{part}.bob.delete",
        f"eval.api.x.{part}.bob.submit",
        "eval.api.bob",
        "eval.completed.bob.submit",
    ):
        assert agent_of(subject) is None, subject
    assert {m.api_partition(f"agent{i}") for i in range(200)} == {f"p{i}" for i in range(m.API_PARTITIONS)}


class _Conn:
    def __init__(self, connected: bool = True, closed: bool = False) -> None:
        self.is_connected, self.is_closed = connected, closed


def test_one_partition_reconnecting_is_not_an_unhealthy_evaluator() -> None:
    """A flood gets its partition's connection cut (and nats-py reconnects it): restarting the
    evaluator for that would stop every other partition. All connections away, or one closed
    for good, is unhealthy."""
    ctx: Any = SimpleNamespace(bus=SimpleNamespace(url="nats://x", settings=None))
    door = api.AgentApi(ctx, None)

    async def done() -> None:
        return None

    async def scenario(conns: list[_Conn]) -> str | None:
        door.task = asyncio.create_task(done())
        await door.task
        door.buses = [SimpleNamespace(nc=c) for c in conns]  # type: ignore[misc]
        door.subs = [object() for _ in conns]  # type: ignore[misc]
        return door.problem()

    n = len(api.subjects())
    assert asyncio.run(scenario([_Conn(connected=False)] + [_Conn() for _ in range(n - 1)])) is None
    down = asyncio.run(scenario([_Conn(connected=False) for _ in range(n)]))
    assert down is not None and "down (reconnecting)" in down
    closed = asyncio.run(
        scenario([_Conn(), _Conn(connected=False, closed=True)] + [_Conn() for _ in range(n - 2)])
    )
    assert closed is not None and "eval.api.p1.*.*) closed" in closed


def test_an_answer_too_large_to_send_is_a_short_refusal() -> None:
    """nats-py refuses to publish past the server's max payload: the agent gets a one-line
    refusal instead of waiting out its timeout; other send failures (connection away) are silent."""
    from nats.errors import MaxPayloadError

    from cppperf.shared import messages as m

    sent: list[bytes] = []

    class Msg:
        reply = "_INBOX.x"
        subject = "eval.api.p0.bob.result"

        def __init__(self, fail: type[Exception] | None) -> None:
            self.fail = fail

        async def respond(self, data: bytes) -> None:
            if self.fail is not None and not sent:
                sent.append(b"")
                raise self.fail
            sent.append(data)

    asyncio.run(api.AgentApi._respond(Msg(MaxPayloadError), m.AgentAnswer(ok=True, id="x" * 10)))  # type: ignore[arg-type]
    answer = m.decode(sent[-1], m.AgentAnswer)
    assert not answer.ok and "larger than a message may be" in answer.error
    sent.clear()
    asyncio.run(api.AgentApi._respond(Msg(ConnectionError), m.AgentAnswer(ok=True)))  # type: ignore[arg-type]
    assert sent == [b""]  # tried once, nothing else


def test_a_connection_that_cannot_drain_is_closed_all_the_same() -> None:
    """A flood's partition connection is often reconnecting when the evaluator stops: nats-py
    refuses to drain it (ConnectionReconnectingError), and the connection went on reconnecting
    in the background after `close()`. It is closed outright then."""
    from nats.errors import ConnectionReconnectingError

    from cppperf.shared.bus import Bus
    from cppperf.shared.settings import BusSettings

    class Nc:
        is_closed = False

        async def drain(self) -> None:
            raise ConnectionReconnectingError

        async def close(self) -> None:
            self.is_closed = True

    nc = Nc()
    asyncio.run(Bus(nc, None, BusSettings()).close())  # type: ignore[arg-type]
    assert nc.is_closed
