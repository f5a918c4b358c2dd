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
