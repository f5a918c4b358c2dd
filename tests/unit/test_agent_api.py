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
    outcomes: list[Exception | FakeBus] = [OSError("no route"), FakeBus(fail=True), FakeBus(fail=False)]
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
            await door.subscribed()  # dialled again; the subscription failed
        assert dialled[0].closed  # that connection is not left behind
        await door.subscribed()  # the third try serves
        assert door.sub == "sub:eval.api.*.*:evaluator-api" and door.bus is dialled[1]
        await door.subscribed()  # in place: nothing dialled again
        assert not outcomes and len(dialled) == 2
        await door.close()
        assert dialled[1].closed and door.bus is None

    asyncio.run(scenario())
