"""An agent's evaluations forgotten (`cppperf agents forget AGENT [--run RUN]`), by the operator.

Every evaluation an agent asks for is kept for good: a key `<agent>.<run>/<model>/<instance>` of
the shared `evaluations` bucket (its report inline or an object of the object store) and a folder
`runs/<agent>.<run>/` on the evaluator that ran it. The keys count against the agent's cap
(`evaluator.agent_max_evaluations`, `gateway.over_quota`) and fill the bucket every agent and the
services write. Forgetting removes, for the agent (or one of its runs): each key with every
revision and marker (`Store.forget`: a deleted key's marker would still count), its report
object, and — given the evaluator's runs directory — its run folders there. Only what the
records say is the agent's (`EvaluationState.agent`): an operator's run `<agent>.<x>` shares the
prefix and is kept. An evaluation still running, or still queued, is recorded again when it ends:
forget a finished run, or a revoked agent's once its queue is empty.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from cppperf.services.evaluator.pipeline import safe_name
from cppperf.shared.buckets import EVALUATIONS
from cppperf.shared.errors import CppPerfError
from cppperf.shared.logging import get_logger
from cppperf.shared.messages import agent_run, check_agent, check_run_id, run_prefix
from cppperf.shared.store import Store

log = get_logger(__name__)


@dataclass(frozen=True)
class Forgotten:
    records: int  # keys of `evaluations` removed (markers of removed keys among them)
    reports: int  # report objects removed
    folders: list[str]  # run folders removed
    kept: int = 0  # keys under the agent's name that its records say are not its (an operator's run)


def check_names(agent: str, run: str | None) -> None:
    """BadInput unless `agent` is an agent's name and `run` a run id (nothing else is asked)."""
    check_agent(agent)
    if run is not None:
        check_run_id(run)


async def forget_records(store: Store, agent: str, run: str | None = None) -> tuple[Forgotten, set[str]]:
    """Remove `agent`'s evaluation records (of `run` only, when given) and their report objects;
    also the run folders (names) of the records kept. A key is the agent's when its record says
    so (`agent`): an operator's own run named `<agent>.<x>` (a run id may hold dots) shares the
    key prefix and is kept; a delete marker (no record) goes. Each key is purged up to the
    revision read, so a record an evaluation writes meanwhile stays, with its object; an object
    is removed only after its record."""
    check_names(agent, run)
    prefix = run_prefix(agent_run(agent, run)) if run is not None else None
    records = reports = kept = 0
    keep: set[str] = set()
    for eid in await store.ids(EVALUATIONS.name, under=agent, removed=True):
        if prefix is not None and not eid.startswith(prefix):
            continue
        found = await store.last(EVALUATIONS.name, eid)
        if found is None:  # gone meanwhile
            continue
        value, revision = found
        if value is not None and value.get("agent") != agent:
            log.warning("forget_kept_not_the_agents", agent=agent, evaluation=eid)
            kept += 1
            run_id = value.get("run_id")
            keep.add(safe_name(agent_run(str(value.get("agent") or ""), str(run_id or ""))))
            continue
        await store.forget(EVALUATIONS.name, eid, through=revision)
        records += 1
        if value is not None and isinstance(ref := value.get("report_ref"), str) and ref:
            await store.delete_blob(ref)
            reports += 1
    log.info("evaluations_forgotten", agent=agent, run=run or "", records=records, reports=reports, kept=kept)
    return Forgotten(records, reports, [], kept), keep


def forget_folders(runs_dir: Path, agent: str, run: str | None = None, keep: Iterable[str] = ()) -> list[str]:
    """Remove `agent`'s run folders under the evaluator's runs directory (of `run` only, when
    given): their names. A folder is the agent's when it is `safe_name(<agent>.<run>)` — the
    agent's name, a dot, the rest (no other agent's starts so: names have no dot) — except those
    in `keep` (an operator's run `<agent>.<x>`, as its records say). Every evaluator host runs
    this for its own folders: the records may be gone already (forgotten from another host)."""
    check_names(agent, run)
    if not runs_dir.is_dir():
        return []
    wanted = safe_name(agent_run(agent, run)) if run is not None else None
    kept = set(keep)
    gone: list[str] = []
    for folder in sorted(runs_dir.iterdir()):
        name = folder.name
        mine = name == wanted if wanted is not None else name.startswith(f"{agent}.")
        if not mine or name in kept:
            continue
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        else:
            folder.unlink()
        gone.append(name)
    return gone


async def forget(store: Store, agent: str, run: str | None = None, runs_dir: Path | None = None) -> Forgotten:
    """`agent`'s evaluations (of `run` only, when given) forgotten on the bus and, with `runs_dir`,
    on this evaluator's disk. A folder that cannot be removed says so with what was removed
    already (CppPerfError)."""
    done, keep = await forget_records(store, agent, run)
    if runs_dir is None:
        return done
    try:
        folders = forget_folders(runs_dir, agent, run, keep)
    except OSError as exc:
        raise CppPerfError(
            f"{done.records} evaluation record(s) and {done.reports} report object(s) removed; "
            f"a run folder under {runs_dir} not: {exc.strerror or exc}"
        ) from None
    return replace(done, folders=folders)
