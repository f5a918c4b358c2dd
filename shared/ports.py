"""What a stage's handlers need from the outside world, as Protocols, so they run without a broker.

    Publisher     publish a message on a subject (stable id → Nats-Msg-Id); answer a reply subject
    Records       the KV buckets (`repos`, `commits`, `instances`, `evaluations`, `cache`, `progress`)
                  and the blob store (object store) behind them
    StageContext  settings + a Publisher + Records + the export directory

`shared.bus.Bus`, `shared.store.Store` and `shared.service.ServiceContext` are the real ones;
`tests/fakes.py` holds in-memory ones for handler unit tests. Handlers live in
`services/<stage>/handlers.py`; `app.py` only wires them to subscribers.
"""

from __future__ import annotations

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
    async def put_blob(self, name: str, data: bytes) -> str: ...
    async def get_blob(self, ref: str) -> bytes: ...
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
