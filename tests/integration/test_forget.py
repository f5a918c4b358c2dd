"""`cppperf agents forget`: the operator removes an agent's stored evaluations (one run, or all)
on a real nats-server running the shipped deploy/nats configuration — records with their markers
(so they stop counting against `agent_max_evaluations`), report objects, run folders — and nothing
of another agent's; an agent's own credential cannot do it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cppperf.cli import app
from cppperf.client import AgentClient, Refused
from cppperf.runtime import connect
from cppperf.services.evaluator.forget import forget, forget_folders
from cppperf.shared import messages as m
from cppperf.shared.errors import BadInput
from tests.integration.test_bus_auth import FakeOps, server_refuses
from tests.secured_bus import SecuredBus, evaluator_service, running_secured_bus
from tests.secured_bus import as_user as settings_as

pytestmark = pytest.mark.nats
QUOTA = 4


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBus]:
    with running_secured_bus(tmp_path_factory.mktemp("forget"), ["alice", "bob", "bob-x"]) as bus:
        yield bus


async def _fill(agent: AgentClient, runs: list[str]) -> None:
    """One `unknown-instance` evaluation (milliseconds) per run given, each waited for."""
    for i, run in enumerate(runs):
        await agent.wait(await agent.submit(f"nope__x-{i:012d}", "p", run_id=run), poll=0.05, max_wait=30)


async def test_forgetting_a_run_gives_the_agent_back_its_quota_and_touches_no_one_else(
    secured: SecuredBus, tmp_path: Path
) -> None:
    async with (
        evaluator_service(secured, tmp_path, FakeOps(), agent_max_evaluations=QUOTA) as ctx,
        await AgentClient.connect(secured.url, secured.creds("bob")) as bob,
        await AgentClient.connect(secured.url, secured.creds("bob-x")) as bob_x,
    ):
        await _fill(bob, ["r1", "r1", "r10", "r2"])  # bob's quota is full
        await _fill(bob_x, ["r1"])  # a name that extends bob's: never bob's
        with pytest.raises(Refused, match=f"{QUOTA} evaluations of bob"):
            await bob.submit("nope__x-000000000099", "p", run_id="r3")
        # the evaluator's user may not purge (only the admin's CLI): a marker or a key stays
        big = await ctx.store.put_blob("report-bob", b"x" * 1000)
        eid = m.evaluation_id(m.agent_run("bob", "r2"), "model", "nope__x-000000000009")
        await ctx.store.put("evaluations", eid, {"verdict": "correct", "report_ref": big, "agent": "bob"})
        await ctx.store.delete("evaluations", m.evaluation_id(m.agent_run("bob", "r2"), "m", "gone"))
        # the operator's own run `bob.baseline` (a run id may hold dots): not bob's, kept
        operators = m.evaluation_id("bob.baseline", "gold", "nope__x-000000000007")
        await ctx.store.put(
            "evaluations", operators, {"verdict": "opt", "agent": "", "run_id": "bob.baseline"}
        )

        admin_settings = settings_as(secured, tmp_path, "admin")
        async with connect(admin_settings, secured.url) as admin:
            done = await forget(admin.store, "bob", "r1")
            assert (done.records, done.reports) == (2, 0)  # r10 is another run
            # r10, r2 (+ a key, + a marker), the operator's run (its prefix is bob's: it counts)
            assert await admin.store.count("evaluations", under="bob") == 5
            with pytest.raises(Refused, match=f"{QUOTA + 1} evaluations of bob"):  # a marker counts
                await bob.submit("nope__x-000000000099", "p", run_id="r3")
            done = await forget(admin.store, "bob", "r2")
            assert (done.records, done.reports) == (3, 1)  # the marker too
            assert await bob.wait(await bob.submit("nope__x-000000000099", "p", run_id="r3"), poll=0.05)
            with pytest.raises(BadInput):
                await admin.store.get_blob(big)
            assert sorted(await admin.store.ids("evaluations", under="bob")) == [
                operators,
                m.evaluation_id("bob.r10", "manual", "nope__x-000000000002"),
                m.evaluation_id("bob.r3", "manual", "nope__x-000000000099"),
            ]
            assert await admin.store.count("evaluations", under="bob-x") == 1
            done = await forget(admin.store, "bob")  # every run of bob's, not the operator's
            assert done.records == 2 and done.kept == 1
            assert await admin.store.ids("evaluations", under="bob") == [operators]
            assert await admin.store.count("evaluations", under="bob-x") == 1
        # an agent's own credential cannot purge anyone's records, its own included
        assert await server_refuses(secured, "bob-x", publish="$JS.API.STREAM.PURGE.KV_evaluations")


def test_the_cli_forgets_with_the_admins_creds_and_refuses_a_bad_name(
    secured: SecuredBus, tmp_path: Path
) -> None:
    async def fill() -> None:
        async with (
            evaluator_service(secured, tmp_path, FakeOps(), agent_max_evaluations=QUOTA),
            await AgentClient.connect(secured.url, secured.creds("alice")) as alice,
        ):
            await _fill(alice, ["a", "b"])

    asyncio.run(fill())  # the CLI runs its own event loop
    runs = tmp_path / "runs"
    for name in ("alice.a", "alice.b", "alicex.a", "bob.a"):
        (runs / name / "m").mkdir(parents=True)
    env = {"CPPPERF_OUT_DIR": str(tmp_path / "out")}
    common = ["--nats-url", secured.url, "--creds", secured.creds("admin"), "--runs-dir", str(runs)]
    res = CliRunner().invoke(app, ["agents", "forget", "alice", "--run", "a", *common], env=env)
    assert res.exit_code == 0, res.output
    assert "1 evaluation record(s), 0 report object(s), 1 run folder(s) removed" in res.output
    assert sorted(p.name for p in runs.iterdir()) == ["alice.b", "alicex.a", "bob.a"]
    for bad in (["Alice"], ["alice", "--run", "../x"], ["a.b"]):
        res = CliRunner().invoke(app, ["agents", "forget", *bad, *common], env=env)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    # an agent's credential is refused by the server: one line, no traceback
    res = CliRunner().invoke(
        app,
        ["agents", "forget", "alice", "--nats-url", secured.url, "--creds", secured.creds("alice")],
        env=env,
    )
    assert res.exit_code == 1 and "are these the admin's credentials?" in res.output, res.output
    assert "Traceback" not in res.output


async def test_a_record_written_while_forgetting_stays_with_its_report(
    secured: SecuredBus, tmp_path: Path
) -> None:
    """`Store.forget` purges up to the revision read: an evaluation recorded after that (the
    same id evaluated again) keeps its record, so its report object is never left unnamed."""
    async with evaluator_service(secured, tmp_path, FakeOps()) as ctx:
        eid = m.evaluation_id("bob.r", "m", "nope__x-000000000001")
        await ctx.store.put("evaluations", eid, {"verdict": "correct", "agent": "bob"})
        found = await ctx.store.last("evaluations", eid)
        assert found is not None and found[0] is not None and found[0]["verdict"] == "correct"
        await ctx.store.put("evaluations", eid, {"verdict": "opt", "agent": "bob"})  # meanwhile
        async with connect(settings_as(secured, tmp_path, "admin"), secured.url) as admin:
            await admin.store.forget("evaluations", eid, through=found[1])
            assert (await admin.store.get("evaluations", eid) or {}).get("verdict") == "opt"
            await admin.store.delete("evaluations", eid)
            marker = await admin.store.last("evaluations", eid)
            assert marker is not None and marker[0] is None  # a delete marker: no value, a revision
            await admin.store.forget("evaluations", eid, through=marker[1])
            assert await admin.store.last("evaluations", eid) is None
            assert await admin.store.count("evaluations", under="bob") == 0


def test_run_folders_of_one_agent_only(tmp_path: Path) -> None:
    """A folder is the agent's when it is `<agent>.<run>` (hashed when long: the prefix stays);
    an agent whose name extends another's, a service's run, or an operator's run its records
    say is not the agent's (`keep`) is never taken."""
    from cppperf.services.evaluator.pipeline import safe_name

    runs = tmp_path / "runs"
    long_run = "r" * 128  # `bob.` + 128 characters: longer than a folder name, hashed
    names = ["bob.r1", "bob.r10", "bob.baseline", "bob-x.r1", "bobby", "r1", safe_name(f"bob.{long_run}")]
    for name in names:
        (runs / name).mkdir(parents=True)
    assert forget_folders(runs, "bob", "r1") == ["bob.r1"]
    assert forget_folders(runs, "bob", long_run) == [safe_name(f"bob.{long_run}")]
    assert forget_folders(runs, "bob", keep={"bob.baseline"}) == ["bob.r10"]
    assert sorted(p.name for p in runs.iterdir()) == ["bob-x.r1", "bob.baseline", "bobby", "r1"]
    assert forget_folders(tmp_path / "none", "bob") == []
    with pytest.raises(BadInput):
        forget_folders(runs, "bob/..")
