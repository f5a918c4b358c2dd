"""The evaluator's heartbeat covers its agents' API: that API has a NATS connection of its own
(`services/evaluator/api.py`), and a dead one left agents unanswered while `cppperf health
evaluator` said "consuming". Now the heartbeat lists it under `checks` and is unhealthy, with the
reason, while it is down; a service's own check never marks another service of the process."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cppperf.runtime import run_services
from cppperf.services.evaluator import app as evaluator_app
from cppperf.shared import health
from cppperf.shared.bus import Bus
from cppperf.shared.embedded import EmbeddedNats
from cppperf.shared.health import Liveness, write_heartbeat
from cppperf.shared.service import ServiceContext
from tests.conftest import make_settings
from tests.integration.test_faults import until


class NeverCalled:
    """The evaluator's slow work: no request is sent in these tests."""

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no evaluation was asked for")

    def validate(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no validation was asked for")


async def _true(value: bool) -> bool:
    return value


@contextlib.asynccontextmanager
async def healthy_evaluator(nats_server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[tuple[Path, Bus]]:
    """An evaluator service whose heartbeat said healthy: its health folder and its agents' API bus."""
    settings = make_settings(
        tmp_path, nats_url=nats_server.url, health_dir=str(tmp_path / "health"), bus={"health_interval": 0.2}
    )
    hdir = settings.health_path()
    wired: list[evaluator_app.Wired] = []

    def register(broker: Any, ctx: ServiceContext) -> evaluator_app.Wired:
        wired.append(evaluator_app.register(broker, ctx, ops=NeverCalled()))
        return wired[-1]

    async with run_services(settings, nats_server.url, ["evaluator"], register={"evaluator": register}):
        await until(lambda: _true(health.check(hdir, "evaluator", 5)[0]), what="healthy")
        api_bus = wired[0].api.buses[0]  # the first partition's connection
        assert api_bus.nc.is_connected
        yield hdir, api_bus


@pytest.mark.nats
@pytest.mark.usefixtures("ctx")  # the session's bus, wiped and provisioned
async def test_a_dead_agents_api_connection_makes_the_evaluator_unhealthy(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    async with healthy_evaluator(nats_server, tmp_path) as (hdir, api_bus):
        beat = json.loads(health.heartbeat_path(hdir, "evaluator").read_text())
        assert beat["checks"] == [{"name": "evaluator-api", "ok": True, "reason": ""}]
        await api_bus.nc.close()  # the API's own connection dies; the service's stays up

        await until(lambda: _true(not health.check(hdir, "evaluator", 5)[0]), what="unhealthy")
        assert health.check(hdir, "evaluator", 5) == (
            False,
            "evaluator: agents' API connection (evaluator-api, eval.api.p0.*.*) closed: agents get no answer",
        )
        beat = json.loads(health.heartbeat_path(hdir, "evaluator").read_text())
        assert beat["checks"][0]["ok"] is False and "closed" in beat["checks"][0]["reason"]


@pytest.mark.nats
@pytest.mark.usefixtures("ctx")  # the session's bus, wiped and provisioned
async def test_an_api_connection_that_stopped_reading_makes_the_evaluator_unhealthy(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """nats-py's read loop ends for good at an exception it does not expect, and the connection
    still says connected: a request an agent crafted once left every agent unanswered that way
    while the heartbeat said healthy (tests/integration/test_attack_agent.py). The loop's end is
    simulated here (its task cancelled); the heartbeat turns unhealthy with the reason."""
    async with healthy_evaluator(nats_server, tmp_path) as (hdir, api_bus):
        reader = api_bus.nc._reading_task  # the read loop, as nats-py runs it
        assert reader is not None
        reader.cancel()
        await until(lambda: _true(not health.check(hdir, "evaluator", 5)[0]), what="unhealthy")
        assert api_bus.nc.is_connected  # what the check used to rely on alone
        assert health.check(hdir, "evaluator", 5) == (
            False,
            "evaluator: agents' API connection (evaluator-api, eval.api.p0.*.*) stopped reading: agents get no answer",
        )


def test_a_services_own_check_marks_only_that_service(tmp_path: Path) -> None:
    live = Liveness()
    down: list[str] = []
    live.check("evaluator", "evaluator-api", lambda: down[0] if down else None)

    def broken() -> str | None:
        raise RuntimeError("boom")

    live.check("builder", "odd", broken)
    assert write_heartbeat(tmp_path, "evaluator", None, live) is None
    down.append("agents' API connection (evaluator-api) down (reconnecting)")
    assert write_heartbeat(tmp_path, "evaluator", None, live) == down[0]
    assert write_heartbeat(tmp_path, "filter", None, live) is None  # another service of the process
    assert write_heartbeat(tmp_path, "builder", None, live) == "odd: check failed: boom"
    # the process-wide reason (its main connection) comes first
    assert write_heartbeat(tmp_path, "evaluator", "NATS connection down (reconnecting)", live) == (
        "NATS connection down (reconnecting)"
    )
    assert health.check(tmp_path, "filter", 5)[0] and not health.check(tmp_path, "builder", 5)[0]
