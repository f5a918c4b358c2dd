"""`validate`: gold validation — can each instance grade agents (services/evaluator/gold.py)?

Without a bus it runs here, on OUT/instances. With one (`--nats-url`) it asks the evaluator service:
one `validate.requested` per instance, then waits for each instance's `oracle` to appear in the
`instances` bucket (the evaluator's result is the instance's state, not a message), with progress;
a request the evaluator dead-lettered is reported with its reason instead of waited for.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress
from rich.table import Table

from cppperf.cli.common import (
    EXIT_FAILURES,
    AsJson,
    Config,
    NatsUrl,
    OutDir,
    Runs,
    _fail,
    _settings,
    app,
    cli_nats,
    console,
    out,
    print_json,
    run_async,
)
from cppperf.shared.domain import Verdict, to_json_dict
from cppperf.shared.errors import CppPerfError

POLL_SECONDS = 1.0


async def _checked_ids(ctx: Any, ids: list[str] | None) -> dict[str, str]:
    """The instances to validate (default: every improved one in the bucket), each with its
    value's `updated_at` now; one clear error for an unknown or unproven id."""
    from cppperf.shared.buckets import INSTANCES
    from cppperf.shared.domain import Verdict

    if not ids:
        rows = await ctx.store.all(INSTANCES.name)
        ids = sorted(str(r["id"]) for r in rows if r.get("verdict") == Verdict.IMPROVED)
        if not ids:
            raise CppPerfError("no proven (improved) instance in the bus's instances bucket")
    before: dict[str, str] = {}
    for iid in ids:
        raw = await ctx.store.get(INSTANCES.name, iid) or {}
        if not (raw.get("record") or raw.get("record_ref")):
            raise CppPerfError(f"unknown instance {iid!r}: not in the bus's instances bucket")
        if raw.get("verdict") != Verdict.IMPROVED:
            raise CppPerfError(f"instance {iid} is {raw.get('verdict')}, not improved: nothing to validate")
        before[iid] = str(raw.get("updated_at") or "")
    return before


async def _finished(ctx: Any, iid: str, *, since: str | None) -> dict[str, Any] | None:
    """The stored validation of `iid`, once it has an oracle (written after `since`, when given)."""
    from cppperf.services.evaluator.gold import stored_validation
    from cppperf.shared.buckets import INSTANCES
    from cppperf.shared.store import instance_record

    raw = await ctx.store.get(INSTANCES.name, iid) or {}
    if not raw.get("oracle") or (since is not None and str(raw.get("updated_at") or "") == since):
        return None
    record = await instance_record(ctx.store, iid)
    block = None if record is None else stored_validation(record)
    return None if block is None else to_json_dict(block)


async def request_validations(
    ctx: Any, ids: list[str] | None, *, force: bool, wait_seconds: float, progress: Progress | None = None
) -> dict[str, dict[str, Any]]:
    """Publish `validate.requested` for `ids` (default: every improved instance in the bucket) and
    wait until each has its oracle or a dead letter; the validations by id (a dead-lettered
    request: `{"error": reason, ...}`). Without `force` an instance validated already is answered
    by the evaluator at once (it does not run again)."""
    from cppperf.shared import messages as m

    before = await _checked_ids(ctx, ids)
    asked: dict[str, str] = {}  # instance -> the request's id (its dead letter's msg_id)
    for iid in before:
        req = m.ValidateRequested(instance_id=iid, force=force, request_id=uuid.uuid4().hex if force else "")
        await ctx.bus.publish(m.VALIDATE_REQUESTED, req)
        asked[iid] = req.id
    task = progress.add_task("gold validation (evaluator service)", total=len(asked)) if progress else None
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + wait_seconds if wait_seconds > 0 else None
    while True:
        for iid in asked.keys() - done.keys():
            if (block := await _finished(ctx, iid, since=before[iid] if force else None)) is not None:
                done[iid] = block
        letters = {d.letter.msg_id: d.letter.error for d in await ctx.bus.dead_letters(m.VALIDATE_REQUESTED)}
        for iid in asked.keys() - done.keys():
            if asked[iid] in letters:
                done[iid] = {"error": letters[asked[iid]], "oracle": "none", "can_grade": False}
        if progress is not None and task is not None:
            progress.update(task, completed=len(done))
        if len(done) == len(asked):
            return {iid: done[iid] for iid in asked}
        if deadline is not None and time.monotonic() > deadline:
            left = ", ".join(sorted(asked.keys() - done.keys()))
            raise CppPerfError(
                f"no validation after {wait_seconds:.0f} s for {left} (is `cppperf serve evaluator` "
                "running?); the requests stay queued"
            )
        await asyncio.sleep(POLL_SECONDS)


