"""Who creates the bus's streams, KV buckets and object store, and how a service knows they exist.

On the embedded or an open bus every process provisions what it needs on connect
(`BusSettings.self_provisioning`). On a secured bus (`bus.provision = admin`, the default when
`creds`/`nkey_seed` is set) the service users have no right to create or update a stream
(deploy/nats/accounts.conf): the operator runs `cppperf bus provision` with the admin credentials
once (and after changing a limit), which creates every stream, bucket and the object store and
brings existing ones to the configured limits; a service then only checks (`require_provisioned`)
and stops with one line naming what is missing. Durable consumers stay with their services.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from cppperf.shared.bus import DLQ_STREAM, OUTPUT_STREAMS, WORK_QUEUES, Bus
from cppperf.shared.errors import NotProvisioned
from cppperf.shared.settings import BusSettings
from cppperf.shared.store import BLOB_BUCKET, BUCKETS, NOT_PROVISIONED, Action, ensure_buckets


def required_streams() -> list[str]:
    """Every JetStream stream the pipeline uses: work queues, announcements, DLQ, buckets."""
    return [
        *(q.stream for q in WORK_QUEUES.values()),
        *OUTPUT_STREAMS.values(),
        DLQ_STREAM,
        *(f"KV_{b}" for b in BUCKETS),
        f"OBJ_{BLOB_BUCKET}",
    ]


async def missing_streams(js: JetStreamContext) -> list[str]:
    missing = []
    for name in required_streams():
        try:
            await js.stream_info(name)
        except NotFoundError:
            missing.append(name)
    return missing


async def require_provisioned(js: JetStreamContext) -> None:
    """Raise `NotProvisioned` (one line, naming what is missing) unless everything exists."""
    if missing := await missing_streams(js):
        raise NotProvisioned(f"the bus is not provisioned (missing: {', '.join(missing)}): {NOT_PROVISIONED}")


@dataclass(frozen=True)
class Provisioned:
    name: str  # the JetStream stream (`KV_<bucket>`, `OBJ_blobs` for the stores)
    action: Action


async def provision_all(bus: Bus) -> list[Provisioned]:
    """`cppperf bus provision`: every stream, KV bucket and the object store created, or updated
    to the configured limits; missing durable consumers created (their settings stay with their
    services); idempotent."""
    s: BusSettings = bus.settings
    bus.provisioning = True
    streams = await bus.provision(owner=True, services=[])  # consumers: created, never changed
    stores = await ensure_buckets(
        bus.js, replicas=s.replicas, kv_max_bytes=s.kv_max_bytes, blob_max_bytes=s.blob_max_bytes
    )
    return [Provisioned(name, action) for name, action in [*streams, *stores]]
