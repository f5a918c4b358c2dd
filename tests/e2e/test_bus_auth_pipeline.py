"""The whole pipeline on the shipped secured configuration, each service as its own NATS user:
crawler (submit, as `crawler`), filter, classifier (heuristic), builder (the real handler: claims,
records, publish; a stand-in instead of compiling, as tests/fault_worker.py) and the evaluator
(answering an agent). Nothing may be dead-lettered for lack of a permission."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faststream.nats import NatsBroker

from cppperf.client import AgentClient
from cppperf.demo import DemoRepo
from cppperf.runtime import connect, run_services
from cppperf.services.builder import app as builder_app
from cppperf.services.builder.handlers import EngineOps
from cppperf.services.builder.service import BuiltPatch, write_instance
from cppperf.services.crawler.handlers import submit
from cppperf.services.evaluator import app as evaluator_app
from cppperf.shared import messages as m
from cppperf.shared.bus import wait_drained
from cppperf.shared.claims import KvClaims
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import Settings
from tests.conftest import Proven, make_settings
from tests.fakes import stand_in_record
from tests.integration.test_bus_auth import FakeOps
from tests.secured_bus import SecuredBus, fresh_bus, running_secured_bus

pytestmark = pytest.mark.stage2


class StandInOps(EngineOps):
    """The builder's handler with a stand-in proof: every commit `not-improved`, no compiler."""

    def prove(self, commit: m.CommitSelected, path: Path, diff: str) -> BuiltPatch:
        iid = m.instance_id(commit.repo, commit.sha)
        record = stand_in_record(commit, "not-improved")
        out = write_instance(Path(self.settings.out_dir), record)
        msg = m.PatchBuilt(
            instance_id=iid, repo=commit.repo, sha=commit.sha, parent=commit.parent, verdict="not-improved"
        )
        return BuiltPatch(record, msg, out)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBus]:
    with running_secured_bus(tmp_path_factory.mktemp("secured-pipeline"), ["alice"]) as bus:
        yield bus


def as_service(secured: SecuredBus, tmp_path: Path, who: str) -> Settings:
    return make_settings(
        tmp_path,
        nats_url=secured.url,
        bus={"creds": secured.creds(who)},
        mining={"validate_latest": False, "mirror_dir": str(tmp_path / "mirrors")},
    )


@contextlib.asynccontextmanager
async def service(secured: SecuredBus, tmp_path: Path, name: str, **register: Any) -> AsyncIterator[None]:
    async with run_services(as_service(secured, tmp_path, name), secured.url, [name], register=register):
        yield


async def test_pipeline_runs_with_least_privilege_users(
    secured: SecuredBus, tmp_path: Path, demo_repo: DemoRepo
) -> None:
    admin = as_service(secured, tmp_path, "admin")
    await fresh_bus(secured, tmp_path)
    ops = FakeOps()

    def builder(broker: NatsBroker, ctx: ServiceContext) -> builder_app.Wired:
        claims = KvClaims(ctx.store)
        return builder_app.register(broker, ctx, ops=StandInOps(ctx.settings, claims), claims=claims)

    def evaluator(broker: NatsBroker, ctx: ServiceContext) -> evaluator_app.Wired:
        return evaluator_app.register(broker, ctx, ops=ops)  # `run_services` closes what it started

    async with (
        service(secured, tmp_path, "filter"),
        service(secured, tmp_path, "classifier"),
        service(secured, tmp_path, "builder", builder=builder),
        service(secured, tmp_path, "evaluator", evaluator=evaluator),
    ):
        async with connect(as_service(secured, tmp_path, "crawler"), secured.url) as crawler:
            report = await submit(crawler, [str(demo_repo.path)], validate=False, repo_ids={})
        assert report.published == ["local/demo"]
        async with connect(admin, secured.url) as ctx:
            await wait_drained(ctx.bus, timeout=120)
            commits = await ctx.store.all("commits")
            instances = await ctx.store.ids("instances")
            dead = await ctx.bus.dead_letters()
            built = (await ctx.bus.js.stream_info("PATCH_BUILT")).state.messages
        assert {c.get("stage") for c in commits} >= {"classified"}, commits  # filter and classifier wrote
        assert instances and built == len(instances)  # the builder recorded and announced
        assert dead == [], [d.letter.error for d in dead]
        async with await AgentClient.connect(secured.url, secured.creds("alice")) as alice:
            eid = await alice.submit("local__demo-0123456789ab", "fast", run_id="r", model="m")
            assert (await alice.wait(eid, poll=0.1, max_wait=20))["verdict"] == "opt"


@pytest.mark.slow
@pytest.mark.build
async def test_real_evaluation_over_the_secured_bus(
    secured: SecuredBus, tmp_path: Path, proven: Callable[[str], Proven]
) -> None:
    """The expert's own patch of the demo's perf commit, sent by agent alice with only her creds
    and evaluated for real (builds, tests, timing) by the evaluator as its own user."""
    settings = make_settings(
        tmp_path,
        nats_url=secured.url,
        bus={"creds": secured.creds("evaluator")},
        evaluator={"runs": 5, "runs_dir": str(tmp_path / "runs")},
    )
    await fresh_bus(secured, tmp_path)  # a clean bus
    perf = proven("perf")
    perf.copy_to(Path(settings.out_dir))
    iid, patch = perf.record["cppperf"]["instance_id"], perf.record["commit_info"]["patch"][0]
    async with (
        run_services(settings, secured.url, ["evaluator"]),
        await AgentClient.connect(secured.url, secured.creds("alice")) as alice,
    ):
        eid = await alice.submit(iid, patch, run_id="real", model="expert")
        report = await alice.wait(eid, poll=0.5, max_wait=600)
    assert report["tests_pass"] and report["verdict"] in {"opt", "correct"}, report
    assert (tmp_path / "runs" / "alice.real" / "expert" / iid / "report.json").is_file()
