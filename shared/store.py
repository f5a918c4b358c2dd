"""JetStream KV buckets holding each item's stage and result, and an object store for blobs.

Buckets: `repos`, `commits`, `instances`, `evaluations` (docs/design.md), plus `progress` (resumable
crawl slices) and `cache` (classifier answers). Keys are the stable ids, escaped to the KV key
alphabet (`[-/_=.a-zA-Z0-9]`; other characters become `=XX`). Values are JSON objects.
Blobs over `INLINE_LIMIT` bytes go to the object store bucket `blobs`; `claims` holds leases
(`shared/claims.py`).

Where two stages touch one key, writes are compare-and-set on the entry's revision (`modify`,
`update`): a concurrent writer makes us re-read and re-apply, never overwrite. A bucket that has
gone missing (deleted, or never created on this cluster node) is re-created once on the failure
path, with a `bucket_reprovisioned` log line, and the operation retried; on a bus that only the
admin provisions (`bus.provision`, a secured bus) nothing is created: a missing bucket raises
`NotProvisioned` ("run `cppperf bus provision` …"). `ensure_buckets` is the admin's side: every
bucket created or brought to the configured limits, also one that exists with older limits.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Final, Literal, TypeVar

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import (
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
    NoStreamResponseError,
    NotFoundError,
    ObjectNotFoundError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from cppperf.shared import buckets
from cppperf.shared.buckets import INSTANCES, NAMES
from cppperf.shared.domain import InstanceRecord, InstanceState, decode_record
from cppperf.shared.errors import BadInput, NotProvisioned, TransientError
from cppperf.shared.logging import get_logger
from cppperf.shared.ports import Records

log = get_logger(__name__)
T = TypeVar("T")
Change = Callable[[dict[str, Any] | None], dict[str, Any] | None]

BUCKETS: Final = NAMES  # shared/buckets.py
CAS_ATTEMPTS: Final = 20
_STREAM_NOT_FOUND: Final = 10059  # JetStream API err_code
BLOB_BUCKET: Final = "blobs"
INLINE_LIMIT: Final = 256 * 1024
KV_MAX_BYTES: Final = 256 * 1024 * 1024  # BusSettings.kv_max_bytes: a full bucket refuses writes
BLOB_MAX_BYTES: Final = 4 * 1024 * 1024 * 1024  # BusSettings.blob_max_bytes

_BAD_KEY_CHAR = re.compile(r"[^-/_.a-zA-Z0-9]")
_ESCAPE = re.compile(r"=(?:U([0-9A-F]{6})|([0-9A-F]{2}))")
EMPTY_KEY: Final = "="  # the empty id (no id escapes to a lone `=`: `=` itself is `=3D`)


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"={code:02X}" if code < 256 else f"=U{code:06X}"


def encode_key(item_id: str) -> str:
    """A valid KV key for any id, one per id (injective: `decode_key` gives the id back). Only
    `[-/_.a-zA-Z0-9]` stay; `=` and everything else is escaped (`=XX`, `=UXXXXXX` beyond Latin-1);
    a leading or trailing dot, and the second of two, are escaped too (a key's tokens are never
    empty). Ids differing only there — `x` and `x.`, `.` and `..`, from an agent's request — never
    share a record."""
    if not item_id:
        return EMPTY_KEY
    key = _BAD_KEY_CHAR.sub(lambda mt: _escape(mt.group()), item_id)
    if key.startswith("."):
        key = "=2E" + key[1:]
    if key.endswith("."):
        key = key[:-1] + "=2E"
    return key.replace("..", ".=2E")


def decode_key(key: str) -> str:
    if key == EMPTY_KEY:
        return ""
    return _ESCAPE.sub(lambda mt: chr(int(mt.group(1) or mt.group(2), 16)), key)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _bucket_gone(exc: BaseException) -> bool:
    """True when `exc` says the bucket's stream does not exist (not: the key does not)."""
    if isinstance(exc, KeyNotFoundError | KeyDeletedError | NoKeysError | ObjectNotFoundError):
        return False
    if isinstance(exc, BucketNotFoundError | NoRespondersError | NoStreamResponseError):
        return True
    return isinstance(exc, NotFoundError) and exc.err_code == _STREAM_NOT_FOUND


