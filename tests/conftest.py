"""Shared fixtures: one real nats-server per test session (free port, temp store), a clean
JetStream per test, and the generated demo C++/CMake repository."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cppperf.demo import DemoRepo, create_demo_repo
from cppperf.shared.bus import Bus
from cppperf.shared.embedded import EmbeddedNats
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import Settings, load_settings
from cppperf.shared.store import Store

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every test's data (embedded NATS store, mirrors, work dirs) inside its tmp_path."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for key in list(os.environ):
        if key.startswith("CPPPERF_"):
            monkeypatch.delenv(key)


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    base: dict[str, object] = {
        "out_dir": str(tmp_path / "out"),
        "bus": {"ack_wait": 5.0, "max_deliver": 3, "nak_delay": 0.2},
        "builder": {"runs": 11, "early_stop_min_rounds": 6, "work_dir": str(tmp_path / "work")},
        "mining": {"mirror_dir": str(tmp_path / "mirrors")},
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}  # type: ignore[dict-item]
        else:
            base[k] = v
    return load_settings(env={}, **base)


async def _wipe(bus: Bus) -> None:
    names = []
    async for name in _stream_names(bus):
        names.append(name)
    for name in names:
        with contextlib.suppress(Exception):
            await bus.js.delete_stream(name)


async def _stream_names(bus: Bus) -> AsyncIterator[str]:
    for info in await bus.js.streams_info():
        yield info.config.name


@pytest.fixture
async def ctx(nats_server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[ServiceContext]:
    """A clean JetStream (every stream, KV bucket and object store deleted) and a service context."""
    settings = make_settings(tmp_path, nats_url=nats_server.url)
    bus = await Bus.connect(nats_server.url, settings.bus)
    await _wipe(bus)
    await bus.provision()
    store = await Store.open(bus.js)
    try:
        yield ServiceContext(settings=settings, bus=bus, store=store)
    finally:
        await bus.close()


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> DemoRepo:
    return create_demo_repo(tmp_path_factory.mktemp("demo") / "demo")
