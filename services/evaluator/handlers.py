"""The evaluator's handler, without a broker: `eval.requested` → evaluate → `eval.completed` (and the
request's reply subject).

State lives in the `evaluations` bucket: a request already evaluated is answered from the stored
report (a redelivery or a re-sent request never re-runs the work but still gets its answer), only
when that report is for the very same patch (its `patch_sha256`); another patch is evaluated. The
patch comes inline or by `patch_ref` from the object store; the instance from the `instances`
bucket (its file under OUT/instances when the bucket has none, e.g. an imported dataset). The
record is written by compare-and-set over the value read before the evaluation: the same request
evaluated twice at once (a redelivery while the first worker still ran) is answered with the
first recorded verdict. A record or report that cannot be read is evaluated again, never a dead
letter the agent does not see.

`validate.requested` → `on_validate`: gold validation (gold.py) of an instance in the `instances`
bucket. Its result is the instance's state, not an announcement: the record (inline or in the
object store) gets `cppperf.validation`/`cppperf.oracle` and the KV value `oracle`, in one
compare-and-set update over the value read before the validation (a rebuild or removal meanwhile
is kept: the request is retried); whoever waits watches that key. A record already validated is not
validated again (a redelivery, a second request) unless the request says `force`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import msgspec
from msgspec import UNSET

from cppperf.services.evaluator import gold
from cppperf.services.evaluator.instances import EvalInstance, from_record
from cppperf.services.evaluator.pipeline import (
    EvalRequest,
    as_json,
    cannot_grade,
    evaluate_report,
    patch_sha256,
    refused_report,
)
from cppperf.shared import messages as m
from cppperf.shared.buckets import EVALUATIONS, INSTANCES
from cppperf.shared.domain import (
    EvalReport,
    EvaluationState,
    EvalVerdict,
    InstanceRecord,
    InstanceState,
    SkippedBenchmark,
    Verdict,
    decode_record,
    record_text,
    to_json_dict,
    to_struct,
)
from cppperf.shared.errors import BadInput, TransientError
from cppperf.shared.files import write_atomic
from cppperf.shared.logging import get_logger
from cppperf.shared.ports import StageContext
from cppperf.shared.settings import Settings
from cppperf.shared.store import instance_record

log = get_logger(__name__)
WORKER = f"{socket.gethostname()}:{os.getpid()}"
Outcome = Literal["answered-from-store", "evaluated"]
ValidateOutcome = Literal["already-validated", "validated"]


class EvaluatorOps(Protocol):
    def evaluate(self, req: EvalRequest, instance: EvalInstance | None) -> EvalReport: ...


class ValidatorOps(Protocol):
    def validate(self, record: InstanceRecord, *, force: bool) -> InstanceRecord:
        """The record gold-validated (with its `cppperf.validation` and `cppperf.oracle`)."""
        ...


@dataclass
class PipelineOps:
    """The real `EvaluatorOps` and `ValidatorOps`: `pipeline.evaluate_report` (checks, three trees,
    builds, timing, scores), and gold validation (two of those) on an instance record."""

    settings: Settings

    def evaluate(self, req: EvalRequest, instance: EvalInstance | None) -> EvalReport:
        return evaluate_report(req, self.settings, instance=instance)

    def validate(self, record: InstanceRecord, *, force: bool) -> InstanceRecord:
        return gold.validate_record(record, self.settings, force=force)


async def _patch(ctx: StageContext, msg: m.EvalRequested) -> str:
    if not msg.patch_ref:
        return msg.patch
    limit = ctx.settings.evaluator.max_patch_bytes
    try:
        size = await ctx.store.blob_size(msg.patch_ref)
        if size <= limit:  # checked on the metadata: an oversize patch is never read or written
            return (await ctx.store.get_blob(msg.patch_ref)).decode(errors="replace")
    except Exception as exc:  # nats' object store raises NotFoundError (and others) for a bad ref
        raise BadInput(f"patch_ref {msg.patch_ref!r} is not in the object store: {exc}") from exc
    raise BadInput(f"patch_ref {msg.patch_ref!r} is {size} bytes, over evaluator.max_patch_bytes={limit}")


async def _instance(ctx: StageContext, iid: str) -> EvalInstance | None:
    try:
        record = await instance_record(ctx.store, iid)
        return None if record is None else from_record(record)
    except ValueError as exc:  # not JSON, or not an instance record (msgspec.ValidationError)
        raise BadInput(f"instance record {iid} in the store is unreadable: {exc}") from exc


# Per-run samples stay in the report on disk; the bus and the `evaluations` bucket carry the rest.
SAMPLE_KEYS: Final = frozenset(
    {"samples", "samples_wall", "samples_cpu", "samples_est_cycles", "samples_confirm"}
)


def without_samples(report: EvalReport) -> EvalReport:
    """The report as the bus, the bucket and `evaluate --json` carry it."""
    return msgspec.structs.replace(report, **dict.fromkeys(SAMPLE_KEYS, UNSET))


# what a report takes from the expert's commit, not from the agent's patch: the files the expert
# changed are half of the hidden answer (where to look), and every report had them, even that of
# an empty patch answered in milliseconds. An agent's report never carries them (its announcement,
# the bucket's copy, `result`); the report on the evaluator's disk keeps them for the operator.
# `multi_file` (one bit: the expert changed more than one file) stays: the run report's
# single/multi-file split (the paper's Table 2) is made from it.
# `cpu_fallback_expert`: where Valgrind stopped in the expert's tree (function, file, line).
EXPERT_FIELDS: Final = ("files", "cpu_fallback_expert")


def agent_view(report: EvalReport) -> EvalReport:
    """`report` as an agent may see it: without `EXPERT_FIELDS`, and without the output of the
    expert's tree where a benchmark could not be timed there (it can quote the expert's change,
    as its compiler's can; the operator's report.json keeps it)."""
    skipped = report.benchmarks_skipped
    if skipped:
        skipped = [without_expert_output(b) for b in skipped]
    return msgspec.structs.replace(report, benchmarks_skipped=skipped, **dict.fromkeys(EXPERT_FIELDS, UNSET))


def without_expert_output(skip: SkippedBenchmark) -> SkippedBenchmark:
    """A skipped benchmark as an agent may read it: the expert side's output left out."""
    if skip.side != "expert" or not skip.detail:
        return skip
    return msgspec.structs.replace(skip, detail="(the expert side's output is not shown to agents)")


