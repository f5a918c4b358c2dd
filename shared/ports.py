"""What a stage's handlers need from the outside world, as Protocols, so they run without a broker.

    Publisher     publish a message on a subject (stable id → Nats-Msg-Id); answer a reply subject
    Records       the KV buckets (`repos`, `commits`, `instances`, `evaluations`, `cache`, `progress`)
                  and the blob store (object store) behind them
    StageContext  settings + a Publisher + Records + the export directory
    Claims        leases across replicas (one holder of a job at a time), this worker's heartbeat
                  lease, its own workspace and the removal of dead attempts' workspaces

`shared.bus.Bus`, `shared.store.Store`, `shared.service.ServiceContext` and
`shared.claims.KvClaims` (the `claims` KV bucket) are the real ones;
`tests/fakes.py` holds in-memory ones for handler unit tests. Handlers live in
`services/<stage>/handlers.py`; `app.py` only wires them to subscribers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import msgspec

from cppperf.shared.settings import Settings


class Publisher(Protocol):
    async def publish(self, subject: str, msg: msgspec.Struct, *, msg_id: str | None = None) -> bool: ...

    async def reply(self, subject: str, msg: msgspec.Struct) -> None:
        """Answer a request's reply subject (core NATS, not persisted)."""
        ...


class Records(Protocol):
    async def get(self, bucket: str, item_id: str) -> dict[str, Any] | None: ...
    async def put(self, bucket: str, item_id: str, value: dict[str, Any]) -> None: ...
    async def create(self, bucket: str, item_id: str, value: dict[str, Any]) -> bool:
        """Write only if absent; False when the item is recorded already."""
        ...

    async def update(self, bucket: str, item_id: str, **fields: Any) -> dict[str, Any]: ...
    async def modify(
        self, bucket: str, item_id: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Compare-and-set: `change` of the current record (None: absent) written unless another
        writer came first (then re-read and re-applied); `change` returning None writes nothing."""
        ...

    async def put_blob(self, name: str, data: bytes) -> str: ...
    async def get_blob(self, ref: str) -> bytes: ...
    async def delete_blob(self, ref: str) -> None: ...
    async def blob_size(self, ref: str) -> int: ...
    async def inline_or_ref(self, name: str, text: str) -> tuple[str, str | None]: ...
    async def resolve_text(self, inline: str, ref: str | None) -> str: ...


class StageContext(Protocol):
    @property
    def settings(self) -> Settings: ...
    @property
    def bus(self) -> Publisher: ...
    @property
    def store(self) -> Records: ...
    @property
    def out_dir(self) -> Path: ...


class Claims(Protocol):
    """Leases across replicas and this process's workspace (`shared/claims.py` has the contract)."""

    @property
    def token(self) -> str:
        """This process's holder name (`host-pid-random`)."""
        ...

    def held(
        self, key: str, *, lease: float, wait: Callable[[str], Awaitable[None]] | None = None
    ) -> AbstractAsyncContextManager[object]:
        """Hold `key` for the block (renewed, released at the end); while another live holder has
        it, `wait(holder)` once, then wait until it is free or its lease ran out."""
        ...

    async def announce(self, *, lease: float) -> None:
        """This worker is alive (`worker/<token>`), renewed for as long as the process runs."""
        ...

    def workspace(self, work_dir: Path, *, owner: str) -> Path:
        """This process's own locked workspace under `work_dir` for the run `owner`."""
        ...

    async def clean_stale(self, work_dir: Path, *, owner: str) -> list[str]:
        """Remove the workspaces of the run `owner` whose process is provably dead; their tokens."""
        ...

    async def live(self) -> list[dict[str, Any]]:
        """The jobs held now: key, holder, since, expires_at (oldest first)."""
        ...