class Store:
    def __init__(
        self, js: JetStreamContext, kv: dict[str, KeyValue], blobs: ObjectStore, *, replicas: int = 1
    ) -> None:
        self.js = js
        self._kv = kv
        self._blobs = blobs
        self.replicas = replicas
        self.kv_max_bytes = KV_MAX_BYTES
        self.blob_max_bytes = BLOB_MAX_BYTES
        self.creates_buckets = True  # False on a secured bus: a missing bucket is `NotProvisioned`

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        *,
        replicas: int = 1,
        kv_max_bytes: int = KV_MAX_BYTES,
        blob_max_bytes: int = BLOB_MAX_BYTES,
        create: bool = True,
    ) -> Store:
        """The buckets and the object store; `create=False` (a secured bus, which only the admin
        provisions): a missing one raises `NotProvisioned` instead of being created."""
        kv: dict[str, KeyValue] = {}
        for name in BUCKETS:
            kv[name] = await _open_bucket(js, name, replicas, kv_max_bytes, create=create)
        blobs = await open_blobs(js, replicas, blob_max_bytes, create=create)
        store = cls(js, kv, blobs, replicas=replicas)
        store.kv_max_bytes, store.blob_max_bytes, store.creates_buckets = kv_max_bytes, blob_max_bytes, create
        return store

    # ---------------------------------------------------------------- missing buckets
    async def _on_kv(self, bucket: str, op: Callable[[KeyValue], Awaitable[T]]) -> T:
        """Run `op` on the bucket; if the bucket is gone, re-create it once and retry."""
        try:
            return await op(self._kv[bucket])
        except Exception as exc:
            if not _bucket_gone(exc):
                raise
            log.warning("bucket_reprovisioned", bucket=bucket, error=str(exc) or type(exc).__name__)
            self._kv[bucket] = await _open_bucket(
                self.js, bucket, self.replicas, self.kv_max_bytes, create=self.creates_buckets
            )
        return await op(self._kv[bucket])

    async def _on_blobs(self, op: Callable[[ObjectStore], Awaitable[T]]) -> T:
        try:
            return await op(self._blobs)
        except Exception as exc:
            if not _bucket_gone(exc):
                raise
            log.warning("bucket_reprovisioned", bucket=BLOB_BUCKET, error=str(exc) or type(exc).__name__)
            self._blobs = await open_blobs(
                self.js, self.replicas, self.blob_max_bytes, create=self.creates_buckets
            )
        return await op(self._blobs)

    # ---------------------------------------------------------------- records
    async def entry(self, bucket: str, item_id: str) -> tuple[dict[str, Any], int] | None:
        """The record and its revision (for compare-and-set), or None."""
        key = encode_key(item_id)

        async def op(kv: KeyValue) -> tuple[dict[str, Any], int] | None:
            try:
                e = await kv.get(key)
            except (KeyNotFoundError, KeyDeletedError):
                return None
            if e.value is None or e.revision is None:
                return None
            value: dict[str, Any] = msgspec.json.decode(e.value)
            return value, e.revision

        return await self._on_kv(bucket, op)

    async def get(self, bucket: str, item_id: str) -> dict[str, Any] | None:
        found = await self.entry(bucket, item_id)
        return None if found is None else found[0]

    async def put(self, bucket: str, item_id: str, value: dict[str, Any]) -> None:
        """Unconditional write: only for keys one stage owns alone."""
        data = msgspec.json.encode({**value, "id": item_id, "updated_at": now_iso()})
        await self._on_kv(bucket, lambda kv: kv.put(encode_key(item_id), data))

    async def create(self, bucket: str, item_id: str, value: dict[str, Any]) -> bool:
        """Write only if absent; False when another worker already recorded this item."""
        data = msgspec.json.encode({**value, "id": item_id, "updated_at": now_iso()})
        try:
            await self._on_kv(bucket, lambda kv: kv.create(encode_key(item_id), data))
        except KeyWrongLastSequenceError:
            return False
        except Exception as exc:  # older servers answer BadRequest "key exists"
            if "wrong last sequence" in str(exc).lower() or "exists" in str(exc).lower():
                return False
            raise
        return True

    async def modify(self, bucket: str, item_id: str, change: Change) -> dict[str, Any] | None:
        """Compare-and-set: apply `change` to the current record (None when absent) and write the
        result only if nobody wrote in between; re-read and re-apply otherwise. `change` returning
        None means "leave it as it is". Returns the record as stored."""
        key = encode_key(item_id)
        for _ in range(CAS_ATTEMPTS):
            found = await self.entry(bucket, item_id)
            current = None if found is None else dict(found[0])
            new = change(None if current is None else dict(current))
            if new is None:
                return current
            new = {**new, "id": item_id, "updated_at": now_iso()}
            data = msgspec.json.encode(new)
            try:
                await self._write_if(bucket, key, data, None if found is None else found[1])
            except KeyWrongLastSequenceError:
                continue  # another writer won this round: read again
            return new
        raise TransientError(f"{bucket}/{item_id}: {CAS_ATTEMPTS} concurrent writes in a row")

    async def _write_if(self, bucket: str, key: str, data: bytes, revision: int | None) -> None:
        """Create when `revision` is None, else update only at that revision."""

        async def op(kv: KeyValue) -> int:
            if revision is None:
                return await kv.create(key, data)
            return await kv.update(key, data, last=revision)

        await self._on_kv(bucket, op)

    async def update(self, bucket: str, item_id: str, **fields: Any) -> dict[str, Any]:
        """Set `fields` on the record (compare-and-set: other fields written meanwhile are kept)."""
        rec = await self.modify(bucket, item_id, lambda cur: {**(cur or {}), **fields})
        assert rec is not None
        return rec

    async def delete(self, bucket: str, item_id: str, *, revision: int | None = None) -> bool:
        """Remove the record; with `revision`, only if it is still that revision."""
        key = encode_key(item_id)
        try:
            if revision is None:
                await self._on_kv(bucket, lambda kv: kv.purge(key))
            else:
                await self._on_kv(bucket, lambda kv: kv.delete(key, last=revision))
        except KeyNotFoundError:
            return False
        except KeyWrongLastSequenceError:
            return False
        return True

    async def last(self, bucket: str, item_id: str) -> tuple[dict[str, Any] | None, int] | None:
        """The key's last revision, a delete marker's too: (its value, its revision); the value is
        None for a marker and {} when it is not JSON. None when the key has nothing at all."""
        key = encode_key(item_id)

        async def op(kv: KeyValue) -> tuple[dict[str, Any] | None, int] | None:
            try:
                e = await kv.get(key)
            except (KeyNotFoundError, KeyDeletedError) as exc:  # nats-py: a marker's entry rides along
                marker = exc.entry
                return None if marker is None or marker.revision is None else (None, marker.revision)
            if e.revision is None:
                return None
            try:
                value = msgspec.json.decode(e.value or b"")
            except msgspec.DecodeError:
                value = {}
            return (value if isinstance(value, dict) else {}), e.revision

        return await self._on_kv(bucket, op)

    async def forget(self, bucket: str, item_id: str, *, through: int | None = None) -> None:
        """Remove every trace of the record — its revisions and its delete or purge marker (a
        purge of its key's subject; `delete` leaves a marker that `count` still counts) — up to
        revision `through` (inclusive) when given: a revision written after it stays."""
        subject = f"$KV.{bucket}.{encode_key(item_id)}"
        upto = None if through is None else through + 1  # the purge keeps this sequence on

        async def op(kv: KeyValue) -> bool:
            await kv.status()  # a missing bucket raises what `_on_kv` re-creates it on
            return await self.js.purge_stream(f"KV_{bucket}", subject=subject, seq=upto)

        await self._on_kv(bucket, op)

    async def ids(self, bucket: str, *, under: str | None = None, removed: bool = False) -> list[str]:
        """Every id in the bucket; `under`: only ids whose first dot-separated part is `under`
        (an agent's evaluations, `<agent>.<run>/…`), selected by the server (a subject filter),
        so the rest of the bucket is never read.

        Read by an ephemeral pull consumer (last per key, headers only) up to the count the server
        gave at its creation (a timeout short of it is a TransientError, never a shorter list) —
        not by nats-py's `keys()`/`watch()`, which end at the first message whose `num_pending`
        is 0: under load an agent's `results` page came back short (2008 rows of 2500) and its
        run looked finished. `removed`: the ids whose last message is a delete or purge marker
        too (what `count` counts)."""
        prefix = f"$KV.{bucket}."
        subject = f"{prefix}{encode_key(under)}.>" if under is not None else f"{prefix}>"

        async def op(kv: KeyValue) -> list[str]:
            await kv.status()  # a missing bucket raises what `_on_kv` re-creates it on
            config = js_api.ConsumerConfig(
                deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=js_api.AckPolicy.NONE,
                headers_only=True,
                # removed by the server this long after its last fetch (a service may not delete
                # consumers); long enough for a busy client between creating and fetching
                inactive_threshold=30.0,
                mem_storage=True,
                num_replicas=1,
            )
            sub = await self.js.pull_subscribe(subject, stream=f"KV_{bucket}", config=config)
            keys: list[str] = []
            try:
                # a pull consumer is sent nothing before it asks: its pending count is every key
                total, seen = (await sub.consumer_info()).num_pending or 0, 0
                while seen < total:  # to the count, never to a message's own `num_pending`
                    try:
                        msgs = await sub.fetch(batch=min(total - seen, 1024), timeout=10)
                    except NatsTimeoutError:
                        raise TransientError(f"listing {bucket}: {seen} of {total} keys came") from None
                    seen += len(msgs)
                    for msg in msgs:
                        headers = msg.headers or {}
                        gone = (
                            headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers
                        )
                        if gone and not removed:
                            continue  # a removed key (its marker is the last message of its subject)
                        keys.append(msg.subject[len(prefix) :])
            finally:
                await sub.unsubscribe()
            return keys

        return [decode_key(k) for k in await self._on_kv(bucket, op)]

    async def count(self, bucket: str, *, under: str) -> int:
        """How many ids `ids(bucket, under=under)` lists, counted by the server without sending
        one: an ephemeral pull consumer over the keys `<under>.>` (last per key) and its pending
        count. Nothing pulls it; the server removes it after a second (a service may not delete
        consumers)."""

        async def op(kv: KeyValue) -> int:
            await kv.status()  # a missing bucket raises what `_on_kv` re-creates it on
            config = js_api.ConsumerConfig(
                filter_subject=f"$KV.{bucket}.{encode_key(under)}.>",
                deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=js_api.AckPolicy.NONE,
                inactive_threshold=1.0,
                mem_storage=True,
                num_replicas=1,
            )
            info = await self.js.add_consumer(f"KV_{bucket}", config)
            return int(info.num_pending or 0)

        return await self._on_kv(bucket, op)

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
        await self._on_blobs(lambda b: b.put(key, data))
        return key

    async def delete_blob(self, ref: str) -> None:
        """Remove the object `ref` (absent already: nothing to do)."""
        with contextlib.suppress(ObjectNotFoundError):
            await self._on_blobs(lambda b: b.delete(ref))

    async def blob_size(self, ref: str) -> int:
        """The size of a stored object, read from its metadata (the object is not fetched)."""
        info = await self._on_blobs(lambda b: b.get_info(ref))
        return int(info.size or 0)

    async def get_blob(self, ref: str) -> bytes:
        """The object `ref`; BadInput when the object store has none (a message naming a payload
        that is not there can never succeed: it is dead-lettered with this reason, not retried)."""
        try:
            res = await self._on_blobs(lambda b: b.get(ref))
        except ObjectNotFoundError:
            raise BadInput(f"{ref!r} is not in the object store ({BLOB_BUCKET})") from None
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


