"""JetStream KV buckets holding each item's stage and result, and an object store for blobs.

Buckets: `repos`, `commits`, `instances`, `evaluations` (DESIGN.md), plus `progress` (resumable
crawl slices) and `cache` (classifier answers). Keys are the stable ids, escaped to the KV key
alphabet (`[-/_=.a-zA-Z0-9]`; other characters become `=XX`). Values are JSON objects.
Blobs over `INLINE_LIMIT` bytes go to the object store bucket `blobs`.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from cppperf.shared.domain import InstanceState, to_struct
from cppperf.shared.ports import Records

BUCKETS: Final = ("repos", "commits", "instances", "evaluations", "progress", "cache")
BLOB_BUCKET: Final = "blobs"
INLINE_LIMIT: Final = 256 * 1024

_BAD_KEY_CHAR = re.compile(r"[^-/_.a-zA-Z0-9]")
_ESCAPE = re.compile(r"=([0-9A-F]{2})")


def encode_key(item_id: str) -> str:
    key = _BAD_KEY_CHAR.sub(lambda mt: f"={ord(mt.group()):02X}" if ord(mt.group()) < 256 else "=3F", item_id)
    return key.strip(".").replace("..", ".=2E") or "=00"


def decode_key(key: str) -> str:
    return _ESCAPE.sub(lambda mt: chr(int(mt.group(1), 16)), key)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class Store:
    def __init__(self, js: JetStreamContext, kv: dict[str, KeyValue], blobs: ObjectStore) -> None:
        self.js = js
        self._kv = kv
        self._blobs = blobs

    @classmethod
    async def open(cls, js: JetStreamContext, *, replicas: int = 1) -> Store:
        kv: dict[str, KeyValue] = {}
        for name in BUCKETS:
            try:
                kv[name] = await js.key_value(name)
            except BucketNotFoundError:
                kv[name] = await js.create_key_value(
                    js_api.KeyValueConfig(bucket=name, history=1, replicas=replicas)
                )
        try:
            blobs = await js.object_store(BLOB_BUCKET)
        except (BucketNotFoundError, NotFoundError):
            blobs = await js.create_object_store(BLOB_BUCKET, js_api.ObjectStoreConfig(replicas=replicas))
        return cls(js, kv, blobs)

    # ---------------------------------------------------------------- records
    async def get(self, bucket: str, item_id: str) -> dict[str, Any] | None:
        try:
            entry = await self._kv[bucket].get(encode_key(item_id))
        except KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        value: dict[str, Any] = msgspec.json.decode(entry.value)
        return value

    async def put(self, bucket: str, item_id: str, value: dict[str, Any]) -> None:
        value = {**value, "id": item_id, "updated_at": now_iso()}
        await self._kv[bucket].put(encode_key(item_id), msgspec.json.encode(value))

    async def create(self, bucket: str, item_id: str, value: dict[str, Any]) -> bool:
        """Write only if absent; False when another worker already recorded this item."""
        value = {**value, "id": item_id, "updated_at": now_iso()}
        try:
            await self._kv[bucket].create(encode_key(item_id), msgspec.json.encode(value))
        except Exception as exc:  # nats raises KeyWrongLastSequenceError / BadRequest on exists
            if "wrong last sequence" in str(exc).lower() or "exists" in str(exc).lower():
                return False
            raise
        return True

    async def update(self, bucket: str, item_id: str, **fields: Any) -> dict[str, Any]:
        current = await self.get(bucket, item_id) or {}
        current.update(fields)
        await self.put(bucket, item_id, current)
        return current

    async def delete(self, bucket: str, item_id: str) -> None:
        with contextlib.suppress(KeyNotFoundError):
            await self._kv[bucket].purge(encode_key(item_id))

    async def ids(self, bucket: str) -> list[str]:
        try:
            keys = await self._kv[bucket].keys()
        except NoKeysError:
            return []
        return [decode_key(k) for k in keys]

    async def all(self, bucket: str) -> list[dict[str, Any]]:
        out = []
        for item_id in await self.ids(bucket):
            rec = await self.get(bucket, item_id)
            if rec is not None:
                out.append(rec)
        return out

    # ---------------------------------------------------------------- blobs
    async def put_blob(self, name: str, data: bytes) -> str:
        key = encode_key(name)
        await self._blobs.put(key, data)
        return key

    async def get_blob(self, ref: str) -> bytes:
        res = await self._blobs.get(ref)
        return bytes(res.data or b"")

    async def inline_or_ref(self, name: str, text: str) -> tuple[str, str | None]:
        """Small text stays inline; large text goes to the object store and a ref is returned."""
        data = text.encode()
        if len(data) <= INLINE_LIMIT:
            return text, None
        return "", await self.put_blob(name, data)

    async def resolve_text(self, inline: str, ref: str | None) -> str:
        if ref:
            return (await self.get_blob(ref)).decode(errors="replace")
        return inline


async def instance_record(records: Records, iid: str) -> dict[str, Any] | None:
    """An instance record from the `instances` bucket (inline, or from the object store by
    `record_ref`); None when the bucket has no record for it (e.g. an imported dataset on disk)."""
    state = to_struct(await records.get("instances", iid) or {}, InstanceState)
    if not state.record and not state.record_ref:
        return None
    record: dict[str, Any] = json.loads(await records.resolve_text(state.record, state.record_ref))
    return record
