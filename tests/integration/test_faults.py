"""Fault injection on real nats-server processes: nothing is lost, nothing stuck, one consistent
result, and a log line saying what happened. Covers: retry backoff; an unknown schema version;
1 MiB messages on every input subject; equal payloads without ids; a dead letter that cannot be
written; deleted buckets and streams; concurrent KV writers; read-only commands and consumer
config; claims and leases; an outage longer than the old reconnect window; kill -9 mid-job;
the same commit under two message ids with two replicas; SIGTERM mid-job; the embedded server
never orphaned."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from faststream.nats import NatsBroker
from structlog.testing import capture_logs

from cppperf.runtime import connect, run_services
from cppperf.shared import claims, health
from cppperf.shared import messages as m
from cppperf.shared.buckets import CLAIMS
from cppperf.shared.bus import WORK_QUEUES, Bus, wait_drained
from cppperf.shared.embedded import EmbeddedNats
from cppperf.shared.errors import StoreInUse
from cppperf.shared.service import ServiceContext, subscribe
from cppperf.shared.settings import Settings
from cppperf.shared.worker import backoff_delay
from tests.conftest import make_settings
from tests.gitrepo import commit_files

pytestmark = pytest.mark.nats
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ helpers
async def until(cond: Callable[[], Awaitable[bool]], timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        await asyncio.sleep(0.1)


async def consume_all(
    ctx: ServiceContext, work: Callable[[Any], Awaitable[None]], cond: Callable[[], Awaitable[bool]]
) -> None:
    """Subscribe `work` on every input subject (typed), run until `cond`."""
    broker = NatsBroker(ctx.settings.nats_url, logger=None)
    for subject, q in WORK_QUEUES.items():
        subscribe(broker, ctx, subject=subject, service=q.durable, typ=m.SUBJECT_TYPES[subject], work=work)
    await broker.start()
    try:
        await until(cond)
    finally:
        await broker.stop()


def found(i: int) -> m.RepoFound:
    return m.RepoFound(repo=f"o/r{i}", url=f"/tmp/r{i}")


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server of this test alone (it gets stopped and restarted)."""
    server = EmbeddedNats(tmp_path / "nats-store").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def own_ctx(own_nats: EmbeddedNats, tmp_path: Path) -> AsyncIterator[ServiceContext]:
    settings = make_settings(tmp_path, nats_url=own_nats.url)
    async with connect(settings, own_nats.url, owner=True) as ctx:
        yield ctx


# ------------------------------------------------------------------------------------ backoff
def test_backoff_is_exponential_and_capped() -> None:
    delays = [backoff_delay(a, 5.0, 60.0) for a in range(1, 8)]
    assert delays == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    assert backoff_delay(10_000, 1.0, 300.0) == 300.0
    assert backoff_delay(3, 0.0, 10.0) == 0.0


# ------------------------------------------------------------------------------------ schema
def test_unknown_schema_version_is_refused_on_decode() -> None:
    from cppperf.shared.errors import UnsupportedSchema

    data = json.dumps({"schema_version": 999, "repo": "o/r", "url": "/x"}).encode()
    with pytest.raises(UnsupportedSchema, match="schema_version 999"):
        m.decode(data, m.RepoFound)
    # also when the new version changed a field's type
    with pytest.raises(UnsupportedSchema):
        m.decode(json.dumps({"schema_version": 2, "repo": 5, "url": "/x"}).encode(), m.RepoFound)
    assert m.decode(m.encode(found(1)), m.RepoFound) == found(1)


async def test_unknown_schema_version_is_dead_lettered_not_processed(ctx: ServiceContext) -> None:
    seen: list[str] = []

    async def work(item: Any) -> None:
        seen.append(item.id)

    raw = json.dumps({"schema_version": 999, "repo": "o/new", "url": "/x"}).encode()
    await ctx.bus.publish_raw(m.REPO_FOUND, raw, msg_id="v999")

    async def dead() -> bool:
        return len(await ctx.bus.dead_letters(m.REPO_FOUND)) == 1

    with capture_logs() as logs:
        await consume_all(ctx, work, dead)
    [rec] = await ctx.bus.dead_letters(m.REPO_FOUND)
    assert "schema_version 999" in rec.letter.error and rec.letter.error_type == "UnsupportedSchema"
    assert seen == []
    assert any(e["event"] == "dead_lettered" and e.get("item") == "v999" for e in logs)


