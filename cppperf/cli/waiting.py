"""What a job waits for, said in words: the host's timing cores (who holds each, since when, who
queues behind) and the jobs claimed on the bus. Pure over a `LeaseView` and the live claims, so
`status`, `mine`'s live view and the tests share one wording."""

from __future__ import annotations

import time
from typing import Any

from cppperf.shared.engine.leases import Holder, LeaseView


def _ago(since: float, now: float) -> str:
    s = max(0, int(now - since))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _when(since: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(since))


def _who(h: Holder) -> str:
    return f"pid {h.pid} on {h.host}"


def describe(
    view: LeaseView, claims: list[dict[str, Any]], now: float, *, bus_lost_since: float | None = None
) -> list[str]:
    """One line per held core, per waiter (in the order they will be served) and per claimed job,
    after a line for a lost bus connection; a single line when nothing is held or waiting."""
    bus = (
        [
            f"bus: connection lost since {_when(bus_lost_since)} ({_ago(bus_lost_since, now)}); reconnecting, work is kept"
        ]
        if bus_lost_since is not None
        else []
    )
    lines = [
        f"timing core {h.core}: held by {_who(h)} since {_when(h.since)} ({_ago(h.since, now)})"
        for h in view.holders
    ]
    for place, w in enumerate(view.waiting, 1):
        kind = "evaluation" if w.priority == 0 else "proof" if w.priority == 1 else f"priority {w.priority}"
        lines.append(
            f"waiting for a timing core #{place}: {_who(w)} ({kind}) since {_when(w.since)} ({_ago(w.since, now)})"
        )
    lines.extend(
        f"claimed {c['key']}: by {c['holder']} since {_when(c['since'])} ({_ago(c['since'], now)})"
        for c in claims
    )
    if not lines:
        lines.append(f"nothing holds or waits for a timing core ({view.directory}); no job is claimed")
    return bus + lines


def as_json(view: LeaseView, claims: list[dict[str, Any]]) -> dict[str, Any]:
    return {**view.as_dict(), "claims": claims}