def wire_report(report: EvalReport, *, for_agent: bool = False) -> dict[str, Any]:
    """The one place the report becomes the bus's JSON (`EvalCompleted.report`, a wire boundary;
    the `evaluations` bucket and `evaluate --json` hold the same), without the samples; an
    agent's (`for_agent`) without what only the expert's commit knows (`agent_view`)."""
    return as_json(without_samples(agent_view(report) if for_agent else report))


def completed(msg: m.EvalRequested, report: EvalReport) -> m.EvalCompleted:
    return m.EvalCompleted(
        request_id=msg.request_id,
        agent=msg.agent,
        run_id=msg.run_id,
        model=msg.model,
        instance_id=msg.instance_id,
        verdict=str(report.verdict),
        opt=report.opt,
        report=wire_report(report, for_agent=bool(msg.agent)),
    )


def stored_report(text: str) -> EvalReport | None:
    """A report the `evaluations` bucket holds, None when it is not a report of this version (then
    the request is evaluated again). Python's JSON: a report may hold `Infinity`."""
    try:
        return msgspec.convert(json.loads(text), EvalReport)
    except (ValueError, RecursionError):  # not JSON, another shape (msgspec.ValidationError), too deep
        return None


def completed_subject(msg: m.EvalRequested) -> str:
    """`eval.completed.<agent>` for an agent's request (its only readable announcement)."""
    return m.eval_completed_subject(msg.agent) if msg.agent else m.EVAL_COMPLETED


UNREADABLE: Final = {"unreadable": True}  # what `_prior` read when the stored value is not JSON


@dataclass(frozen=True)
class Prior:
    """What the `evaluations` bucket held for an id when a request was read: the value as stored
    (`raw`, compared again before the new record is written), its state and report (None when
    there is none or it cannot be read: a corrupt value or report, its blob gone — then the
    request is evaluated again and the record rewritten, never dead-lettered unanswered)."""

    raw: dict[str, Any] | None
    state: EvaluationState
    report: EvalReport | None


async def _prior(ctx: StageContext, eid: str) -> Prior:
    try:
        raw = await ctx.store.get(EVALUATIONS.name, eid)
    except ValueError as exc:  # msgspec's decode errors are ValueErrors
        log.warning("stored_evaluation_unreadable", evaluation=eid, error=str(exc))
        return Prior(UNREADABLE, EvaluationState(), None)
    try:
        state = EvaluationState() if raw is None else to_struct(raw, EvaluationState)
        if state.verdict is None or not (state.report or state.report_ref):
            return Prior(raw, state, None)
        text = await ctx.store.resolve_text(state.report, state.report_ref)
    except (ValueError, BadInput) as exc:  # another shape; the report's blob gone
        log.warning("stored_evaluation_unreadable", evaluation=eid, error=str(exc))
        return Prior(raw, EvaluationState(), None)
    return Prior(raw, state, stored_report(text))


