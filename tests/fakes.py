"""In-memory `Publisher`, `Records`, `StageContext` and `Claims` (shared/ports.py) for handler unit
tests: the same contract as `Bus`/`Store`/`KvClaims` (dedup by stable id, `id`/`updated_at`
stamped, blobs by name, text over the inline limit goes by reference; one holder of a key at a
time, a second claimant waits for it) without a broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from cppperf.shared import messages as m
from cppperf.shared.domain import InstanceMeta, InstanceRecord, Verdict
from cppperf.shared.errors import BadInput
from cppperf.shared.published import CommitInfo, Metadata, TestsSummary
from cppperf.shared.settings import Settings
from cppperf.shared.store import INLINE_LIMIT, encode_key, now_iso


@dataclass
class FakeBus:
    published: list[tuple[str, msgspec.Struct]] = field(default_factory=list)
    replies: list[tuple[str, msgspec.Struct]] = field(default_factory=list)
    seen_ids: set[str] = field(default_factory=set)

    async def publish(self, subject: str, msg: msgspec.Struct, *, msg_id: str | None = None) -> bool:
        key = msg_id or m.msg_id(msg)
        if key in self.seen_ids:
            return False  # JetStream drops a duplicate Nats-Msg-Id
        self.seen_ids.add(key)
        m.decode(m.encode(msg), type(msg))  # what goes on the wire must decode
        self.published.append((subject, msg))
        return True

    async def reply(self, subject: str, msg: msgspec.Struct) -> None:
        self.replies.append((subject, msg))

    def on(self, subject: str) -> list[Any]:
        return [msg for s, msg in self.published if s == subject]


@dataclass
class MemoryRecords:
    inline_limit: int = INLINE_LIMIT
    buckets: dict[str, dict[str, bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)

    async def get(self, bucket: str, item_id: str) -> dict[str, Any] | None:
        raw = self.buckets.get(bucket, {}).get(item_id)
        return None if raw is None else dict(json.loads(raw))

    async def put(self, bucket: str, item_id: str, value: dict[str, Any]) -> None:
        value = {**value, "id": item_id, "updated_at": now_iso()}
        self.buckets.setdefault(bucket, {})[item_id] = msgspec.json.encode(value)  # JSON, as the KV

    async def ids(self, bucket: str, *, under: str | None = None) -> list[str]:
        keys = list(self.buckets.get(bucket, {}))
        return keys if under is None else [k for k in keys if k.split(".", 1)[0] == under]

    async def create(self, bucket: str, item_id: str, value: dict[str, Any]) -> bool:
        if item_id in self.buckets.get(bucket, {}):
            return False
        await self.put(bucket, item_id, value)
        return True

    async def update(self, bucket: str, item_id: str, **fields: Any) -> dict[str, Any]:
        current = await self.get(bucket, item_id) or {}
        current.update(fields)
        await self.put(bucket, item_id, current)
        return current

    async def modify(
        self, bucket: str, item_id: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        current = await self.get(bucket, item_id)
        new = change(None if current is None else dict(current))
        if new is None:
            return current
        await self.put(bucket, item_id, new)
        return await self.get(bucket, item_id)

    async def put_blob(self, name: str, data: bytes) -> str:
        key = encode_key(name)
        self.blobs[key] = data
        return key

    async def get_blob(self, ref: str) -> bytes:
        if ref not in self.blobs:  # as Store.get_blob: a ref that is not there is bad input
            raise BadInput(f"{ref!r} is not in the object store (blobs)")
        return self.blobs[ref]

    async def delete_blob(self, ref: str) -> None:
        self.blobs.pop(ref, None)

    async def blob_size(self, ref: str) -> int:
        return len(await self.get_blob(ref))

    async def inline_or_ref(self, name: str, text: str) -> tuple[str, str | None]:
        data = text.encode()
        if len(data) <= self.inline_limit:
            return text, None
        return "", await self.put_blob(name, data)

    async def resolve_text(self, inline: str, ref: str | None) -> str:
        return (await self.get_blob(ref)).decode(errors="replace") if ref else inline


@dataclass
class FakeContext:
    settings: Settings
    bus: FakeBus = field(default_factory=FakeBus)
    store: MemoryRecords = field(default_factory=MemoryRecords)

    @property
    def out_dir(self) -> Path:
        return Path(self.settings.out_dir)


@dataclass
class MemoryClaims:
    """Claims in a dict: `held` takes a key only while nobody else holds it (another holder is
    simulated by putting its name in `holders`); `events` records what happened, in order."""

    token: str = "worker-test"
    holders: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def held(
        self, key: str, *, lease: float, wait: Callable[[str], Awaitable[None]] | None = None
    ) -> AsyncIterator[str]:
        if key in self.holders:
            self.events.append(("waiting", key))
            if wait is not None:
                await wait(self.holders[key])
            while key in self.holders:  # another holder releases it
                await asyncio.sleep(0.01)
        self.holders[key] = self.token
        self.events.append(("claimed", key))
        try:
            yield key
        finally:
            del self.holders[key]
            self.events.append(("released", key))

    async def announce(self, *, lease: float) -> None:
        self.events.append(("announced", f"worker/{self.token}"))

    def workspace(self, work_dir: Path, *, owner: str) -> Path:
        ws = work_dir / "attempts" / self.token
        ws.mkdir(parents=True, exist_ok=True)
        return ws

    async def clean_stale(self, work_dir: Path, *, owner: str) -> list[str]:
        self.events.append(("cleaned", owner))
        return []

    async def live(self) -> list[dict[str, Any]]:
        return [
            {"key": k, "holder": h, "since": 0.0, "expires_at": math.inf}
            for k, h in sorted(self.holders.items())
        ]


def stand_in_record(commit: m.CommitSelected, verdict: str, *, seed: int | None = None) -> InstanceRecord:
    """The least instance record a stand-in proof returns (no proof behind it); `seed` tells two
    builds of the same commit apart."""
    return InstanceRecord(
        metadata=Metadata(repository_name=commit.repo),
        commit_info=CommitInfo(old_sha=commit.parent, new_sha=commit.sha, files_changed=[]),
        tests=TestsSummary(tests=[]),
        cppperf=InstanceMeta(
            instance_id=m.instance_id(commit.repo, commit.sha), verdict=Verdict(verdict), seed=seed
        ),
    )


def write_bare_instance(out: Path, instance_id: str = "o__r-aaaaaaaaaaaa", verdict: str = "improved") -> None:
    """The least instance record predictions work from, in `out/instances/` (no proof behind it)."""
    record = {
        "cppperf": {"instance_id": instance_id, "verdict": verdict},
        "metadata": {"repository_name": "o/r"},
        "commit_info": {
            "old_sha": "b" * 40,
            "new_sha": "a" * 40,
            "patch": ["diff --git a/x b/x\n"],
            "files_changed": [],
        },
        "tests": {"tests": []},
    }
    (out / "instances").mkdir(parents=True, exist_ok=True)
    (out / "instances" / f"{instance_id}.json").write_text(json.dumps(record))