# ------------------------------------------------------------------------------------ big messages
async def test_one_mib_message_on_every_input_subject_is_dead_lettered(ctx: ServiceContext) -> None:
    limit = ctx.bus.nc.max_payload
    payloads: dict[str, bytes] = {}
    for i, subject in enumerate(WORK_QUEUES):
        body = b'{"junk": "' + bytes([65 + i]) * (limit - 256) + b'"}'
        assert len(body) > 1_000_000
        payloads[subject] = body
        await ctx.bus.publish_raw(subject, body, msg_id=f"big-{i}")

    async def all_dead() -> bool:
        return len(await ctx.bus.dead_letters()) == len(WORK_QUEUES)

    async def work(item: Any) -> None:
        raise AssertionError("garbage must not reach the work")

    await consume_all(ctx, work, all_dead)
    await wait_drained(ctx.bus, timeout=20)
    for rec in await ctx.bus.dead_letters():
        letter = rec.letter
        assert letter.payload == b"" and letter.payload_ref, "large payloads are stored by reference"
        original = payloads[letter.subject]
        assert letter.payload_size == len(original)
        assert letter.payload_head.startswith('{"junk"')
        assert await ctx.bus.letter_payload(letter) == original
    # and replay puts the exact bytes back
    assert await ctx.bus.replay(m.REPO_FOUND) == 1
    info = await ctx.bus.js.stream_info(WORK_QUEUES[m.REPO_FOUND].stream)
    assert info.state.messages == 1


async def test_equal_payloads_without_msg_id_are_two_dead_letters(ctx: ServiceContext) -> None:
    for _ in range(2):
        await ctx.bus.publish_raw(m.REPO_FOUND, b'{"repo": 5}', msg_id=None)

    async def two() -> bool:
        return len(await ctx.bus.dead_letters()) == 2

    async def work(item: Any) -> None:
        return None

    await consume_all(ctx, work, two)
    seqs = {r.letter.stream_seq for r in await ctx.bus.dead_letters()}
    assert len(seqs) == 2


async def test_failing_dead_letter_is_logged_and_retried(ctx: ServiceContext) -> None:
    real = ctx.bus.dead_letter
    failures = {"left": 4}

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise ConnectionError("DLQ stream unavailable")
        return await real(*args, **kwargs)

    ctx.bus.dead_letter = flaky  # type: ignore[method-assign]
    await ctx.bus.publish_raw(m.REPO_FOUND, b"not json", msg_id="poison")

    async def dead() -> bool:
        return len(await ctx.bus.dead_letters()) == 1

    async def work(item: Any) -> None:
        return None

    with capture_logs() as logs:
        await consume_all(ctx, work, dead)
    assert any(
        e["event"] == "dead_letter_failed" and "DLQ stream unavailable" in e["dlq_error"] for e in logs
    )
    await wait_drained(ctx.bus, timeout=20)


# ------------------------------------------------------------------------------------ KV and streams
async def test_deleted_bucket_and_stream_are_reprovisioned_once(ctx: ServiceContext) -> None:
    await ctx.store.put("commits", "o/r@1", {"stage": "selected"})
    await ctx.bus.js.delete_key_value("commits")
    await ctx.bus.js.delete_stream(WORK_QUEUES[m.COMMIT_SELECTED].stream)
    with capture_logs() as logs:
        rec = await ctx.store.update("commits", "o/r@1", stage="classified", label=True)
        assert await ctx.bus.publish(
            m.COMMIT_SELECTED,
            m.CommitSelected(
                repo="o/r", url="", sha="1" * 40, parent="0" * 40, date="2024-01-01", message="x"
            ),
        )
    assert rec["label"] is True
    events = [e["event"] for e in logs]
    assert events.count("bucket_reprovisioned") == 1 and events.count("stream_reprovisioned") == 1
    assert (await ctx.bus.js.stream_info(WORK_QUEUES[m.COMMIT_SELECTED].stream)).state.messages == 1


