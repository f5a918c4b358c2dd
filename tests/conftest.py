"""Shared fixtures: one real nats-server per test session (free port, temp store), a clean
JetStream per test, the generated demo C++/CMake repository, and its commits proven once per
session by the builder (`proven`), which the builder, evaluator and hostile tests all read."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from cppperf.demo import DemoRepo, create_demo_repo
from cppperf.services.builder.service import build_patch
from cppperf.services.evaluator.instances import EvalInstance
from cppperf.services.filter.links import LinkResolver
from cppperf.services.filter.select import to_message
from cppperf.services.filter.walk import commit_details, iter_commits
from cppperf.shared import messages as m
from cppperf.shared.bus import Bus
from cppperf.shared.domain import InstanceRecord, record_text
from cppperf.shared.embedded import EmbeddedNats
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import Settings, load_settings
from cppperf.shared.store import Store

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# The timing-core lease directory of this test run: the user's CPPPERF_BUILDER_LEASE_DIR (read
# before any test clears CPPPERF_*), else one folder per pytest session (`session_lease_dir`), never
# the host-wide /tmp/cppperf-leases a benchmark beside the suite holds.
USER_LEASE_DIR = os.environ.get("CPPPERF_BUILDER_LEASE_DIR", "")
_lease_dir: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def session_lease_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One lease directory for the whole run, shared by every test and every process it starts (so
    tests about leases between processes still meet in it): in-process, the default `builder.lease_dir`
    points at it; `_isolated_dirs` exports it to subprocesses."""
    from cppperf.shared.engine import leases

    path = Path(USER_LEASE_DIR) if USER_LEASE_DIR else tmp_path_factory.getbasetemp() / "leases"
    path.mkdir(parents=True, exist_ok=True)
    _lease_dir[:] = [path]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(leases, "DEFAULT_LEASE_DIR", str(path))
        yield path
    _lease_dir.clear()


def run_lease_dir() -> str:
    """This run's lease directory (`session_lease_dir`), for settings built without the fixture."""
    return str(_lease_dir[0]) if _lease_dir else (USER_LEASE_DIR or "")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, session_lease_dir: Path) -> None:
    """Keep every test's data (embedded NATS store, mirrors, work dirs) inside its tmp_path; the
    one CPPPERF_* setting kept is this run's lease directory, for the processes a test starts."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for key in list(os.environ):
        if key.startswith("CPPPERF_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CPPPERF_BUILDER_LEASE_DIR", str(session_lease_dir))


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    base: dict[str, object] = {
        "out_dir": str(tmp_path / "out"),
        "bus": {"ack_wait": 5.0, "max_deliver": 3, "nak_delay": 0.2},
        "builder": {
            "runs": 11,
            "early_stop_min_rounds": 6,
            "work_dir": str(tmp_path / "work"),
            "lease_dir": run_lease_dir(),  # this run's, not the host's (`session_lease_dir`)
        },
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


def eval_instance(**fields: Any) -> EvalInstance:
    """An evaluator's instance for unit tests of what is decided before any tree is built: a
    valid id, a repository nowhere, proven improved; `fields` override."""
    base: dict[str, Any] = {
        "instance_id": "o__r-0123456789ab",
        "repo": "o/r",
        "url": "/nowhere",
        "base_sha": "a" * 40,
        "expert_sha": "b" * 40,
        "expert_patch": "",
        "verdict": "improved",
    }
    return EvalInstance(**(base | fields))


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> DemoRepo:
    """The demo with its `other` test at ~70 ms instead of ~5 ms: above `builder.sample_floor`
    (50 ms), so each of its samples is one run, not the mean of ten (the same work timed per
    sample, a tenth of the sandboxed launches: they were 220 of a proof's 256). `spin`, whose
    2× speed-up the verdict tests look for, is the default. The README's examples make their own
    default demo (its commit ids are quoted there)."""
    return create_demo_repo(tmp_path_factory.mktemp("demo") / "demo", other_iters=40_000_000)


def commit_for(repo: Path, sha: str, name: str = "local/demo") -> m.CommitSelected:
    header = next(iter_commits(repo, f"{sha}^!"))
    details = next(commit_details(repo, [header]))
    return to_message(name, str(repo), header, details, LinkResolver())


S = TypeVar("S", bound=msgspec.Struct)


def as_file(record: InstanceRecord) -> dict[str, Any]:
    """An instance record as its file holds it (its JSON, parsed): what tests index into."""
    data: dict[str, Any] = json.loads(record_text(record))
    return data


def strict(value: object, typ: type[S]) -> S:
    """`value` (a record section or a report) read back from its JSON as written and decoded
    strictly as its domain Struct: a key the Struct does not declare (`forbid_unknown_fields`) or a
    value of another type fails. (Python's JSON, as the files are written: an unknown CI is
    `Infinity`, which `msgspec.json` does not read.)"""
    return msgspec.convert(json.loads(json.dumps(value)), typ, strict=True)


@dataclass(frozen=True)
class Proven:
    """One demo commit proven by the local builder with `make_settings` defaults."""

    settings: Settings  # what it was proven with
    path: Path  # the instance record the builder wrote
    record: dict[str, Any]  # a copy of it for the test that asked: change it freely

    def copy_to(self, out_dir: Path) -> None:
        """Put the record where the evaluator looks for it (OUT/instances/<id>.json)."""
        dest = out_dir / "instances" / self.path.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.path, dest)


@pytest.fixture(scope="session")
def proven(tmp_path_factory: pytest.TempPathFactory, demo_repo: DemoRepo) -> Callable[[str], Proven]:
    """`proven(kind)`: the demo's commit of that kind built and timed once per session (the first
    test to ask pays for it), with the settings every builder test used for it before."""
    done: dict[str, Proven] = {}

    def get(kind: str) -> Proven:
        if kind not in done:
            root = tmp_path_factory.mktemp(f"proven-{kind}")
            settings = make_settings(root)
            built = build_patch(
                commit_for(demo_repo.path, demo_repo.shas[kind]),
                demo_repo.path,
                settings.builder,
                work_dir=root / "work",
                out_dir=Path(settings.out_dir),
            )
            record = as_file(built.record)
            strict(record, InstanceRecord)  # the record is what the domain declares, every section
            done[kind] = Proven(settings=settings, path=built.path, record=record)
        p = done[kind]
        return Proven(settings=p.settings, path=p.path, record=copy.deepcopy(p.record))

    return get
