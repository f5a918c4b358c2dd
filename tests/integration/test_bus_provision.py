"""Admin-only provisioning on a real nats-server with the shipped secured configuration: a service
user can no longer create or update a stream or bucket (the server refuses); `cppperf bus
provision` as admin creates everything, is idempotent and raises the limits of existing streams and
buckets; a service started on an unprovisioned bus stops with one line naming the fix; the
embedded/open bus still provisions itself."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cppperf.runtime import connect
from cppperf.shared.bus import Bus
from cppperf.shared.errors import NotProvisioned
from cppperf.shared.provision import provision_all, required_streams
from cppperf.shared.settings import BusSettings
from tests.integration.test_bus_auth import server_refuses
from tests.secured_bus import SecuredBus, as_user, fresh_bus, running_secured_bus

pytestmark = pytest.mark.nats


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBus]:
    with running_secured_bus(tmp_path_factory.mktemp("secured-provision"), []) as bus:
        yield bus


def test_who_provisions() -> None:
    assert BusSettings().self_provisioning  # the embedded/open bus: every process, as before
    assert not BusSettings(creds="x.creds").self_provisioning
    assert not BusSettings(nkey_seed="SU…").self_provisioning
    assert BusSettings(creds="x.creds", provision="self").self_provisioning
    assert not BusSettings(provision="admin").self_provisioning


async def test_service_users_cannot_create_or_update_streams(secured: SecuredBus, tmp_path: Path) -> None:
    await fresh_bus(secured, tmp_path)
    for who in ("crawler", "filter", "classifier", "builder", "evaluator"):
        for subject in (
            "$JS.API.STREAM.CREATE.EVIL",
            "$JS.API.STREAM.UPDATE.EVAL_REQUESTED",
            "$JS.API.STREAM.CREATE.KV_evaluations",  # a KV bucket is a stream
            "$JS.API.STREAM.UPDATE.KV_instances",
            "$JS.API.STREAM.DELETE.DLQ",
            "$JS.API.STREAM.PURGE.EVAL_REQUESTED",
        ):
            assert "for publish" in await server_refuses(secured, who, publish=subject), (who, subject)


async def test_provision_is_idempotent_and_raises_limits(secured: SecuredBus, tmp_path: Path) -> None:
    first = await fresh_bus(secured, tmp_path)
    assert {p.name for p in first} == set(required_streams())
    assert {p.action for p in first} == {"created"}
    again = await fresh_bus(secured, tmp_path, wipe=False)
    assert {p.action for p in again} == {"unchanged"}
    # an operator raises the limits: existing buckets and streams get them too
    limits: dict[str, object] = {"kv_max_bytes": 300 << 20, "stream_max_bytes": 301 << 20}
    bus = await Bus.connect(secured.url, as_user(secured, tmp_path, "admin", bus=limits).bus)
    try:
        raised = {p.name: p.action for p in await provision_all(bus)}
        assert raised["KV_evaluations"] == "updated" and raised["EVAL_REQUESTED"] == "updated"
        assert raised["OBJ_blobs"] == "unchanged"
        assert (await bus.js.stream_info("KV_evaluations")).config.max_bytes == 300 << 20
        assert (await bus.js.stream_info("EVAL_REQUESTED")).config.max_bytes == 301 << 20
    finally:
        await bus.close()
    # a service connects with only its own rights (older limits: logged, never applied)
    async with connect(as_user(secured, tmp_path, "evaluator"), secured.url, owner=True) as ctx:
        assert not ctx.bus.provisioning
    assert (await fresh_bus(secured, tmp_path, wipe=False))[0].action == "updated"  # back to defaults


async def wipe(secured: SecuredBus, tmp_path: Path) -> None:
    """Every stream deleted, nothing provisioned (as admin)."""
    admin = await Bus.connect(secured.url, as_user(secured, tmp_path, "admin").bus)
    try:
        for info in await admin.js.streams_info():
            await admin.js.delete_stream(info.config.name)
    finally:
        await admin.close()


async def test_service_on_an_unprovisioned_bus_names_the_fix(secured: SecuredBus, tmp_path: Path) -> None:
    await wipe(secured, tmp_path)
    with pytest.raises(NotProvisioned, match=r"missing: REPO_CANDIDATE, .*run `cppperf bus provision`"):
        async with connect(as_user(secured, tmp_path, "evaluator"), secured.url, owner=True):
            pass
    env = {
        **os.environ,
        "CPPPERF_NATS_URL": secured.url,
        "CPPPERF_BUS_CREDS": secured.creds("filter"),
        "CPPPERF_OUT_DIR": str(tmp_path / "out"),
        "CPPPERF_HEALTH_DIR": str(tmp_path / "health"),
    }
    served = subprocess.run(
        [sys.executable, "-m", "cppperf", "serve", "filter"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert served.returncode == 1, served.stderr
    assert "Traceback" not in served.stderr
    errors = [line for line in served.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "run `cppperf bus provision` with the admin credentials" in errors[0]
    # the verb, as admin: everything created; the service then starts
    verb = subprocess.run(
        [sys.executable, "-m", "cppperf", "bus", "provision", "--json", "--creds", secured.creds("admin")],
        env={k: v for k, v in env.items() if k != "CPPPERF_BUS_CREDS"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verb.returncode == 0, verb.stderr
    assert '"action": "created"' in verb.stdout
    async with connect(as_user(secured, tmp_path, "filter"), secured.url, owner=True) as ctx:
        assert await ctx.store.ids("repos") == []


async def test_open_bus_still_provisions_itself(nats_server: object, tmp_path: Path) -> None:
    from tests.conftest import make_settings

    url = nats_server.url  # type: ignore[attr-defined]
    settings = make_settings(tmp_path, nats_url=url)
    async with connect(settings, url, owner=True) as ctx:
        assert ctx.bus.provisioning
        for name in required_streams():
            await ctx.bus.js.stream_info(name)


@pytest.mark.slow  # the refused call is only known after nats-py's 10 s JetStream timeout
def test_provision_with_a_service_users_creds_is_one_line(secured: SecuredBus, tmp_path: Path) -> None:
    asyncio.run(wipe(secured, tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPPPERF_")}
    verb = subprocess.run(
        [
            sys.executable,
            "-m",
            "cppperf",
            "bus",
            "provision",
            "--nats-url",
            secured.url,
            "--creds",
            secured.creds("builder"),
        ],
        env={**env, "CPPPERF_OUT_DIR": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert verb.returncode == 1 and "Traceback" not in verb.stderr
    assert verb.stderr.strip().splitlines() == [
        "error: the server refused provisioning (nats: permissions violation for publish to "
        '"$js.api.stream.create.repo_candidate"): use the admin\'s credentials'
    ]
