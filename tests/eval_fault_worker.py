"""An evaluator process for the fault-injection suite: the real runtime (`runtime.run`,
`run_services`) and the real evaluator handler (record, then announce, then ack) with the
`FakeOps` stand-in for the evaluation; `KILL` makes the process SIGKILL itself at one point of its
first announcement: `before-announce` (the record written, nothing announced, not acked) or
`after-announce` (announced, not acked); `none` runs normally.

Usage: python -m tests.eval_fault_worker NATS_URL MARKER_DIR KILL SETTINGS_JSON
Markers: ready-<pid> once consuming.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
from faststream.nats import NatsBroker

from cppperf.runtime import run, run_services
from cppperf.services.evaluator import app as evaluator_app
from cppperf.shared import messages as m
from cppperf.shared.logging import configure_logging
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import load_settings
from tests.integration.test_bus_auth import FakeOps


def killing(ctx: ServiceContext, kill: str) -> None:
    """`ctx.bus.publish` that SIGKILLs this process around an `eval.completed` announcement."""
    real = ctx.bus.publish

    async def publish(subject: str, msg: msgspec.Struct, *, msg_id: str | None = None) -> bool:
        announcing = subject.startswith(m.EVAL_COMPLETED)
        if announcing and kill == "before-announce":
            os.kill(os.getpid(), signal.SIGKILL)
        fresh = await real(subject, msg, msg_id=msg_id)
        if announcing and kill == "after-announce":
            os.kill(os.getpid(), signal.SIGKILL)
        return fresh

    ctx.bus.publish = publish  # type: ignore[method-assign]  # the fault, injected


async def main(stop: asyncio.Event, url: str, marker_dir: Path, kill: str, overrides: dict[str, Any]) -> None:
    lease = {k: v for k, v in os.environ.items() if k == "CPPPERF_BUILDER_LEASE_DIR"}  # the test run's
    settings = load_settings(env=lease, nats_url=url, **overrides)

    def register(broker: NatsBroker, ctx: ServiceContext) -> evaluator_app.Wired:
        killing(ctx, kill)
        return evaluator_app.register(broker, ctx, ops=FakeOps())

    async with run_services(settings, url, ["evaluator"], register={"evaluator": register}):
        (marker_dir / f"ready-{os.getpid()}").write_text("")
        await stop.wait()


if __name__ == "__main__":
    configure_logging("info", json=True)
    url, markers, kill, raw = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    run(lambda stop: main(stop, url, markers, kill, json.loads(raw)))