async def test_concurrent_updates_keep_every_field(ctx: ServiceContext) -> None:
    await ctx.store.create("commits", "o/r@2", {"stage": "selected"})
    await asyncio.gather(
        *(ctx.store.update("commits", "o/r@2", **{f"f{i}": i}) for i in range(12)),
    )
    rec = await ctx.store.get("commits", "o/r@2")
    assert rec is not None and all(rec[f"f{i}"] == i for i in range(12))
    # the filter's record never overwrites the classifier's label (store before publish, create)
    await ctx.store.update("commits", "o/r@2", label=True, stage="classified")
    assert not await ctx.store.create("commits", "o/r@2", {"stage": "selected"})
    rec = await ctx.store.get("commits", "o/r@2")
    assert rec is not None and rec["label"] is True and rec["stage"] == "classified"


async def test_read_only_connect_never_changes_a_consumer(ctx: ServiceContext, tmp_path: Path) -> None:
    q = WORK_QUEUES[m.REPO_FOUND]
    before = await ctx.bus.js.consumer_info(q.stream, q.durable)
    reader = make_settings(tmp_path, nats_url=ctx.settings.nats_url, bus={"ack_wait": 77.0})
    with capture_logs() as logs:
        async with connect(reader, reader.nats_url) as rctx:
            await rctx.bus.subject_status()
    after = await ctx.bus.js.consumer_info(q.stream, q.durable)
    assert after.config.ack_wait == before.config.ack_wait == ctx.settings.bus.ack_wait
    assert any(e["event"] == "consumer_config_differs" for e in logs)
    # the owning service applies its own configuration, and says so
    with capture_logs() as logs:
        async with connect(reader, reader.nats_url, owner=True):
            pass
    assert (await ctx.bus.js.consumer_info(q.stream, q.durable)).config.ack_wait == 77.0
    assert any(e["event"] == "consumer_config_updated" for e in logs)


# ------------------------------------------------------------------------------------ claims
async def test_claim_has_one_holder_and_expires_with_a_dead_holder(ctx: ServiceContext) -> None:
    results = await asyncio.gather(
        *(claims.try_claim(ctx.store, "instance/x", holder=f"w{i}", lease=1.0) for i in range(6))
    )
    winners = [i for i, r in enumerate(results) if r is None]
    assert len(winners) == 1
    holder = f"w{winners[0]}"
    assert await claims.try_claim(ctx.store, "instance/x", holder="late", lease=1.0) == holder
    await asyncio.sleep(1.2)  # the holder "died": no renewal
    with capture_logs() as logs:
        assert await claims.try_claim(ctx.store, "instance/x", holder="late", lease=1.0) is None
    assert any(e["event"] == "claim_taken_over" and e["expired_holder"] == holder for e in logs)


async def test_live_claims_list_held_jobs_not_worker_leases_nor_expired_ones(ctx: ServiceContext) -> None:
    """What `status` says is claimed: held jobs, oldest first; a process's own `worker/` lease and
    an expired claim are not listed."""
    assert await claims.try_claim(ctx.store, "instance/old", holder="w1", lease=60.0) is None
    await asyncio.sleep(0.01)
    assert await claims.try_claim(ctx.store, "instance/new", holder="w2", lease=60.0) is None
    assert await claims.try_claim(ctx.store, "instance/gone", holder="w3", lease=0.2) is None
    task = await claims.worker_lease(ctx.store, lease=30.0, token="w1")
    try:
        await asyncio.sleep(0.3)
        held = await claims.live_claims(ctx.store)
    finally:
        task.cancel()
    assert [(c["key"], c["holder"]) for c in held] == [("instance/old", "w1"), ("instance/new", "w2")]
    assert all(c["since"] <= time.time() < c["expires_at"] for c in held)