async def _answer_stored(ctx: StageContext, msg: m.EvalRequested, prior: Prior, patch: str) -> bool:
    """Answer `msg` from the stored report when it is of this very patch (True), announced under
    the record's announcement id: deduplicated if it was announced already (a crash after the
    record, before the ack; another worker's evaluation of the same request)."""
    stored = prior.report
    if stored is None or stored.patch_sha256 != patch_sha256(patch):  # the same patch, not the id
        return False
    done = completed(msg, stored)
    await ctx.bus.publish(completed_subject(msg), done, msg_id=prior.state.announced or None)
    if msg.reply_to:
        await ctx.bus.reply(msg.reply_to, done)
    return True


async def _record(ctx: StageContext, eid: str, state: EvaluationState, read: dict[str, Any] | None) -> bool:
    """Store `state` as the evaluation `eid` if the bucket still holds what was `read` before the
    evaluation (compare-and-set); False when another evaluation was recorded meanwhile."""
    value = to_json_dict(state)
    unchanged = True

    def change(current: dict[str, Any] | None) -> dict[str, Any] | None:
        nonlocal unchanged
        unchanged = current == read
        return value if unchanged else None

    try:
        await ctx.store.modify(EVALUATIONS.name, eid, change)
    except ValueError:  # the stored value is not JSON (`read` was UNREADABLE, or it became so)
        await ctx.store.put(EVALUATIONS.name, eid, value)
        return True
    return unchanged


async def _drop_replaced_report(ctx: StageContext, replaced: dict[str, Any] | None, kept: str | None) -> None:
    """The report object of the record just replaced (an earlier patch's evaluation of the id) is
    no one's now: removed, so an agent resubmitting one id with patch after patch does not fill
    the object store with reports nothing names. A failure to remove it is a log line."""
    old = replaced.get("report_ref") if isinstance(replaced, dict) else None
    if not isinstance(old, str) or not old or old == kept:
        return
    try:
        await ctx.store.delete_blob(old)
    except Exception as exc:  # the bus away: an orphan object, never a lost verdict
        log.warning("replaced_report_not_removed", ref=old, error=str(exc))


async def on_request(ctx: StageContext, ops: EvaluatorOps, msg: m.EvalRequested) -> Outcome:
    patch = await _patch(ctx, msg)
    prior = await _prior(ctx, msg.id)
    if await _answer_stored(ctx, msg, prior, patch):
        return "answered-from-store"
    # an agent's run is keyed under the agent: its run dir and record are `<agent>.<run_id>`
    run_id = m.agent_run(msg.agent, msg.run_id)
    req = EvalRequest(
        run_id=run_id, model=msg.model, instance_id=msg.instance_id, patch=patch, for_agent=bool(msg.agent)
    )
    try:
        instance = await _instance(ctx, msg.instance_id)
    except BadInput as exc:  # the agent is answered (its request was fine), the operator told
        log.warning("instance_record_unreadable", instance=msg.instance_id, error=str(exc))
        reason = f"unknown instance {msg.instance_id!r}: no readable record" if req.for_agent else str(exc)
        report = refused_report(req, EvalVerdict.UNKNOWN_INSTANCE, reason)
    else:
        why = None if instance is None else cannot_grade(instance, for_agent=req.for_agent)
        if why is not None:  # known from the bucket's record: no tree is built, no worker is busied
            report = refused_report(req, EvalVerdict.INSTANCE_BROKEN, why)
        else:
            report = await asyncio.to_thread(ops.evaluate, req, instance)
    done = completed(msg, report)
    announced = f"{done.id}@{uuid.uuid4().hex}"  # this evaluation's announcement, not the id's
    # a large report: an object of this evaluation's own (`report/<id>` alone was overwritten
    # by a second evaluation of the id, under the first's record)
    text, ref = await ctx.store.inline_or_ref(f"report/{announced}", json.dumps(done.report))
    state = to_struct(
        {
            "verdict": done.verdict,
            "opt": done.opt,
            "run_id": msg.run_id,
            "model": msg.model,
            "instance_id": msg.instance_id,
            "agent": msg.agent,
            "worker": ctx.settings.evaluator.worker_name or WORKER,
            "report": text,
            "report_ref": ref,
            "announced": announced,
        },
        EvaluationState,
    )
    try:
        recorded, replaced = await _record_over(ctx, msg, req.id, state, prior, patch, ref)
    except Exception:  # not recorded (the bucket full, the bus away): its report object is no one's
        if ref:
            with contextlib.suppress(Exception):
                await ctx.store.delete_blob(ref)
        raise
    if not recorded:
        return "answered-from-store"
    await _drop_replaced_report(ctx, replaced, ref)
    # after the record: a crash re-publishes from it, with the same id
    await ctx.bus.publish(completed_subject(msg), done, msg_id=announced)
    if msg.reply_to:
        await ctx.bus.reply(msg.reply_to, done)
    return "evaluated"


