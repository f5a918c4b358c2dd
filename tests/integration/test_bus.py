"""JetStream semantics on a real nats-server: idempotent provisioning, dedup by stable id,
heartbeats keep long jobs alive, poison and malformed messages end in the DLQ (and replay),
a worker killed mid-job is replaced without double effects, and status counts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from faststream.nats import NatsBroker

from cppperf.shared import messages as m
from cppperf.shared.bus import WORK_QUEUES, wait_drained
from cppperf.shared.embedded import EmbeddedNats
from cppperf.shared.service import ServiceContext, subscribe

pytestmark = pytest.mark.nats


async def run_handler(
    ctx: ServiceContext,
    work: Callable[[m.RepoFound], Awaitable[None]],
    until: Callable[[], Awaitable[bool]],
    timeout: float = 30,
) -> None:
    broker = NatsBroker(ctx.settings.nats_url, logger=None)
    subscribe(broker, ctx, subject=m.REPO_FOUND, service="filter", typ=m.RepoFound, work=work)
    await broker.start()
    try:
        deadline = time.monotonic() + timeout
        while not await until():
            assert time.monotonic() < deadline, "condition not reached in time"
            await asyncio.sleep(0.1)
    finally:
        await broker.stop()


def found(i: int) -> m.RepoFound:
    return m.RepoFound(repo=f"o/r{i}", url=f"/tmp/r{i}")


async def test_provisioning_twice_is_a_noop(ctx: ServiceContext) -> None:
    before = {s.config.name: s.config for s in await ctx.bus.js.streams_info()}
    cons_before = await ctx.bus.js.consumer_info("REPO_FOUND", "filter")
    await ctx.bus.provision()
    await ctx.bus.provision()
    after = {s.config.name: s.config for s in await ctx.bus.js.streams_info()}
    cons_after = await ctx.bus.js.consumer_info("REPO_FOUND", "filter")
    assert before.keys() == after.keys()
    assert {k: v.subjects for k, v in before.items()} == {k: v.subjects for k, v in after.items()}
    assert cons_before.created == cons_after.created
    assert len(await ctx.bus.js.consumers_info("REPO_FOUND")) == 1


async def test_same_id_published_twice_is_one_message(ctx: ServiceContext) -> None:
    assert await ctx.bus.publish(m.REPO_FOUND, found(1)) is True
    assert await ctx.bus.publish(m.REPO_FOUND, found(1)) is False
    info = await ctx.bus.js.stream_info(WORK_QUEUES[m.REPO_FOUND].stream)
    assert info.state.messages == 1


async def test_poison_message_is_dead_lettered_then_replayed(ctx: ServiceContext) -> None:
    attempts: list[str] = []
    healthy = False

    async def work(item: m.RepoFound) -> None:
        attempts.append(item.repo)
        if not healthy:
            raise RuntimeError("collaborator exploded")

    await ctx.bus.publish(m.REPO_FOUND, found(1))

    async def dead() -> bool:
        return len(await ctx.bus.dead_letters(m.REPO_FOUND)) == 1

    await run_handler(ctx, work, dead)
    [letter] = await ctx.bus.dead_letters(m.REPO_FOUND)
    assert letter.letter.attempts == ctx.settings.bus.max_deliver == len(attempts)
    assert "collaborator exploded" in letter.letter.error
    assert letter.letter.service == "filter"
    assert m.decode(letter.letter.payload, m.RepoFound) == found(1)

    healthy = True
    assert await ctx.bus.replay(m.REPO_FOUND) == 1
    assert await ctx.bus.dead_letters(m.REPO_FOUND) == []

    async def drained() -> bool:
        return await ctx.bus.drained()

    await run_handler(ctx, work, drained)
    assert attempts[-1] == "o/r1" and len(attempts) == ctx.settings.bus.max_deliver + 1


async def test_malformed_payload_is_dead_lettered_and_service_keeps_running(ctx: ServiceContext) -> None:
    done: list[str] = []

    async def work(item: m.RepoFound) -> None:
        done.append(item.repo)

    await ctx.bus.publish_raw(m.REPO_FOUND, b'{"repo": 5}', msg_id="bad-1")
    await ctx.bus.publish(m.REPO_FOUND, found(2))

    async def both() -> bool:
        return done == ["o/r2"] and len(await ctx.bus.dead_letters()) == 1

    await run_handler(ctx, work, both)
    [letter] = await ctx.bus.dead_letters()
    assert letter.letter.attempts == 1
    assert "cannot decode RepoFound" in letter.letter.error
    assert letter.letter.payload == b'{"repo": 5}'


@pytest.mark.slow
async def test_long_job_with_heartbeats_is_delivered_once(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    from cppperf.shared.bus import Bus
    from cppperf.shared.store import Store
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, nats_url=nats_server.url, bus={"ack_wait": 2.0, "max_deliver": 5})
    bus = await Bus.connect(nats_server.url, settings.bus)
    for s in await bus.js.streams_info():
        await bus.js.delete_stream(s.config.name)
    await bus.provision()
    ctx = ServiceContext(settings=settings, bus=bus, store=await Store.open(bus.js))
    deliveries: list[float] = []
    finished: list[bool] = []

    async def work(item: m.RepoFound) -> None:
        deliveries.append(time.monotonic())
        await asyncio.sleep(10)
        finished.append(True)

    await bus.publish(m.REPO_FOUND, found(3))

    async def done() -> bool:
        return bool(finished) and await bus.drained()

    await run_handler(ctx, work, done, timeout=40)
    assert len(deliveries) == 1
    await bus.close()


@pytest.mark.slow
async def test_killed_worker_job_is_redone_once_by_another(ctx: ServiceContext, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    root = Path(__file__).resolve().parents[2]

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.worker_proc", ctx.settings.nats_url, str(markers), "3"],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def wait_for(prefix: str, pid: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not (markers / f"{prefix}-{pid}").exists():
            assert time.monotonic() < deadline, f"{prefix} marker of {pid} never appeared"
            await asyncio.sleep(0.05)

    # the consumer settings the workers use (ack_wait 2 s)
    ctx.bus.settings.ack_wait = 2.0
    ctx.bus.settings.max_deliver = 5
    await ctx.bus.provision()
    first = spawn()
    try:
        await wait_for("ready", first.pid)
        await ctx.bus.publish(m.REPO_FOUND, found(7))
        await wait_for("started", first.pid)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        second = spawn()
        try:
            await wait_for("effect", second.pid, timeout=40)
            await wait_drained(ctx.bus, timeout=20)
        finally:
            second.kill()
            second.wait()
    finally:
        if first.poll() is None:
            first.kill()
    record = await ctx.store.get("repos", "o/r7")
    assert record is not None and record["effect_by"] == second.pid
    assert not (markers / f"effect-{first.pid}").exists()
    assert (markers / f"effect-{second.pid}").read_text() == "True"


async def test_status_counts_a_scripted_flow(ctx: ServiceContext) -> None:
    async def work(item: m.RepoFound) -> None:
        if item.repo == "o/r9":
            raise ValueError("always fails")

    for i in (1, 2, 3, 9):
        await ctx.bus.publish(m.REPO_FOUND, found(i))
    await ctx.bus.publish(
        m.COMMIT_SELECTED,
        m.CommitSelected(repo="o/r1", url="", sha="1" * 40, parent="0" * 40, date="2024-01-01", message="x"),
    )

    async def settled() -> bool:
        rows = {r.subject: r for r in await ctx.bus.subject_status()}
        return rows[m.REPO_FOUND].done == 3 and rows[m.REPO_FOUND].dead_lettered == 1

    await run_handler(ctx, work, settled)
    rows = {r.subject: r for r in await ctx.bus.subject_status()}
    assert (rows[m.REPO_FOUND].published, rows[m.REPO_FOUND].pending, rows[m.REPO_FOUND].in_flight) == (
        4,
        0,
        0,
    )
    assert (rows[m.COMMIT_SELECTED].published, rows[m.COMMIT_SELECTED].pending) == (1, 1)
    assert rows[m.COMMIT_SELECTED].done == 0


async def test_our_own_close_logs_no_disconnect_but_a_lost_server_does(tmp_path: Path) -> None:
    """Every command closes its connection on exit: that is no `nats_disconnected` warning. A
    server that goes away still is."""
    from structlog.testing import capture_logs

    from cppperf.shared.bus import Bus
    from cppperf.shared.settings import BusSettings

    with EmbeddedNats(tmp_path / "nats") as server:
        with capture_logs() as logs:
            bus = await Bus.connect(server.url, BusSettings())
            await bus.close()
        assert not [e for e in logs if e["event"] == "nats_disconnected"]
        with capture_logs() as logs:
            bus = await Bus.connect(server.url, BusSettings(reconnect_wait=0.2))
            server.stop()
            deadline = time.monotonic() + 10
            while not [e for e in logs if e["event"] == "nats_disconnected"]:
                assert time.monotonic() < deadline, "a lost server was not logged"
                await asyncio.sleep(0.05)
            await bus.nc.close()


def test_faststream_pull_loop_restarts_are_one_line_without_a_traceback() -> None:
    """FastStream's supervisor logs "<task> raised an exception, retrying…" with the exception when
    a pull fetch times out: that becomes one `pull_loop_restarted` line (info for a timeout, a
    warning otherwise), no traceback; other broker warnings pass through unchanged."""
    import logging

    import nats.errors
    from structlog.testing import capture_logs

    from cppperf.runtime import BrokerLog

    retry = "filter_repo_found raised an exception, retrying...\nIf this behavior causes issues, ..."
    with capture_logs() as logs:
        BrokerLog().log(logging.ERROR, retry, exc_info=nats.errors.TimeoutError())
        BrokerLog().log(logging.ERROR, retry, exc_info=RuntimeError("boom"))
        BrokerLog().log(logging.WARNING, "connection lost")
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("pull_loop_restarted", "info"),
        ("pull_loop_restarted", "warning"),
        ("connection lost", "warning"),
    ]
    assert logs[0]["task"] == "filter_repo_found" and "exc_info" not in logs[0]
    assert logs[1]["error"] == "RuntimeError: boom"


async def test_ids_under_an_agent_are_selected_by_the_server(ctx: ServiceContext) -> None:
    """`Store.ids(bucket, under=agent)` (an agent's `results`): only `<agent>.…` keys, by a subject
    filter, never another agent's whose name merely starts the same."""
    mine = [m.evaluation_id(m.agent_run("amy", r), "m", "o__r-1") for r in ("r1", "r.2")]
    others = [m.evaluation_id(m.agent_run(a, "r1"), "m", "o__r-1") for a in ("amy2", "bob")]
    for eid in [*mine, *others, m.evaluation_id("amy", "m", "x")]:  # the last: run `amy`, no agent
        await ctx.store.put("evaluations", eid, {"verdict": "opt"})
    assert sorted(await ctx.store.ids("evaluations", under="amy")) == sorted(mine)
    assert await ctx.store.ids("evaluations", under="nobody") == []


async def test_every_id_is_listed_however_busy_the_client(ctx: ServiceContext) -> None:
    """nats-py's `watch()` (and `keys()`) put their end-of-keys marker first when the server had
    pushed every key before the watcher asked how many were pending: the list came back empty
    (here 1 listing in 32 did, before). Under load a page of an agent's `results` did, and its
    run looked finished at 2008 rows of 2500. Listings at once, on a client whose event loop is
    kept busy, each list every id; a removed key is not listed."""
    ids = [m.evaluation_id(m.agent_run("amy", "big"), "m", f"o__r-{i:012x}") for i in range(2500)]
    for eid in ids:
        await ctx.store.put("evaluations", eid, {"verdict": "opt"})
    await ctx.store.put("evaluations", "amy.gone/m/o__r-x", {"verdict": "opt"})
    assert await ctx.store.delete("evaluations", "amy.gone/m/o__r-x")
    stop = asyncio.Event()

    async def busy() -> None:  # the event loop kept busy between the client's reads
        while not stop.is_set():
            time.sleep(0.005)
            await asyncio.sleep(0)

    hog = asyncio.create_task(busy())
    listings: list[list[str]] = []
    try:
        for _ in range(4):
            listings += await asyncio.gather(*(ctx.store.ids("evaluations", under="amy") for _ in range(8)))
        whole = await ctx.store.ids("evaluations")
    finally:
        stop.set()
        await hog
    assert [len(x) for x in listings] == [len(ids)] * 32
    assert all(sorted(x) == sorted(ids) for x in listings)
    assert sorted(whole) == sorted(ids)
