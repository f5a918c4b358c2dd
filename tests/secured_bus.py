"""A real nats-server running the shipped deploy/nats configuration (accounts.conf, agents.conf and
nats-1.conf with its cluster block removed, its port and store dir replaced), with fresh service
keys and agents made by `cppperf.agents` (the code `cppperf agents add` runs)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from nats.js.errors import APIError

from cppperf.agents import SERVICE_USERS, add_agent, service_keys
from cppperf.runtime import run_services
from cppperf.services.evaluator import app as evaluator_app
from cppperf.services.evaluator.handlers import EvaluatorOps
from cppperf.shared.bus import Bus
from cppperf.shared.embedded import EmbeddedNats, free_port
from cppperf.shared.provision import Provisioned, provision_all
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import Settings
from tests.conftest import make_settings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "nats"


def single_node_config(conf_text: str, *, port: int, store_dir: Path, monitor_port: int = 0) -> str:
    """nats-1.conf as one loopback node: only the port, the store dir, the monitoring port (none,
    or `monitor_port` on loopback: tests that read the server's own view) and the cluster block
    change; accounts and permissions are the shipped ones."""
    text = re.sub(r"(?m)^listen: .*$", f"listen: 127.0.0.1:{port}", conf_text)
    monitor = f"http: 127.0.0.1:{monitor_port}" if monitor_port else ""
    text = re.sub(r"(?m)^http: .*$", monitor, text)
    text = re.sub(r"(?m)^  store_dir: .*$", f"  store_dir: {store_dir}", text)
    text = re.sub(r"(?m)^  max_file_store: .*$", "  max_file_store: 20G", text)
    start = text.index("cluster {")
    end = text.index("\n}\n", start) + 3
    assert "store_dir" in text and "include" in text
    return text[:start] + text[end:]


@dataclass
class SecuredBus:
    server: EmbeddedNats
    dir: Path  # the config dir: accounts.conf, agents.conf, nats.conf, *.creds
    monitor_port: int = 0  # the server's monitoring endpoint on loopback (0: none)

    @property
    def url(self) -> str:
        return self.server.url

    def creds(self, who: str) -> str:
        """The creds file of a service user (`evaluator`, `admin`, …) or an agent."""
        return str(self.dir / f"{who}.creds")


@contextlib.contextmanager
def running_secured_bus(root: Path, agents: list[str]) -> Iterator[SecuredBus]:
    """`start_secured_bus`, stopped when the block ends (the tests' module fixtures)."""
    bus = start_secured_bus(root, agents)
    try:
        yield bus
    finally:
        bus.server.stop()


def start_secured_bus(root: Path, agents: list[str], *, monitor: bool = False) -> SecuredBus:
    conf_dir = root / "conf"
    conf_dir.mkdir(parents=True)
    shutil.copyfile(DEPLOY / "accounts.conf", conf_dir / "accounts.conf")
    shutil.copyfile(DEPLOY / "agents.conf", conf_dir / "agents.conf")
    for name in agents:
        add_agent(conf_dir / "agents.conf", name, conf_dir / f"{name}.creds")
    env = service_keys(conf_dir)
    assert set(env) == {f"NKEY_{u.upper()}" for u in SERVICE_USERS}
    port = free_port()
    monitor_port = free_port() if monitor else 0
    store = root / "store"
    (conf_dir / "nats.conf").write_text(
        single_node_config(
            (DEPLOY / "nats-1.conf").read_text(), port=port, store_dir=store, monitor_port=monitor_port
        )
    )
    server = EmbeddedNats(store, port=port, config=conf_dir / "nats.conf", env=env).start()
    return SecuredBus(server=server, dir=conf_dir, monitor_port=monitor_port)


def reload_config(secured: SecuredBus, *, times: int = 2, timeout: float = 10.0) -> None:
    """`nats-server --signal reload`, `times` times, each waited for in the server's log. Twice:
    nats-server wires a new account's service import only at the reload after the one that
    created the account (`cppperf agents add` says so)."""
    proc, log = secured.server.proc, secured.server.log_path
    assert proc is not None
    for _ in range(times):
        before = log.read_text().count("Reloaded server configuration")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while log.read_text().count("Reloaded server configuration") == before:
            assert time.monotonic() < deadline, "nats-server did not reload"
            time.sleep(0.02)


def as_user(
    secured: SecuredBus,
    tmp_path: Path,
    who: str,
    *,
    bus: dict[str, object] | None = None,
    **overrides: object,
) -> Settings:
    """Settings of a process connecting as `who` (a service user or `admin`)."""
    return make_settings(
        tmp_path, nats_url=secured.url, bus={"creds": secured.creds(who), **(bus or {})}, **overrides
    )


def _removals_pending(secured: SecuredBus) -> list[Path]:
    """Stream folders nats-server is still removing: a deleted stream's folder is renamed to
    `.NAME` and removed by a background goroutine (filestore `Delete`)."""
    return [p for p in secured.server.store_dir.glob("jetstream/*/streams/.*") if p.is_dir()]


async def fresh_bus(secured: SecuredBus, tmp_path: Path, *, wipe: bool = True) -> list[Provisioned]:
    """As admin: every stream deleted (`wipe`) and its folder gone from the store, then
    `cppperf bus provision`'s code. A server-side failure carries the server's own line (its log
    says why a store could not be created; the client only gets `error creating store`)."""
    bus = await Bus.connect(secured.url, as_user(secured, tmp_path, "admin").bus)
    try:
        if wipe:
            for info in await bus.js.streams_info():
                await bus.js.delete_stream(info.config.name)
            deadline = time.monotonic() + 30
            while _removals_pending(secured) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        try:
            return await provision_all(bus)
        except APIError as exc:
            log = secured.server.log_path.read_text(errors="replace").splitlines()
            why = [line for line in log if "failed" in line or "[ERR]" in line][-3:]
            raise AssertionError(f"provisioning the test bus failed: {exc}; server: {why}") from exc
    finally:
        await bus.close()


@contextlib.asynccontextmanager
async def evaluator_service(
    secured: SecuredBus, tmp_path: Path, ops: EvaluatorOps, **evaluator: object
) -> AsyncIterator[ServiceContext]:
    """A clean bus provisioned as admin, then the evaluator service with only its own user and
    `ops` as its evaluation (`evaluator`: its settings)."""
    await fresh_bus(secured, tmp_path)
    settings = as_user(secured, tmp_path, "evaluator", evaluator=evaluator)
    register = {"evaluator": lambda b, c: evaluator_app.register(b, c, ops=ops)}
    async with run_services(settings, secured.url, ["evaluator"], register=register) as running:
        yield running.ctx