async def instance_record(records: Records, iid: str) -> InstanceRecord | None:
    """An instance record from the `instances` bucket (inline, or from the object store by
    `record_ref`); None when the bucket has no record for it (e.g. an imported dataset on disk).
    A stored record that does not decode raises ValueError (`msgspec.ValidationError`)."""
    state = await buckets.get(records, INSTANCES, iid) or InstanceState()
    if not state.record and not state.record_ref:
        return None
    return decode_record(await records.resolve_text(state.record, state.record_ref))


NOT_PROVISIONED: Final = "run `cppperf bus provision` with the admin credentials"


async def _open_bucket(
    js: JetStreamContext, name: str, replicas: int, max_bytes: int, *, create: bool = True
) -> KeyValue:
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        if not create:  # a secured bus: only the admin creates buckets
            raise NotProvisioned(f"KV bucket {name} is missing: {NOT_PROVISIONED}") from None
        return await js.create_key_value(_kv_config(name, replicas, max_bytes))


def _kv_config(name: str, replicas: int, max_bytes: int) -> js_api.KeyValueConfig:
    return js_api.KeyValueConfig(bucket=name, history=1, replicas=replicas, max_bytes=max_bytes)


async def open_blobs(
    js: JetStreamContext, replicas: int, max_bytes: int = BLOB_MAX_BYTES, *, create: bool = True
) -> ObjectStore:
    try:
        return await js.object_store(BLOB_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        if not create:
            raise NotProvisioned(f"object store {BLOB_BUCKET} is missing: {NOT_PROVISIONED}") from None
        return await js.create_object_store(
            BLOB_BUCKET, js_api.ObjectStoreConfig(replicas=replicas, max_bytes=max_bytes)
        )


Action = Literal["created", "updated", "unchanged"]


async def ensure_buckets(
    js: JetStreamContext, *, replicas: int, kv_max_bytes: int, blob_max_bytes: int
) -> list[tuple[str, Action]]:
    """Every KV bucket and the object store, created or brought to these limits (`max_bytes`,
    replicas) when they exist with others: what `cppperf bus provision` does to them."""
    done: list[tuple[str, Action]] = []
    for name in BUCKETS:
        try:
            await js.key_value(name)
        except BucketNotFoundError:
            await js.create_key_value(_kv_config(name, replicas, kv_max_bytes))
            done.append((f"KV_{name}", "created"))
            continue
        done.append((f"KV_{name}", await _limit_stream(js, f"KV_{name}", replicas, kv_max_bytes)))
    try:
        await js.object_store(BLOB_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        await open_blobs(js, replicas, blob_max_bytes)
        done.append((f"OBJ_{BLOB_BUCKET}", "created"))
    else:
        done.append(
            (f"OBJ_{BLOB_BUCKET}", await _limit_stream(js, f"OBJ_{BLOB_BUCKET}", replicas, blob_max_bytes))
        )
    return done


async def _limit_stream(js: JetStreamContext, stream: str, replicas: int, max_bytes: int) -> Action:
    """A bucket's stream with these limits (its other settings as the server has them)."""
    config = (await js.stream_info(stream)).config
    if config.max_bytes == max_bytes and config.num_replicas == replicas:
        return "unchanged"
    config.max_bytes, config.num_replicas = max_bytes, replicas
    await js.update_stream(config)
    return "updated"
