"""A builder process for the fault-injection suite: the real runtime (`runtime.run`,
`run_services`, SIGTERM handling, heartbeat) and the real builder handler (claims, per-process
workspace, store before publish), with a stand-in for `build_patch` that writes a marker, sleeps
in the workspace and returns a verdict, instead of compiling C++.

Usage: python -m tests.fault_worker NATS_URL MARKER_DIR SLEEP_SECONDS SETTINGS_JSON
Markers: ready-<pid> once consuming; started-<pid> when a build begins (holds the workspace
path) and start-<instance>-<pid>; built-<pid>-<n> ("<instance> <verdict>") when a build returns.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker

from cppperf.runtime import run, run_services
from cppperf.services.builder import app as builder_app
from cppperf.services.builder.handlers import EngineOps
from cppperf.services.builder.service import BuiltPatch, write_instance
from cppperf.shared import messages as m
from cppperf.shared.claims import KvClaims
from cppperf.shared.logging import configure_logging
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import load_settings
from tests.fakes import stand_in_record


def fake_build(marker_dir: Path, sleep: float) -> Any:
    def build(
        commit: m.CommitSelected, repo_path: Path, settings: Any, *, work_dir: Path, out_dir: Path, **_: Any
    ) -> BuiltPatch:
        iid = m.instance_id(commit.repo, commit.sha)
        ws = work_dir / iid
        ws.mkdir(parents=True, exist_ok=True)
        (ws / "build.log").write_text("building\n")
        (marker_dir / f"started-{os.getpid()}").write_text(str(work_dir))
        tmp = marker_dir / f".start-{iid}-{os.getpid()}"
        tmp.write_text(str(os.getpid()))
        tmp.rename(marker_dir / f"start-{iid}-{os.getpid()}")
        time.sleep(sleep)
        verdict = "improved" if os.getpid() % 2 else "not-improved"  # two builders would disagree
        record = stand_in_record(commit, verdict, seed=os.getpid())  # the pid: whose build it was
        path = write_instance(out_dir, record)
        n = len(list(marker_dir.glob(f"built-{os.getpid()}-*")))
        tmp = marker_dir / f".built-{os.getpid()}-{n}"
        tmp.write_text(f"{iid} {verdict}")
        tmp.rename(marker_dir / f"built-{os.getpid()}-{n}")  # atomic: readers never see it empty
        msg = m.PatchBuilt(
            instance_id=iid,
            repo=commit.repo,
            sha=commit.sha,
            parent=commit.parent,
            verdict=verdict,
        )
        return BuiltPatch(record, msg, path)

    return build


async def main(
    stop: asyncio.Event, url: str, marker_dir: Path, sleep: float, overrides: dict[str, Any]
) -> None:
    lease = {k: v for k, v in os.environ.items() if k == "CPPPERF_BUILDER_LEASE_DIR"}  # the test run's
    settings = load_settings(env=lease, nats_url=url, **overrides)
    build = fake_build(marker_dir, sleep)

    class StandInOps(EngineOps):
        def prove(self, commit: m.CommitSelected, path: Path, diff: str) -> BuiltPatch:
            s = self.settings
            out = Path(s.out_dir)
            built: BuiltPatch = build(
                commit,
                path,
                s.builder,
                work_dir=self.claims.workspace(s.work_dir(), owner=s.run_owner()),
                out_dir=out,
            )
            return built

    def register(broker: NatsBroker, ctx: ServiceContext) -> builder_app.Wired:
        claims = KvClaims(ctx.store)
        return builder_app.register(broker, ctx, ops=StandInOps(settings, claims), claims=claims)

    async with run_services(settings, url, ["builder"], register={"builder": register}):
        (marker_dir / f"ready-{os.getpid()}").write_text("")
        await stop.wait()


if __name__ == "__main__":
    configure_logging("info", json=True)
    url, markers, sleep_s, raw = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    run(lambda stop: main(stop, url, markers, sleep_s, json.loads(raw)))
    (markers / f"exited-{os.getpid()}").write_text("")
