"""An agent's evaluations forgotten (`cppperf agents forget AGENT [--run RUN]`), by the operator.

Every evaluation an agent asks for is kept for good: a key `<agent>.<run>/<model>/<instance>` of
the shared `evaluations` bucket (its report inline or an object of the object store) and a folder
`runs/<agent>.<run>/` on the evaluator that ran it. The keys count against the agent's cap
(`evaluator.agent_max_evaluations`, `gateway.over_quota`) and fill the bucket every agent and the
services write. Forgetting removes, for the agent (or one of its runs): each key with every
revision and marker (`Store.forget`: a deleted key's marker would still count), its report
object, and — given the evaluator's runs directory — its run folders there. An evaluation still
running is recorded again when it ends: forget a finished run, or a revoked agent's.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from cppperf.services.evaluator.pipeline import safe_name
from cppperf.shared.buckets import EVALUATIONS
from cppperf.shared.logging import get_logger
from cppperf.shared.messages import agent_run, check_agent, check_run_id, run_prefix
from cppperf.shared.store import Store

log = get_logger(__name__)


@dataclass(frozen=True)
class Forgotten:
    records: int  # keys of `evaluations` removed (markers of removed keys among them)
    reports: int  # report objects removed
    folders: list[str]  # run folders removed


def check_names(agent: str, run: str | None) -> None:
    """BadInput unless `agent` is an agent's name and `run` a run id (nothing else is asked)."""
    check_agent(agent)
    if run is not None:
        check_run_id(run)


async def forget_records(store: Store, agent: str, run: str | None = None) -> tuple[int, int]:
    """Remove `agent`'s evaluation records (of `run` only, when given) and their report objects:
    how many records, how many objects."""
    check_names(agent, run)
    prefix = run_prefix(agent_run(agent, run)) if run is not None else None
    records = reports = 0
    for eid in await store.ids(EVALUATIONS.name, under=agent, removed=True):
        if prefix is not None and not eid.startswith(prefix):
            continue
        try:
            raw = await store.get(EVALUATIONS.name, eid)
        except ValueError:  # not JSON: no object to find, the key goes all the same
            raw = None
        ref = raw.get("report_ref") if isinstance(raw, dict) else None
        if isinstance(ref, str) and ref:
            await store.delete_blob(ref)
            reports += 1
        await store.forget(EVALUATIONS.name, eid)
        records += 1
    log.info("evaluations_forgotten", agent=agent, run=run or "", records=records, reports=reports)
    return records, reports


def forget_folders(runs: Path, agent: str, run: str | None = None) -> list[str]:
    """Remove `agent`'s run folders under the evaluator's `runs` directory (of `run` only, when
    given): their names. A folder is the agent's when it is `safe_name(<agent>.<run>)` — the
    agent's name, a dot, the rest (an agent's name has no dot, so no other agent's starts so)."""
    check_names(agent, run)
    if not runs.is_dir():
        return []
    wanted = safe_name(agent_run(agent, run)) if run is not None else None
    gone: list[str] = []
    for folder in sorted(runs.iterdir()):
        name = folder.name
        if (name != wanted) if wanted is not None else not name.startswith(f"{agent}."):
            continue
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        else:
            folder.unlink()
        gone.append(name)
    return gone


async def forget(store: Store, agent: str, run: str | None = None, runs: Path | None = None) -> Forgotten:
    """`agent`'s evaluations (of `run` only, when given) forgotten on the bus and, with `runs`,
    on this evaluator's disk."""
    records, reports = await forget_records(store, agent, run)
    folders = forget_folders(runs, agent, run) if runs is not None else []
    return Forgotten(records, reports, folders)
