"""Leases in the `claims` KV bucket: exactly one holder of a job at a time across replicas, and
per-process workspaces that survive only as long as their process.

A claim is a record `{holder, expires_at}` created or taken over by compare-and-set on the KV
revision, so two replicas racing for one key cannot both win. The holder renews it every
`lease / 3` seconds while it works; if the holder dies, the lease runs out and the next claimant
takes it over (with a `claim_taken_over` log line). Time is wall-clock seconds: hosts' clocks
must agree to well within a lease (NTP), which leases of a minute or more tolerate.

Each process has one token (`host-pid-random`) and a worker lease `worker/<token>` renewed the
same way; its attempts' workspaces live under `<work>/attempts/<token>/`. A process owns its
workspace (`own_workspace`): an exclusive flock on `<ws>/.lock` held for its lifetime and
`<ws>/.owner.json` naming the state folder (the run) it belongs to, its pid and since when. On
start a service removes another token's workspace only when it provably belongs to the same run
and is dead: its owner file names our state folder, nobody holds its lock, and its worker lease
(in our store) has expired. A work dir shared by runs with different output folders (or a
workspace without an owner file) is therefore never cleaned by a stranger.

`KvClaims` is all of this as the `Claims` port (shared/ports.py) that the builder's `register`
receives; handler unit tests use the in-memory one in tests/fakes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cppperf.shared.buckets import CLAIMS
from cppperf.shared.errors import TransientError
from cppperf.shared.logging import get_logger
from cppperf.shared.store import Store
from cppperf.shared.tasks import sleep_unless, stop_task

log = get_logger(__name__)

BUCKET: Final = CLAIMS
ATTEMPTS_DIR: Final = "attempts"
TOKEN: Final = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class ClaimLost(TransientError):
    """Our lease on a job ran out or was taken over: the result must not be recorded."""


@dataclass
class Claim:
    store: Store
    key: str
    holder: str
    lease: float
    lost: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    def check(self) -> None:
        if self.lost:
            raise ClaimLost(f"claim {self.key} was lost by {self.holder}")


def _live(rec: dict[str, Any] | None, now: float) -> bool:
    return rec is not None and float(rec.get("expires_at", 0)) > now


async def try_claim(store: Store, key: str, *, holder: str, lease: float) -> str | None:
    """Take `key` for `holder`. Returns None on success, else the current live holder."""
    other: list[str] = []
    taken_from: list[str] = []

    def change(cur: dict[str, Any] | None) -> dict[str, Any] | None:
        other.clear()
        taken_from.clear()
        now = time.time()
        if cur is not None and cur.get("holder") != holder and _live(cur, now):
            other.append(str(cur.get("holder")))
            return None
        if cur is not None and cur.get("holder") != holder:
            taken_from.append(str(cur.get("holder")))
        return {"holder": holder, "expires_at": now + lease, "since": now}

    await store.modify(BUCKET, key, change)
    if other:
        return other[0]
    if taken_from:
        log.warning("claim_taken_over", key=key, holder=holder, expired_holder=taken_from[0])
    return None


async def live_claims(store: Store) -> list[dict[str, Any]]:
    """The jobs held now (`instance/<id>` …, not the processes' own `worker/` leases): key,
    holder, since and expires_at, oldest first; for `status` and the live view."""
    now = time.time()
    found: list[dict[str, Any]] = []
    for key in await store.ids(BUCKET):
        if key.startswith("worker/"):
            continue
        rec = await store.get(BUCKET, key)
        if rec is not None and _live(rec, now):
            found.append(
                {
                    "key": key,
                    "holder": str(rec.get("holder")),
                    "since": float(rec.get("since", 0.0)),
                    "expires_at": float(rec.get("expires_at", 0.0)),
                }
            )
    return sorted(found, key=lambda c: c["since"])


async def renew(claim: Claim) -> bool:
    """Extend our lease; False (and `claim.lost`) when someone else holds it now."""
    mine: list[bool] = []

    def change(cur: dict[str, Any] | None) -> dict[str, Any] | None:
        mine.clear()
        if cur is None or cur.get("holder") != claim.holder:
            return None
        mine.append(True)
        return {**cur, "expires_at": time.time() + claim.lease}

    await claim.store.modify(BUCKET, claim.key, change)
    if not mine:
        claim.lost = True
    return bool(mine)


async def release(claim: Claim) -> None:
    found = await claim.store.entry(BUCKET, claim.key)
    if found is not None and found[0].get("holder") == claim.holder:
        await claim.store.delete(BUCKET, claim.key, revision=found[1])


async def _keep_renewed(claim: Claim) -> None:
    while not await sleep_unless(claim.stop, claim.lease / 3):
        try:
            if not await renew(claim):
                log.error("claim_lost", key=claim.key, holder=claim.holder)
                return
        except Exception as exc:  # NATS away for a moment: try again next period
            log.warning("claim_renew_failed", key=claim.key, error=str(exc) or type(exc).__name__)


@contextlib.asynccontextmanager
async def held(
    store: Store,
    key: str,
    *,
    holder: str,
    lease: float,
    wait: Callable[[str], Awaitable[None]] | None = None,
    poll: float = 1.0,
) -> AsyncIterator[Claim]:
    """Hold `key` for the block, renewing the lease; released at the end (also on errors).

    While another live holder has it: call `wait(holder)` once (e.g. a log line), then poll
    every `poll` seconds until it is free or its lease ran out."""
    announced = False
    while (other := await try_claim(store, key, holder=holder, lease=lease)) is not None:
        if not announced and wait is not None:
            await wait(other)
        announced = True
        await asyncio.sleep(poll)
    claim = Claim(store, key, holder, lease)
    claim._task = asyncio.create_task(_keep_renewed(claim))
    try:
        yield claim
    finally:
        await stop_task(claim._task, claim.stop)
        with contextlib.suppress(Exception):  # if NATS is away the lease simply runs out
            await release(claim)


# ------------------------------------------------------------------------------ workspaces
def attempts_root(work_dir: Path) -> Path:
    return work_dir / ATTEMPTS_DIR


def workspace_for(work_dir: Path, token: str = TOKEN) -> Path:
    """This process's private work dir: builds of two processes never share a directory."""
    return attempts_root(work_dir) / token


_BACKGROUND: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones


async def worker_lease(store: Store, *, lease: float, token: str = TOKEN) -> asyncio.Task[None]:
    """Announce this process as alive (`worker/<token>`) and keep the lease renewed."""
    if await try_claim(store, f"worker/{token}", holder=token, lease=lease) is not None:
        raise RuntimeError(f"worker token {token} is already held")  # random tokens: cannot happen
    task = asyncio.create_task(_keep_renewed(Claim(store, f"worker/{token}", token, lease)))
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


OWNER_FILE: Final = ".owner.json"
LOCK_FILE: Final = ".lock"
_OWNED: dict[Path, int] = {}  # workspace -> the fd holding its flock (for this process's life)


def own_workspace(work_dir: Path, *, owner: str, token: str = TOKEN) -> Path:
    """Create (once) and lock this process's workspace for the run `owner` (its state folder)."""
    ws = workspace_for(work_dir, token)
    if ws in _OWNED:
        return ws
    ws.mkdir(parents=True, exist_ok=True)
    fd = os.open(ws / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RuntimeError(f"workspace {ws} is locked by another process") from None
    _OWNED[ws] = fd
    info = {"owner": owner, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    (ws / OWNER_FILE).write_text(json.dumps(info))
    return ws


def release_workspace(ws: Path) -> None:
    """Drop the lock on a workspace this process owns (the folder stays until cleaned)."""
    fd = _OWNED.pop(ws, None)
    if fd is not None:
        os.close(fd)


def workspace_owner(ws: Path) -> dict[str, Any] | None:
    """The owner file of a workspace, or None when it has none (or an unreadable one)."""
    try:
        info = json.loads((ws / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _locked_by_someone(ws: Path) -> bool:
    try:
        fd = os.open(ws / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False  # no lock file: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


async def clean_stale_workspaces(
    store: Store, work_dir: Path, *, owner: str, token: str = TOKEN
) -> list[str]:
    """Remove `<work>/attempts/<t>` of every other token `t` whose workspace provably belongs to
    the run `owner`, is not locked by a live process and whose worker lease has expired."""
    root = attempts_root(work_dir)
    if not root.is_dir():
        return []
    removed: list[str] = []
    now = time.time()
    for d in sorted(root.iterdir()):
        if d.name == token or not d.is_dir() or d in _OWNED:
            continue
        info = workspace_owner(d)
        if info is None or info.get("owner") != owner:
            continue  # another run's (or nobody's provably): never ours to remove
        if _locked_by_someone(d) or _live(await store.get(BUCKET, f"worker/{d.name}"), now):
            continue
        await asyncio.to_thread(shutil.rmtree, d, True)
        log.info("stale_workspace_removed", path=str(d), pid=info.get("pid"))
        removed.append(d.name)
    return removed


@dataclass
class KvClaims:
    """The `Claims` port on the `claims` KV bucket of `store`, as the process `token`."""

    store: Store
    token: str = TOKEN
    poll: float = 1.0

    def held(
        self, key: str, *, lease: float, wait: Callable[[str], Awaitable[None]] | None = None
    ) -> contextlib.AbstractAsyncContextManager[Claim]:
        return held(self.store, key, holder=self.token, lease=lease, wait=wait, poll=self.poll)

    async def announce(self, *, lease: float) -> None:
        await worker_lease(self.store, lease=lease, token=self.token)

    def workspace(self, work_dir: Path, *, owner: str) -> Path:
        return own_workspace(work_dir, owner=owner, token=self.token)

    async def clean_stale(self, work_dir: Path, *, owner: str) -> list[str]:
        return await clean_stale_workspaces(self.store, work_dir, owner=owner, token=self.token)

    async def live(self) -> list[dict[str, Any]]:
        return await live_claims(self.store)