async def _record_over(
    ctx: StageContext,
    msg: m.EvalRequested,
    eid: str,
    state: EvaluationState,
    prior: Prior,
    patch: str,
    ref: str | None,
) -> tuple[bool, dict[str, Any] | None]:
    """Record `state` over what was read before the evaluation: whether it was recorded (not when
    the same patch's evaluation was recorded meanwhile: answered from that one), and the record
    it replaced."""
    recorded = await _record(ctx, eid, state, prior.raw)
    replaced = prior.raw
    while not recorded:
        # recorded meanwhile (this request evaluated twice at once: a redelivery while the first
        # worker still ran, its heartbeats lost): the agent gets that one verdict, announced once
        meanwhile = await _prior(ctx, msg.id)
        if await _answer_stored(ctx, msg, meanwhile, patch):
            log.warning("evaluated_twice", evaluation=eid, kept="the first recorded")
            if ref:
                await ctx.store.delete_blob(ref)  # this evaluation's report: never recorded
            return False, None
        # another patch's evaluation recorded meanwhile: this later one replaces it — over what
        # was just read (compare-and-set again: a third one recorded since is replaced, its
        # report object removed, never overwritten unseen and left behind)
        recorded = await _record(ctx, eid, state, meanwhile.raw)
        replaced = meanwhile.raw
    return True, replaced


async def on_validate(ctx: StageContext, ops: ValidatorOps, msg: m.ValidateRequested) -> ValidateOutcome:
    """Gold-validate the stored instance `msg.instance_id` and store the result in its record.
    Bad input (no such instance, not proven improved, an unreadable record) is `BadInput`: the
    worker dead-letters it with this reason."""
    iid = m.check_instance_id(msg.instance_id)  # it names OUT/instances/<id>.json below: one file name
    try:
        read = await ctx.store.get(INSTANCES.name, iid)  # as stored: compared again before the write
        state = InstanceState() if read is None else to_struct(read, InstanceState)
    except ValueError as exc:  # a value that is not JSON, or not an instance's state
        raise BadInput(f"instance {iid} in the store is unreadable: {exc}") from exc
    if not state.record and not state.record_ref:
        raise BadInput(f"unknown instance {iid!r}: the instances bucket has no record for it")
    if state.verdict != Verdict.IMPROVED:
        raise BadInput(f"instance {iid} is {state.verdict or 'not built'}, not improved: nothing to validate")
    try:
        record = decode_record(await ctx.store.resolve_text(state.record, state.record_ref))
    except ValueError as exc:  # not JSON, or not an instance record (msgspec.ValidationError)
        raise BadInput(f"instance record {iid} in the store is unreadable: {exc}") from exc
    if state.oracle is not None and gold.stored_validation(record) is not None and not msg.force:
        return "already-validated"  # a redelivery or a second request: the stored result stands
    validated = await asyncio.to_thread(ops.validate, record, force=msg.force)
    block = gold.stored_validation(validated)
    if block is None:  # the ops broke their contract: not the request's fault (retried, not dead-lettered)
        raise RuntimeError(f"gold validation of {iid} returned a record without its validation")
    body = record_text(validated, indent=None)
    # a blob of its own (by content): `record/<id>` is the builder's, which a rebuild meanwhile rewrote
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    text, ref = await ctx.store.inline_or_ref(f"record/{iid}/validated-{digest}", body)
    if not await _store_validated(ctx, iid, read, record=text, record_ref=ref, oracle=str(block.oracle)):
        raise TransientError(
            f"instance {iid} changed while it was validated (rebuilt or removed): the new record "
            "is kept and validated on the retry"
        )
    # this node's export, as the builder writes it (OUT/instances/<id>.json)
    path = Path(ctx.settings.out_dir) / "instances" / f"{iid}.json"
    await asyncio.to_thread(write_atomic, path, record_text(validated))
    return "validated"


async def _store_validated(
    ctx: StageContext, iid: str, read: dict[str, Any] | None, **fields: str | None
) -> bool:
    """`fields` (the validated record, its oracle) set on the instance's state only if it is the one
    `read` before the validation (compare-and-set): a record rebuilt meanwhile is not overwritten
    with the old one, a removed one not brought back as a half record. False when it changed."""
    unchanged = True

    def change(current: dict[str, Any] | None) -> dict[str, Any] | None:
        nonlocal unchanged
        unchanged = current == read
        return {**current, **fields} if current is not None and unchanged else None

    await ctx.store.modify(INSTANCES.name, iid, change)
    return unchanged