async def test_kv_claims_port_one_holder_at_a_time_across_replicas(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    """The `Claims` port on the real `claims` bucket (what the builder's `register` gets): two
    replicas (tokens) on one store; the second waits for the first's claim, told who holds it, and
    takes it when released; `live` lists the held job; the worker lease is announced."""
    a, b = (
        claims.KvClaims(ctx.store, token="replica-a", poll=0.05),
        claims.KvClaims(ctx.store, token="replica-b", poll=0.05),
    )
    told: list[str] = []

    async def waiting(holder: str) -> None:
        told.append(holder)

    async with a.held("instance/y", lease=30.0):
        assert [(c["key"], c["holder"]) for c in await b.live()] == [("instance/y", "replica-a")]
        second = asyncio.create_task(_hold_once(b, "instance/y", waiting))
        await asyncio.sleep(0.3)
        assert not second.done() and told == ["replica-a"]
    assert await asyncio.wait_for(second, 10) == "replica-b"
    assert await b.live() == []  # released on the way out
    await a.announce(lease=30.0)
    lease = await ctx.store.get(CLAIMS, "worker/replica-a")
    assert lease is not None and lease["holder"] == "replica-a"
    ws = a.workspace(tmp_path / "work", owner="run-a")
    assert ws == claims.workspace_for(tmp_path / "work", "replica-a") and (ws / claims.OWNER_FILE).is_file()
    claims.release_workspace(ws)


async def _hold_once(c: claims.KvClaims, key: str, wait: Callable[[str], Awaitable[None]]) -> str:
    async with c.held(key, lease=30.0, wait=wait):
        held = await c.live()
    return str(held[0]["holder"])


async def test_stale_workspaces_of_dead_workers_are_removed(ctx: ServiceContext, tmp_path: Path) -> None:
    work = tmp_path / "work"
    for token in ("dead-1", "alive-2"):
        ws = claims.own_workspace(work, owner="run-a", token=token)
        (ws / "inst").mkdir()
        claims.release_workspace(ws)  # as if another process had owned it
    task = await claims.worker_lease(ctx.store, lease=30.0, token="alive-2")
    try:
        with capture_logs() as logs:
            removed = await claims.clean_stale_workspaces(ctx.store, work, owner="run-a", token="me")
    finally:
        task.cancel()
    assert removed == ["dead-1"]
    assert (claims.workspace_for(work, "alive-2") / "inst").is_dir()
    assert any(e["event"] == "stale_workspace_removed" for e in logs)


async def test_cleanup_never_removes_another_runs_or_a_live_processs_workspace(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    """A work dir shared by two runs (two output folders, two stores): a run judges only its own
    workspaces, and never one whose lock a live process holds, whatever its store says."""
    work = tmp_path / "work"
    other_run = claims.own_workspace(work, owner="run-b", token="b-1")
    (other_run / "inst").mkdir()
    claims.release_workspace(other_run)
    unowned = claims.workspace_for(work, "legacy-1")
    (unowned / "inst").mkdir(parents=True)  # no owner file: nobody's provably
    held = claims.own_workspace(work, owner="run-a", token="a-live")
    claims.release_workspace(held)
    holder = subprocess.Popen(  # another process holds the live workspace's lock
        [sys.executable, "-c", HOLD_LOCK, str(held / claims.LOCK_FILE)], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        removed = await claims.clean_stale_workspaces(ctx.store, work, owner="run-a", token="me")
        assert removed == []
        assert (other_run / "inst").is_dir() and (unowned / "inst").is_dir() and held.is_dir()
    finally:
        holder.kill()
        holder.communicate()
    # the holder died: now its workspace is provably stale, and still only that one goes
    assert await claims.clean_stale_workspaces(ctx.store, work, owner="run-a", token="me") == ["a-live"]
    assert (other_run / "inst").is_dir() and (unowned / "inst").is_dir()
    info = claims.workspace_owner(other_run)
    assert info is not None and info["owner"] == "run-b" and info["pid"] == os.getpid()


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


# ------------------------------------------------------------------------------------ outage
@pytest.mark.slow
async def test_waiting_for_the_pipeline_survives_an_outage_and_says_the_bus_is_away(
    own_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """`mine` waits for the queues to drain; a server that goes away meanwhile is waited for (the
    work is kept on its disk), the live view says since when, and the wait ends once it is back."""
    from cppperf.cli.pipeline import _live_view

    settings = make_settings(tmp_path, nats_url=own_nats.url, bus={"reconnect_wait": 0.2})
    restarted: EmbeddedNats | None = None
    try:
        async with connect(settings, own_nats.url, owner=True) as ctx:
            assert ctx.bus.lost_since is None
            own_nats.stop()
            waiting = asyncio.create_task(wait_drained(ctx.bus, poll=0.1))
            await until(lambda: _true(ctx.bus.lost_since is not None), what="the loss noticed")
            view = await _live_view(ctx, settings)
            text = "\n".join(str(r) for r in view.renderables)
            assert "bus: connection lost since " in text and "queues: not known while the bus is away" in text
            await asyncio.sleep(1.0)
            assert not waiting.done()  # still waiting: the outage is not an error, nor "drained"
            restarted = EmbeddedNats(own_nats.store_dir, port=own_nats.port).start()
            await asyncio.wait_for(waiting, timeout=60)
            assert ctx.bus.lost_since is None
            again = "\n".join(str(r) for r in (await _live_view(ctx, settings)).renderables)
            assert "bus:" not in again
    finally:
        if restarted is not None:
            restarted.stop()


@pytest.mark.slow
async def test_outage_longer_than_the_reconnect_window_then_consuming_resumes(
    own_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """nats-py's default window is 60 attempts; at 0.1 s apart, a 9 s outage is ~90 attempts."""
    settings = make_settings(
        tmp_path,
        nats_url=own_nats.url,
        health_dir=str(tmp_path / "health"),
        bus={"reconnect_wait": 0.1, "health_interval": 0.3},
    )
    handled: list[str] = []

    async def work(item: m.RepoFound) -> None:
        handled.append(item.repo)

    def register(broker: NatsBroker, ctx: ServiceContext) -> None:
        subscribe(broker, ctx, subject=m.REPO_FOUND, service="filter", typ=m.RepoFound, work=work)

    hdir = settings.health_path()
    restarted: EmbeddedNats | None = None
    try:
        async with run_services(settings, own_nats.url, ["filter"], register={"filter": register}) as running:
            bus = running.ctx.bus
            await bus.publish(m.REPO_FOUND, found(1))
            await until(lambda: _true(handled == ["o/r1"]), what="first message")
            stream = WORK_QUEUES[m.REPO_FOUND].stream

            async def acked() -> bool:  # the work queue drops a message once its ack is in
                return (await bus.js.stream_info(stream)).state.messages == 0

            # handled is not acked: a server stopped between the two redelivers o/r1 afterwards
            # (at least once, as it should), which is not what this test is about
            await until(acked, what="first message acked")
            await until(lambda: _true(health.check(hdir, "filter", 5)[0]), what="healthy")
            own_nats.stop()
            await until(lambda: _true(not health.check(hdir, "filter", 5)[0]), what="unhealthy in the outage")
            assert "reconnecting" in health.check(hdir, "filter", 5)[1]
            await asyncio.sleep(9)
            restarted = EmbeddedNats(own_nats.store_dir, port=own_nats.port).start()
            await until(lambda: _true(health.check(hdir, "filter", 5)[0]), timeout=30, what="healthy again")
            await bus.publish(m.REPO_FOUND, found(2))
            await until(lambda: _true(handled == ["o/r1", "o/r2"]), timeout=30, what="consuming after outage")
    finally:
        if restarted is not None:
            restarted.stop()


async def test_the_runtime_starts_what_a_services_register_returns(
    own_nats: EmbeddedNats, tmp_path: Path
) -> None:
    """No service is special-cased by the runtime: the builder's `register` returns its startup,
    which announces this worker (`worker/<token>` in `claims`) before anything is consumed; a
    register that returns nothing starts nothing."""
    settings = make_settings(tmp_path, nats_url=own_nats.url, health_dir=str(tmp_path / "health"))
    key = f"worker/{claims.TOKEN}"
    async with run_services(
        settings, own_nats.url, ["builder"], register={"builder": lambda b, c: None}
    ) as r:
        assert await r.ctx.store.get(CLAIMS, key) is None
    async with run_services(settings, own_nats.url, ["builder"]) as running:
        lease = await running.ctx.store.get(CLAIMS, key)
        assert lease is not None and lease["holder"] == claims.TOKEN


async def _true(value: bool) -> bool:
    return value


# ------------------------------------------------------------------------------------ builder processes
def _classified(repo_dir: Path) -> tuple[m.CommitClassified, str]:
    sha = commit_files(repo_dir, {"a.cpp": "int main() { return 0; }\n"}, "faster loop")
    commit = m.CommitSelected(
        repo="o/fault",
        url=str(repo_dir),
        sha=sha,
        parent="0" * 40,
        date="2024-01-01T00:00:00+00:00",
        message="x",
    )
    item = m.CommitClassified(commit=commit, label=True, backend="heuristic")
    return item, m.instance_id(commit.repo, sha)


class Workers:
    """Spawns tests/fault_worker.py processes against one NATS URL."""

    def __init__(self, url: str, tmp: Path, sleep: float, **bus: Any) -> None:
        self.url, self.markers, self.sleep = url, tmp / "markers", sleep
        self.markers.mkdir(exist_ok=True)
        self.overrides = {
            "out_dir": str(tmp / "out"),
            "health_dir": str(tmp / "health"),
            "bus": {
                "ack_wait": 30.0,
                "max_deliver": 5,
                "nak_delay": 0.2,
                "claim_lease": 2.0,
                "stop_grace": 1.0,
                "health_interval": 0.5,
                **bus,
            },
            "builder": {"work_dir": str(tmp / "work")},
            "mining": {"mirror_dir": str(tmp / "mirrors")},
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []

    def spawn(self) -> subprocess.Popen[bytes]:
        log = (self.markers / f"log-{len(self.procs)}.txt").open("wb")
        self.logs.append(log)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fault_worker",
                self.url,
                str(self.markers),
                str(self.sleep),
                json.dumps(self.overrides),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        self.procs.append(proc)
        return proc

    async def wait_marker(self, name: str, timeout: float = 180) -> None:  # loaded CI machines start slowly
        async def there() -> bool:
            return (self.markers / name).exists()

        await until(there, timeout, what=f"marker {name}")

    def builds(self) -> list[Path]:
        return sorted(self.markers.glob("built-*"))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in self.logs:
            f.close()


async def _patch_built(bus: Bus) -> list[m.PatchBuilt]:
    info = await bus.js.stream_info("PATCH_BUILT")
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        if info.state.messages == 0:
            break
        raw = await bus.js.get_msg("PATCH_BUILT", seq)
        out.append(msgspec.json.decode(raw.data or b"", type=m.PatchBuilt))
    return out


def _settings_for(own_nats: EmbeddedNats, tmp_path: Path) -> Settings:
    return make_settings(tmp_path, nats_url=own_nats.url, bus={"ack_wait": 30.0, "max_deliver": 5})


@pytest.mark.slow
async def test_kill_9_mid_build_is_finished_exactly_once(own_ctx: ServiceContext, tmp_path: Path) -> None:
    item, iid = _classified(tmp_path / "repo")
    w = Workers(own_ctx.settings.nats_url, tmp_path, sleep=2.0, ack_wait=3.0)
    try:
        first = w.spawn()
        await w.wait_marker(f"ready-{first.pid}")
        await own_ctx.bus.publish(m.COMMIT_CLASSIFIED, item)
        await w.wait_marker(f"started-{first.pid}")
        dead_ws = Path((w.markers / f"started-{first.pid}").read_text())
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        second = w.spawn()
        await w.wait_marker(f"built-{second.pid}-0", timeout=180)
        await wait_drained(own_ctx.bus, timeout=30)
        assert not dead_ws.exists() or not any(dead_ws.iterdir()), "dead attempt's workspace removed on start"
    finally:
        w.close()
    rec = await own_ctx.store.get("instances", iid)
    [msg] = await _patch_built(own_ctx.bus)
    on_disk = json.loads((tmp_path / "out" / "instances" / f"{iid}.json").read_text())
    assert rec is not None and rec["verdict"] == msg.verdict == on_disk["cppperf"]["verdict"]
    assert [p.name for p in w.builds()] == [f"built-{second.pid}-0"]


@pytest.mark.slow
async def test_same_commit_under_two_msg_ids_with_two_replicas_builds_once(
    own_ctx: ServiceContext, tmp_path: Path
) -> None:
    item, iid = _classified(tmp_path / "repo")
    w = Workers(own_ctx.settings.nats_url, tmp_path, sleep=3.0)
    try:
        a, b = w.spawn(), w.spawn()
        await w.wait_marker(f"ready-{a.pid}")
        await w.wait_marker(f"ready-{b.pid}")
        await own_ctx.bus.publish(m.COMMIT_CLASSIFIED, item, msg_id="first-id")
        await own_ctx.bus.publish(m.COMMIT_CLASSIFIED, item, msg_id="replay-id")
        await wait_drained(own_ctx.bus, timeout=60)
    finally:
        w.close()
    assert len(w.builds()) == 1
    rec = await own_ctx.store.get("instances", iid)
    msgs = await _patch_built(own_ctx.bus)
    on_disk = json.loads((tmp_path / "out" / "instances" / f"{iid}.json").read_text())
    assert rec is not None and {x.verdict for x in msgs} == {rec["verdict"]} == {
        on_disk["cppperf"]["verdict"]
    }
    assert len(msgs) == 1  # the second request re-published the finished result: deduplicated


@pytest.mark.slow
async def test_sigterm_mid_build_naks_at_once_and_exits(own_ctx: ServiceContext, tmp_path: Path) -> None:
    """ack_wait is 30 s: the other replica starting the job sooner proves the nak."""
    item, iid = _classified(tmp_path / "repo")
    w = Workers(own_ctx.settings.nats_url, tmp_path, sleep=8.0)  # ack_wait 30 s, grace 1 s
    try:
        pids = [w.spawn().pid, w.spawn().pid]
        for pid in pids:
            await w.wait_marker(f"ready-{pid}")
        await own_ctx.bus.publish(m.COMMIT_CLASSIFIED, item)
        await until(lambda: _true(bool(list(w.markers.glob(f"start-{iid}-*")))), 60, "a build start")
        [started] = list(w.markers.glob(f"start-{iid}-*"))
        victim = int(started.read_text())
        other = next(p for p in pids if p != victim)
        t0 = time.monotonic()
        os.kill(victim, signal.SIGTERM)
        proc = next(p for p in w.procs if p.pid == victim)
        assert await asyncio.to_thread(proc.wait, 20) == 0
        await w.wait_marker(f"start-{iid}-{other}", timeout=28)
        assert time.monotonic() - t0 < 28
        await w.wait_marker(f"built-{other}-0", timeout=60)
        await wait_drained(own_ctx.bus, timeout=30)
    finally:
        w.close()
    log = (w.markers / f"log-{pids.index(victim)}.txt").read_text()
    assert "stopping" in log and "aborted_nacked" in log
    assert (await own_ctx.store.get("instances", iid)) is not None


@pytest.mark.slow
async def test_sigterm_with_short_job_finishes_it_within_the_grace(
    own_ctx: ServiceContext, tmp_path: Path
) -> None:
    item, iid = _classified(tmp_path / "repo")
    w = Workers(own_ctx.settings.nats_url, tmp_path, sleep=1.0, stop_grace=15.0)
    try:
        first = w.spawn()
        await w.wait_marker(f"ready-{first.pid}")
        await own_ctx.bus.publish(m.COMMIT_CLASSIFIED, item)
        await w.wait_marker(f"started-{first.pid}")
        first.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(first.wait, 30) == 0
    finally:
        w.close()
    assert [p.name for p in w.builds()] == [f"built-{first.pid}-0"]
    rec = await own_ctx.store.get("instances", iid)
    assert rec is not None
    assert (await own_ctx.bus.js.stream_info(WORK_QUEUES[m.COMMIT_CLASSIFIED].stream)).state.messages == 0


# ------------------------------------------------------------------------------------ embedded server
def test_embedded_server_dies_with_its_parent_and_the_store_is_locked(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = (
        "import sys, time\n"
        "from cppperf.shared.embedded import EmbeddedNats\n"
        f"s = EmbeddedNats({str(store)!r}).start()\n"
        "print(s.proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        with pytest.raises(StoreInUse, match="another cppperf"):
            EmbeddedNats(store).start()
        parent.kill()  # SIGKILL: no cleanup code runs in the parent
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(server_pid):
            assert time.monotonic() < deadline, "nats-server orphaned after its parent was killed"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    with EmbeddedNats(store):  # the lock went with the dead parent
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_serve_on_embedded_nats_is_healthy_and_stops_on_sigterm(tmp_path: Path) -> None:
    """`cppperf serve filter` (embedded NATS): `cppperf health filter` passes while it runs;
    SIGTERM ends it with exit 0, its nats-server gone; then the heartbeat is stale."""
    env = {
        **os.environ,
        "CPPPERF_BUS_DATA_DIR": str(tmp_path / "nats"),
        "CPPPERF_HEALTH_DIR": str(tmp_path / "health"),
        "CPPPERF_BUS_HEALTH_INTERVAL": "0.5",
    }
    cli = [sys.executable, "-m", "cppperf"]
    serve = subprocess.Popen(
        [*cli, "serve", "filter"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            res = subprocess.run(
                [*cli, "health", "filter", "--max-age", "30"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if res.returncode == 0:
                break
            assert serve.poll() is None, serve.stderr.read().decode() if serve.stderr else ""
            assert time.monotonic() < deadline, res.stdout
            time.sleep(0.5)
        assert "filter: consuming" in res.stdout
        servers = subprocess.run(
            ["pgrep", "-f", str(tmp_path / "nats")], capture_output=True, text=True, check=False
        )
        assert servers.stdout.strip(), "the embedded nats-server runs"
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        if serve.stderr is not None:
            log = serve.stderr.read().decode()
            serve.stderr.close()
    assert "stopping" in log
    gone = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "nats")], capture_output=True, text=True, check=False
    )
    assert gone.stdout.strip() == ""
    time.sleep(1.5)
    res = subprocess.run(
        [*cli, "health", "filter", "--max-age", "1"], env=env, capture_output=True, text=True, check=False
    )
    assert res.returncode == 1 and "old" in res.stdout


def _says(proc: subprocess.Popen[str], event: str, within: float, said: list[str]) -> bool:
    """The process's stderr has a line with `event` before `within` seconds (the lines read
    until then go to `said`)."""
    found = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            said.append(line)
            if event in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return found.wait(within)


@pytest.mark.parametrize("signals", [1, 2], ids=["sigterm", "sigterm-twice"])
def test_serve_against_an_unreachable_bus_stops_within_its_grace(tmp_path: Path, signals: int) -> None:
    """`cppperf serve filter` whose bus is not there (it keeps retrying the connection): one
    SIGTERM ends it within its stop grace; a second one ends it at once — one line, no
    traceback, the shell's code for the signal."""
    from cppperf.shared.embedded import free_port

    env = {
        **os.environ,
        "CPPPERF_BUS_STOP_GRACE": "3",
        "CPPPERF_HEALTH_DIR": str(tmp_path / "health"),
    }
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    said: list[str] = []
    serve = subprocess.Popen(
        [sys.executable, "-m", "cppperf", "serve", "filter", "--nats-url", url],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # it says it waits for the bus (its imports done: a loaded machine can take many seconds),
        # and keeps retrying
        assert _says(serve, "nats_waiting_for_server", 120, said), "serve never said it waits"
        time.sleep(1)
        assert serve.poll() is None, "serve keeps retrying an unreachable bus"
        start = time.monotonic()
        for _ in range(signals):
            serve.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        try:
            rc = serve.wait(3 + 10)  # the grace, plus the interpreter's own exit
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - start
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        err = "".join(said) + (serve.stderr.read() if serve.stderr else "")
        if serve.stderr:
            serve.stderr.close()
    assert "Traceback" not in err, err
    # one SIGTERM: a clean stop (0); a second: stopped at once (143), or killed by it (-15) when
    # it came after the handlers were gone, as the stop had already finished
    assert rc in ((0,) if signals == 1 else (0, 128 + signal.SIGTERM, -signal.SIGTERM)), err
    assert took < 3 + 10