@app.command()
def validate(
    ids: Annotated[
        list[str] | None, typer.Argument(help="instance ids (default: every proven instance)")
    ] = None,
    runs: Runs = None,
    force: Annotated[bool, typer.Option("--force", help="re-evaluate even when reports exist")] = False,
    nats_url: NatsUrl = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0.0, help="with a bus: seconds to wait for the evaluator (0: no limit)"
        ),
    ] = 0.0,
    creds: Annotated[
        Path | None,
        typer.Option(
            "--creds",
            envvar="CPPPERF_BUS_CREDS",
            help="with --nats-url on a secured bus: the admin's creds file (agents may not ask)",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    out_dir: OutDir = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """Run each instance's expert patch through the evaluator (it must score opt) and a comment-only
    patch (it must not); record the instance's `oracle` (ctest | benchmark | both | none). Exit 1 when any has none.
    With --nats-url the evaluator service does it (`validate.requested`) and this waits.

    \b
    Example:
      cppperf validate local__demo-4bda4860cd0d
      cppperf validate --nats-url nats://nats-1:4222 --creds admin.creds
    """
    s = _settings(
        config,
        out_dir=str(out_dir) if out_dir else None,
        evaluator__runs=runs,
        nats_url=nats_url,
        bus__creds=str(creds) if creds else None,
    )
    if s.nats_url:
        results = _over_the_bus(s, ids, force=force, timeout=timeout, quiet=as_json)
    else:
        results = _here(s, ids, force=force)
    graded = sum(bool(v.get("can_grade")) for v in results.values())
    if as_json:
        print_json({"instances": results, "can_grade": graded, "total": len(results)})
    else:
        t = Table(title="gold validation")
        for c in ("instance", "expert patch", "null patch", "oracle"):
            t.add_column(c)
        for iid, v in results.items():
            if "error" in v:
                t.add_row(iid, f"refused: {v['error']}", "-", str(v["oracle"]))
                continue
            gold, null = v["gold"], v["null"]
            t.add_row(iid, str(gold.get("verdict")), str(null.get("verdict", "-")), str(v["oracle"]))
        out.print(t)
        out.print(f"{graded} of {len(results)} instance(s) can grade agents")
    if graded < len(results):
        raise typer.Exit(EXIT_FAILURES)


def _here(s: Any, ids: list[str] | None, *, force: bool) -> dict[str, dict[str, Any]]:
    from cppperf.dataset.records import iter_records
    from cppperf.services.evaluator.gold import validate_stored

    if not ids:
        ids = [
            r.cppperf.instance_id
            for r in iter_records(Path(s.out_dir))
            if r.cppperf.verdict == Verdict.IMPROVED
        ]
        if not ids:
            raise _fail(f"no proven (improved) instance in {Path(s.out_dir) / 'instances'}")
    try:
        return {iid: to_json_dict(validate_stored(iid, s, force=force)) for iid in ids}
    except CppPerfError as exc:
        raise _fail(exc) from exc


def _over_the_bus(
    s: Any, ids: list[str] | None, *, force: bool, timeout: float, quiet: bool
) -> dict[str, dict[str, Any]]:
    from cppperf.runtime import connect

    async def main(url: str) -> dict[str, dict[str, Any]]:
        async with connect(s, url) as ctx:
            if quiet:
                return await request_validations(ctx, ids, force=force, wait_seconds=timeout)
            with Progress(console=console, transient=True) as progress:
                return await request_validations(
                    ctx, ids, force=force, wait_seconds=timeout, progress=progress
                )

    with cli_nats(s) as url:
        try:
            return run_async(main(url), waiting_for="the validations (they stay queued)")
        except CppPerfError as exc:
            raise _fail(exc) from None
