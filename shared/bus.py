"""Streams, durable pull consumers, publishing with dedup ids, and the dead-letter queue.

Topology (docs/design.md): every input subject is a JetStream *work queue* stream consumed by one
durable pull consumer per service, so N replicas of a service share the work. Output subjects
(`patch.built`, `eval.completed`) and `dlq.>` are limits-retention streams that anyone may read.
Provisioning is idempotent: running it twice changes nothing. Services own their consumers'
configuration (`provision(owner=True)` applies it, logging what changed); read-only commands
(`status`, `dlq list`) never create or change a consumer or a stream's settings
(`provision(owner=False)` only creates missing streams), and report a mismatch in a log line.
A publish to a stream that has gone missing re-creates the streams once (`stream_reprovisioned`).
On a bus only the admin provisions (`BusSettings.self_provisioning` false: a secured bus) nothing
here creates or updates a stream: a missing one is `NotProvisioned` (shared/provision.py,
`cppperf bus provision`); services still create their durable consumers.

Limits (README "Who can do what on the bus"): every stream has `max_bytes`/`max_msgs`. Work queues
and the DLQ never age out and refuse new messages when full (`discard: new`): the publisher gets an
error and retries (a service naks its own message), so pipeline work is never dropped silently;
their messages cannot be purged. The announcement streams (`patch.built`, `eval.completed`) drop
their oldest messages past `output_max_age` (the records live in the KV buckets).
`eval.requested` and `eval.completed` carry the agent as the last subject token
(`eval.requested.<agent>`), which is how the evaluator counts an agent's pending requests and
serves agents in turn (one consumer per agent, shared/fair.py).

Dead letters always fit: a payload over `dlq_inline_limit` goes to the object store and the
letter keeps its reference, size, SHA-256 and first bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import ConnectionReconnectingError, NoRespondersError
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

from cppperf.shared import messages as m
from cppperf.shared.errors import BadInput, NotProvisioned
from cppperf.shared.logging import get_logger, register_url, safe_url
from cppperf.shared.settings import BusSettings
from cppperf.shared.store import NOT_PROVISIONED, Action, open_blobs

log = get_logger(__name__)


class TolerantClient(NatsClient):
    """nats-py's client, but a message whose header block or subject does not parse is not fatal.

    nats-py decodes a message's subject, reply and header status line as UTF-8 inside its read
    loop, and that loop stops at the first exception (logged, never restarted) while the
    connection still looks connected: everything after it is never read. Agents' bytes reach the
    evaluator's API connection (`evaluator-api`) as they were sent: one request from one agent
    with a header line `NATS/1.0 \\xff` (or, while agents could publish `eval.api.<name>.*`, a
    verb of non-UTF-8 bytes) left every agent unanswered until the connection was replaced
    (README: "How an agent's request is made safe"). Here a header block that does not parse is
    no headers, a subject that is not UTF-8 is decoded with replacement characters (so the
    gateway refuses it by name), and a reply subject that is not UTF-8 drops the message (no one
    could be answered on it)."""

    @property
    def reading(self) -> bool:
        """Whether the read loop runs (it ends, for good, at an exception it does not expect;
        while reconnecting it is replaced)."""
        task = self._reading_task
        return task is not None and not task.done()

    async def _process_headers(self, headers: bytes) -> dict[str, str] | None:
        try:
            return await super()._process_headers(headers)
        except Exception as exc:  # any parse failure: the message keeps no headers
            log.warning("nats_bad_headers", error=str(exc) or type(exc).__name__, size=len(headers or b""))
            return None

    def _build_message(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: dict[str, str] | None
    ) -> Msg | None:
        try:
            reply_text = reply.decode()
        except UnicodeDecodeError:
            log.warning("nats_bad_reply_subject", subject=subject.decode(errors="replace")[:200])
            return None
        return self.msg_class(
            subject=subject.decode(errors="replace"),
            reply=reply_text,
            data=data,
            headers=headers,
            _client=self,
            _sid=sid,
        )


async def tolerant_connect(servers: str | list[str], **options: Any) -> NatsClient:
    """`nats.connect` with a `TolerantClient` (every `Bus.connect`: the evaluator's API connection,
    the only one agents' bytes reach, and the services' and the CLI's own)."""
    nc = TolerantClient()
    await nc.connect(servers, **options)
    return nc


@dataclass(frozen=True)
class WorkQueue:
    subject: str
    stream: str
    durable: str  # the consuming service's durable consumer name
    per_agent: bool = False  # also carries `<subject>.<agent>`

    @property
    def subjects(self) -> list[str]:
        return [self.subject, self.subject + ".>"] if self.per_agent else [self.subject]

    def agent_subject(self, agent: str | None) -> str:
        """What one consumer takes: `<subject>.<agent>`, or the bare subject for `None`."""
        return self.subject if agent is None else f"{self.subject}.{agent}"

    def waiting(self, counts: Mapping[str, int]) -> list[str | None]:
        """The queues holding messages, from the stream's per-subject counts: the bare subject
        (None) and each `<subject>.<agent>` whose agent is a valid name (others: never served)."""
        keys: list[str | None] = []
        for subject, count in counts.items():
            agent = subject.removeprefix(self.subject + ".")
            if count <= 0:
                continue
            if subject == self.subject:
                keys.append(None)
            elif agent != subject and m.AGENT_NAME.fullmatch(agent):
                keys.append(agent)
        return keys

    def agent_durable(self, agent: str | None) -> str:
        """`evaluator` for the bare subject, `evaluator-<agent>` for an agent's own queue (agent
        names are one subject token without dots: a valid durable name)."""
        return self.durable if agent is None else f"{self.durable}-{agent}"


WORK_QUEUES: dict[str, WorkQueue] = {
    q.subject: q
    for q in [
        WorkQueue(m.REPO_CANDIDATE, "REPO_CANDIDATE", "builder-validate"),
        WorkQueue(m.REPO_FOUND, "REPO_FOUND", "filter"),
        WorkQueue(m.COMMIT_SELECTED, "COMMIT_SELECTED", "classifier"),
        WorkQueue(m.COMMIT_CLASSIFIED, "COMMIT_CLASSIFIED", "builder"),
        WorkQueue(m.EVAL_REQUESTED, "EVAL_REQUESTED", "evaluator", per_agent=True),
        WorkQueue(m.VALIDATE_REQUESTED, "VALIDATE_REQUESTED", "evaluator-validate"),
    ]
}
OUTPUT_STREAMS: dict[str, str] = {m.PATCH_BUILT: "PATCH_BUILT", m.EVAL_COMPLETED: "EVAL_COMPLETED"}
PER_AGENT_OUTPUTS = frozenset({m.EVAL_COMPLETED})
DLQ_STREAM = "DLQ"
PIPELINE_ORDER = [
    m.REPO_CANDIDATE,
    m.REPO_FOUND,
    m.COMMIT_SELECTED,
    m.COMMIT_CLASSIFIED,
    m.VALIDATE_REQUESTED,
    m.EVAL_REQUESTED,
]


def owning_service(q: WorkQueue) -> str:
    """The service that consumes a work queue (`builder-validate` belongs to `builder`)."""
    return q.durable.split("-", 1)[0]


def servers(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` (a cluster's seed list) as a list."""
    return [u.strip() for u in url.split(",") if u.strip()]


def output_subjects(subject: str) -> list[str]:
    return [subject, subject + ".>"] if subject in PER_AGENT_OUTPUTS else [subject]


def stream_for(subject: str) -> str:
    if subject in WORK_QUEUES:
        return WORK_QUEUES[subject].stream
    if subject in OUTPUT_STREAMS:
        return OUTPUT_STREAMS[subject]
    base = subject.rsplit(".", 1)[0]
    if base in WORK_QUEUES and WORK_QUEUES[base].per_agent:
        return WORK_QUEUES[base].stream
    if base in PER_AGENT_OUTPUTS:
        return OUTPUT_STREAMS[base]
    if subject.startswith(m.DLQ_PREFIX):
        return DLQ_STREAM
    raise KeyError(f"no stream carries subject {subject!r}")


def consumer_config(q: WorkQueue, settings: BusSettings, agent: str | None = None) -> js_api.ConsumerConfig:
    # No delivery limit on the server: the handler counts deliveries and moves a message into the
    # DLQ at `max_deliver` (also one whose earlier attempts crashed the process). A message whose
    # dead letter could not be written is nak'ed and comes back, instead of staying pending forever.
    # A per-agent queue has one consumer per agent (`<subject>.<agent>`) beside the bare subject's:
    # their filters never overlap, which a work-queue stream requires (shared/fair.py).
    return js_api.ConsumerConfig(
        durable_name=q.agent_durable(agent),
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=settings.ack_wait,
        max_deliver=-1,
        max_ack_pending=settings.max_ack_pending,
        filter_subject=q.agent_subject(agent),
        deliver_policy=js_api.DeliverPolicy.ALL,
    )


# what a JetStream call raises while the server is away and nats-py reconnects (its timeouts are
# TimeoutErrors); a caller that waits through an outage catches these unless `nc.is_closed`
AWAY_ERRORS: Final = (TimeoutError, ConnectionReconnectingError)
# what JetStream answers while it cannot serve yet: no answer, or 503 (no meta leader, a new R=3
# stream or bucket still electing its leader)
NOT_READY_ERRORS: Final = (*AWAY_ERRORS, ServiceUnavailableError)
T = TypeVar("T")


async def until_ready(call: Callable[[], Awaitable[T]], bus: Bus, *, wait: float) -> T:
    """`call()` again every `wait` s while JetStream is not ready (a service's start on a cluster
    still forming), one `jetstream_not_ready` line per attempt."""
    while True:
        try:
            return await call()
        except NOT_READY_ERRORS as exc:
            if bus.nc.is_closed:
                raise
            log.warning("jetstream_not_ready", error=type(exc).__name__, retry_in=wait)
            await asyncio.sleep(wait)


class Bus:
    """A nats-py connection with JetStream, plus the project's publishing conventions."""

    def __init__(self, nc: NatsClient, js: JetStreamContext, settings: BusSettings, *, url: str = "") -> None:
        self.nc = nc
        self.url = url  # what it connected to (a service's second connection dials the same)
        self.js = js
        self.settings = settings
        # creates/updates streams itself (the embedded/open bus; `cppperf bus provision`), or
        # only checks that they exist (a secured bus: `BusSettings.self_provisioning`)
        self.provisioning = settings.self_provisioning
        # when the connection was lost (None: connected); the live view and `wait_drained` say so
        self.lost_since: float | None = None

    @classmethod
    async def connect(cls, url: str, settings: BusSettings, *, name: str = "cppperf") -> Bus:
        """Connect (with `settings.creds`, an NKey seed file, when set) and retry forever on loss."""

        lost: list[Bus] = []  # the Bus, once made: the callbacks mark it lost and found

        async def disconnected() -> None:
            if nc.is_closed or nc.is_draining:
                return  # our own close (every command's exit), not a lost connection
            for bus in lost:
                bus.lost_since = bus.lost_since or time.time()
            log.warning("nats_disconnected", connection=name)

        async def reconnected() -> None:
            for bus in lost:
                bus.lost_since = None
            log.info(
                "nats_reconnected",
                connection=name,
                server=safe_url(nc.connected_url.geturl()) if nc.connected_url else "",
            )

        told: list[bool] = []

        async def error(exc: Exception) -> None:
            if not lost and not told:  # still connecting: say once that it waits (it retries forever)
                told.append(True)
                log.warning("nats_waiting_for_server", connection=name, server=safe_url(url))
            log.debug("nats_error", connection=name, error=str(exc) or type(exc).__name__)

        register_url(url)
        nc = await tolerant_connect(
            servers(url),
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=settings.reconnect_wait,
            connect_timeout=5,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            error_cb=error,
            **credential_options(settings.creds, settings.nkey_seed),
        )
        made = cls(nc, nc.jetstream(timeout=10), settings, url=url)
        lost.append(made)
        return made

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()
        if not self.nc.is_closed:  # drain refused (reconnecting: a flood just cut it) or timed out
            with contextlib.suppress(Exception):
                await self.nc.close()

    # ------------------------------------------------------------------ provisioning
    async def provision(
        self, *, owner: bool = True, services: list[str] | None = None
    ) -> list[tuple[str, Action]]:
        """Declare every stream and durable consumer; a no-op when they already match. Returns
        what happened to each stream (`created`, `updated`, `unchanged`).

        `owner=True`: the consumers of `services` (all when None) get these settings; other
        missing consumers are created, existing ones left alone. `owner=False` (read-only
        commands): create missing streams only; never create, change or delete a consumer, never
        update a stream; a consumer differing from these settings is reported in a log line."""
        s = self.settings
        done: list[tuple[str, Action]] = []
        for q in WORK_QUEUES.values():
            action = await self._ensure_stream(
                js_api.StreamConfig(
                    name=q.stream,
                    subjects=q.subjects,
                    retention=js_api.RetentionPolicy.WORK_QUEUE,
                    storage=js_api.StorageType.FILE,
                    duplicate_window=s.duplicate_window,
                    num_replicas=s.replicas,
                    **_kept_limits(s),
                    deny_delete=True,
                ),
                owner=owner,
            )
            done.append((q.stream, action))
            if owner and (services is None or owning_service(q) in services):
                await self.ensure_consumer(q)
            elif owner:
                await self.ensure_consumer(q, update=False)
            else:
                await self.consumer_mismatch(q)
        return done + await self._provision_outputs(owner=owner)

    async def provision_streams(self) -> None:
        """Re-create missing streams (never touching existing ones or any consumer)."""
        await self.provision(owner=False)

    async def _provision_outputs(self, *, owner: bool) -> list[tuple[str, Action]]:
        s = self.settings
        done: list[tuple[str, Action]] = []
        for subject, stream in OUTPUT_STREAMS.items():
            action = await self._ensure_stream(
                js_api.StreamConfig(
                    name=stream,
                    subjects=output_subjects(subject),
                    retention=js_api.RetentionPolicy.LIMITS,
                    storage=js_api.StorageType.FILE,
                    duplicate_window=s.duplicate_window,
                    num_replicas=s.replicas,
                    max_bytes=s.stream_max_bytes,
                    max_msgs=s.stream_max_msgs,
                    max_age=s.output_max_age,
                    discard=js_api.DiscardPolicy.OLD,
                    deny_purge=True,
                ),
                owner=owner,
            )
            done.append((stream, action))
        action = await self._ensure_stream(
            js_api.StreamConfig(
                name=DLQ_STREAM,
                subjects=[m.DLQ_PREFIX + ">"],
                retention=js_api.RetentionPolicy.LIMITS,
                storage=js_api.StorageType.FILE,
                duplicate_window=s.duplicate_window,
                num_replicas=s.replicas,
                **_kept_limits(s),
            ),
            owner=owner,
        )
        return [*done, (DLQ_STREAM, action)]

    async def _ensure_stream(self, config: js_api.StreamConfig, *, owner: bool = True) -> Action:
        """Create or update one stream. A process that does not provision (a secured bus) only
        checks: a missing stream is `NotProvisioned`, a differing one a log line."""
        assert config.name is not None
        try:
            info = await self.js.stream_info(config.name)
        except NotFoundError:
            if not self.provisioning:
                raise NotProvisioned(f"stream {config.name} is missing: {NOT_PROVISIONED}") from None
            await self.js.add_stream(config)
            return "created"
        current = info.config
        fields = ("subjects", "duplicate_window", "num_replicas", "max_bytes", "max_msgs", "max_age")
        diff = {
            f: (getattr(current, f), getattr(config, f))
            for f in fields
            if getattr(config, f) is not None and getattr(current, f) != getattr(config, f)
        }
        if not (owner and diff):
            return "unchanged"
        if not self.provisioning:
            log.info("stream_config_differs", stream=config.name, live_vs_ours=diff)
            return "unchanged"
        await self.js.update_stream(config)
        return "updated"

    async def ensure_consumer(self, q: WorkQueue, *, update: bool = True, agent: str | None = None) -> bool:
        """The owning service's durable consumer with its settings; True when created now.
        `update=False`: create it when missing, leave an existing one as it is. `agent`: that
        agent's own consumer of a per-agent queue."""
        config = consumer_config(q, self.settings, agent)
        assert config.durable_name is not None
        try:
            info = await self.js.consumer_info(q.stream, config.durable_name)
        except NotFoundError:
            await self.js.add_consumer(q.stream, config)
            return True
        diff = _consumer_diff(info.config, config)
        if diff and update:
            try:
                await self.js.add_consumer(q.stream, config)  # create-or-update on current servers
                log.info(
                    "consumer_config_updated", stream=q.stream, consumer=config.durable_name, changes=diff
                )
            except BadRequestError as exc:
                log.warning(
                    "consumer_config_kept", stream=q.stream, consumer=config.durable_name, error=str(exc)
                )
        return False

    async def consumer_mismatch(self, q: WorkQueue) -> dict[str, tuple[Any, Any]]:
        """How the live consumer differs from these settings (logged, never changed)."""
        try:
            info = await self.js.consumer_info(q.stream, q.durable)
        except NotFoundError:
            return {}
        diff = _consumer_diff(info.config, consumer_config(q, self.settings))
        if diff:
            log.info("consumer_config_differs", stream=q.stream, consumer=q.durable, live_vs_ours=diff)
        return diff

    # ------------------------------------------------------------------ publishing
    async def publish(self, subject: str, msg: msgspec.Struct, *, msg_id: str | None = None) -> bool:
        """Publish with `Nats-Msg-Id` = the message's stable id. Returns False for a duplicate."""
        return await self.publish_raw(subject, m.encode(msg), msg_id=msg_id or m.msg_id(msg))

    async def publish_raw(self, subject: str, payload: bytes, *, msg_id: str | None) -> bool:
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        stream = stream_for(subject)
        try:
            ack = await self.js.publish(subject, payload, stream=stream, headers=headers)
        except (NoRespondersError, NoStreamResponseError, NotFoundError) as exc:
            # No stream took it (deleted, or never created on this node): re-create once, retry.
            log.warning("stream_reprovisioned", stream=stream, error=str(exc) or type(exc).__name__)
            await self.provision_streams()
            ack = await self.js.publish(subject, payload, stream=stream, headers=headers)
        return not ack.duplicate

    async def reply(self, subject: str, msg: msgspec.Struct) -> None:
        """Answer a request's reply subject (core NATS: not persisted, not deduplicated)."""
        await self.nc.publish(subject, m.encode(msg))

    async def dead_letter(
        self,
        subject: str,
        payload: bytes,
        *,
        service: str,
        error: BaseException | str,
        attempts: int,
        msg_id: str | None,
        stream_seq: int | None = None,
    ) -> DeadLetterRecord:
        digest = hashlib.sha256(payload).hexdigest()
        ref: str | None = None
        inline = payload
        if len(payload) > self.settings.dlq_inline_limit:
            ref = f"dlq/{subject}/{stream_seq if stream_seq is not None else 'x'}-{digest[:16]}"
            blobs = await open_blobs(self.js, self.settings.replicas, create=self.provisioning)
            await blobs.put(ref, payload)
            inline = b""
        letter = m.DeadLetter(
            subject=subject,
            service=service,
            error=str(error)[:4000],
            error_type=type(error).__name__ if isinstance(error, BaseException) else "str",
            attempts=attempts,
            payload=inline,
            msg_id=msg_id,
            failed_at=datetime.now(UTC).isoformat(),
            stream_seq=stream_seq,
            payload_ref=ref,
            payload_size=len(payload),
            payload_sha256=digest,
            payload_head=payload[:256].decode(errors="replace"),
        )
        await self.publish(m.dlq_subject(subject), letter)
        return DeadLetterRecord(seq=0, letter=letter)

    async def letter_payload(self, letter: m.DeadLetter) -> bytes:
        """The original payload of a dead letter (from the object store when it was large)."""
        if not letter.payload_ref:
            return letter.payload
        blobs = await open_blobs(self.js, self.settings.replicas, create=self.provisioning)
        res = await blobs.get(letter.payload_ref)
        return bytes(res.data or b"")

    # ------------------------------------------------------------------ dead letters
    async def dead_letters(self, subject: str | None = None) -> list[DeadLetterRecord]:
        """Every dead letter (optionally for one original subject), oldest first."""
        filt = m.dlq_subject(subject) if subject else m.DLQ_PREFIX + ">"
        records: list[DeadLetterRecord] = []
        async for raw in self._read_stream(DLQ_STREAM, filt):
            assert raw.metadata.sequence is not None
            records.append(
                DeadLetterRecord(seq=raw.metadata.sequence.stream, letter=m.decode(raw.data, m.DeadLetter))
            )
        return records

    async def replay(self, subject: str) -> int:
        """Put every dead letter of `subject` back on it, then remove it from the DLQ."""
        count = 0
        for rec in await self.dead_letters(subject):
            # A fresh id: the original is still inside the dedup window and would be dropped.
            replay_id = f"{rec.letter.msg_id or 'noid'}#replay-{rec.seq}"
            await self.publish_raw(subject, await self.letter_payload(rec.letter), msg_id=replay_id)
            await self.js.delete_msg(DLQ_STREAM, rec.seq)
            count += 1
        return count

    async def _read_stream(self, stream: str, filter_subject: str) -> AsyncIterator[Msg]:
        info = await self.js.stream_info(stream)
        if info.state.messages == 0:
            return
        sub = await self.js.pull_subscribe(
            filter_subject,
            stream=stream,
            config=js_api.ConsumerConfig(
                ack_policy=js_api.AckPolicy.NONE,
                deliver_policy=js_api.DeliverPolicy.ALL,
                inactive_threshold=30.0,
            ),
        )
        try:
            while True:
                try:
                    batch = await sub.fetch(256, timeout=0.5)
                except (TimeoutError, nats.errors.TimeoutError):
                    return
                for raw in batch:
                    yield raw
                if len(batch) < 256:
                    pending = (await sub.consumer_info()).num_pending
                    if pending == 0:
                        return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # ------------------------------------------------------------------ status
    async def subject_status(self) -> list[SubjectStatus]:
        dlq_counts: dict[str, int] = {}
        with contextlib.suppress(NotFoundError):
            dlq_info = await self.js.stream_info(DLQ_STREAM, subjects_filter=m.DLQ_PREFIX + ">")
            for subj, n in (dlq_info.state.subjects or {}).items():
                dlq_counts[subj.removeprefix(m.DLQ_PREFIX)] = n
        rows: list[SubjectStatus] = []
        for subject in PIPELINE_ORDER:
            q = WORK_QUEUES[subject]
            try:
                sinfo = await self.js.stream_info(q.stream)
            except NotFoundError:
                continue
            try:
                cinfo = await self.js.consumer_info(q.stream, q.durable)
                consumer, in_flight = q.durable, cinfo.num_ack_pending or 0
            except NotFoundError:  # its service has not started yet
                consumer, in_flight = f"{q.durable} (none yet)", 0
            if q.per_agent:
                in_flight += await self._agents_in_flight(q)
            dead = dlq_counts.get(subject, 0)
            remaining = sinfo.state.messages
            total = sinfo.state.last_seq
            rows.append(
                SubjectStatus(
                    subject=subject,
                    consumer=consumer,
                    published=total,
                    pending=max(remaining - in_flight, 0),
                    in_flight=in_flight,
                    done=max(total - remaining - dead, 0),
                    dead_lettered=dead,
                )
            )
        for subject, stream in OUTPUT_STREAMS.items():
            try:
                sinfo = await self.js.stream_info(stream)
            except NotFoundError:
                continue
            rows.append(
                SubjectStatus(
                    subject=subject,
                    consumer="",
                    published=sinfo.state.last_seq,
                    pending=0,
                    in_flight=0,
                    done=sinfo.state.messages,
                    dead_lettered=dlq_counts.get(subject, 0),
                )
            )
        return rows

    async def _agents_in_flight(self, q: WorkQueue) -> int:
        """Messages the per-agent consumers (`<durable>-<agent>`) hold, for agents with work queued."""
        total = 0
        for agent in q.waiting(await self.subject_counts(q)):
            if agent is not None:
                with contextlib.suppress(NotFoundError):
                    total += (
                        await self.js.consumer_info(q.stream, q.agent_durable(agent))
                    ).num_ack_pending or 0
        return total

    async def subject_counts(self, q: WorkQueue) -> dict[str, int]:
        """Messages per subject of the queue's stream (queued or being handled, not yet acked)."""
        info = await self.js.stream_info(q.stream, subjects_filter=">")
        return {str(k): int(v) for k, v in (info.state.subjects or {}).items()}

    async def drained(self) -> bool:
        """True when no work-queue message is pending or in flight."""
        for row in await self.subject_status():
            if row.subject in WORK_QUEUES and (row.pending or row.in_flight):
                return False
        return True


def _kept_limits(s: BusSettings) -> dict[str, Any]:
    """Limits of a stream whose messages are pipeline work: bounded, never aged out, never
    purged, and full means the next publish is refused (the publisher sees it and retries)."""
    return {
        "max_bytes": s.stream_max_bytes,
        "max_msgs": s.stream_max_msgs,
        "discard": js_api.DiscardPolicy.NEW,
        "deny_purge": True,
    }


def read_creds(path: str) -> tuple[str, str]:
    """(name, NKey seed) from a creds file written by `cppperf agents add` / `agents service-keys`:
    `name: <name>` and `seed: SU…` lines (comments start with #)."""
    fields: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"credentials file {path}: {exc.strerror or exc}") from None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.lstrip().startswith("#"):
            fields[key.strip()] = value.strip()
    if not fields.get("seed", "").startswith("SU"):
        raise BadInput(f"credentials file {path}: no `seed: SU…` line (an NKey user seed)")
    return fields.get("name", ""), fields["seed"]


def credential_options(creds: str, nkey_seed: str = "") -> dict[str, Any]:
    """nats-py connect options for a creds file (or a bare service seed): the seed signs the
    server's nonce (the secret never crosses the wire); an agent's replies come on
    `_INBOX_<name>.>`, the only inbox its permissions let it read."""
    if not creds:
        return {"nkeys_seed_str": nkey_seed} if nkey_seed else {}
    name, seed = read_creds(creds)
    opts: dict[str, Any] = {"nkeys_seed_str": seed}
    if name.startswith("agent-"):
        opts["inbox_prefix"] = agent_inbox(name.removeprefix("agent-"))
    return opts


def agent_inbox(agent: str) -> str:
    return f"_INBOX_{agent}"


def _consumer_diff(live: js_api.ConsumerConfig, ours: js_api.ConsumerConfig) -> dict[str, tuple[Any, Any]]:
    fields = ("ack_wait", "max_deliver", "max_ack_pending", "filter_subject")
    return {f: (getattr(live, f), getattr(ours, f)) for f in fields if getattr(live, f) != getattr(ours, f)}


@dataclass(frozen=True)
class DeadLetterRecord:
    seq: int
    letter: m.DeadLetter


@dataclass(frozen=True)
class SubjectStatus:
    subject: str
    consumer: str
    published: int
    pending: int
    in_flight: int
    done: int
    dead_lettered: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def wait_drained(
    bus: Bus,
    *,
    poll: float = 0.2,
    settle: int = 3,
    timeout: float | None = None,  # noqa: ASYNC109
) -> None:
    """Wait until every work queue is empty for `settle` consecutive polls."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    quiet = 0
    while quiet < settle:
        try:
            quiet = quiet + 1 if await bus.drained() else 0
        except NOT_READY_ERRORS:
            if bus.nc.is_closed:
                raise
            quiet = 0  # the server is away (nats-py reconnects) or JetStream electing: the work is kept
        if deadline is not None and loop.time() > deadline:
            raise TimeoutError("pipeline did not drain in time")
        await asyncio.sleep(poll)
