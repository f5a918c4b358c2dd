"""The agents' door: `eval.api.<agent>.{submit,result,results}`, answered by the evaluator.

The agent's name is the subject's second token. On the secured bus (deploy/nats) an agent may
publish only to its own `eval.api.<name>.*` (its own account `agent_<name>`, importing only that
from SERVICES), so NATS vouches for the name; nothing in the body says who is asking. The answer
goes to the request's reply subject, which NATS maps back into the asker's own account (service
import), never to a subject the body names: whatever reply subject an agent sets, only its own
subscriptions can receive the answer. Every check runs before anything is written, the patch size and
the `run_id`/`model`/`instance_id` alphabet (refused, never rewritten) before anything is read; then the
agent's pending count and its evaluations (`over_quota`);
before those, the agent's request rate (`RateGate`: a flood is refused without any JetStream call,
so it cannot hold another agent's requests behind it for long).
The dedup id (`Nats-Msg-Id`) is derived here from agent + run + model + instance + patch hash (+ the hash
of the patch the id holds now), so
an agent cannot choose it (nor block another's), and the evaluation is keyed under the agent.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgspec
from msgspec import UNSET, UnsetType
from nats.js.errors import APIError, NotFoundError

from cppperf.services.evaluator.handlers import agent_view
from cppperf.services.evaluator.pipeline import patch_sha256
from cppperf.shared import buckets
from cppperf.shared import messages as m
from cppperf.shared.buckets import EVALUATIONS
from cppperf.shared.bus import WORK_QUEUES
from cppperf.shared.domain import EvalReport, EvaluationState, EvalVerdict, to_json_dict
from cppperf.shared.errors import BadInput, CppPerfError
from cppperf.shared.logging import get_logger
from cppperf.shared.service import ServiceContext

log = get_logger(__name__)
VERBS = m.AGENT_VERBS
MAX_REPORT_REPLY = 512 * 1024  # a larger report is answered as its summary (`truncated: true`)
MAX_RESULTS_REPLY = 512 * 1024  # `results` rows per page: a reply must fit NATS's max payload


class RateGate:
    """A token bucket per agent: `rate` requests a second on average, bursts of `2 * rate`."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, max(1.0, 2 * rate), clock
        self.buckets: dict[str, tuple[float, float]] = {}  # agent -> (tokens, when)

    def allow(self, agent: str) -> bool:
        now = self.clock()
        tokens, then = self.buckets.get(agent, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        self.buckets[agent] = (tokens - 1, now) if tokens >= 1 else (tokens, now)
        return tokens >= 1


def refused(error: str) -> m.AgentAnswer:
    return m.AgentAnswer(ok=False, error=error)


def too_fast(gate: RateGate, agent: str) -> m.AgentAnswer:
    return refused(f"more than {gate.rate:g} requests a second from {agent}: slow down")


def agent_of(subject: str) -> tuple[str, str] | None:
    """(agent, verb) of `eval.api.<agent>.<verb>` (an open bus) or of
    `eval.api.<partition>.<agent>.<verb>` (a secured bus: the agent's import put it in its
    partition), or None for anything else."""
    parts = subject.split(".")
    if len(parts) not in (4, 5) or ".".join(parts[:2]) != m.EVAL_API or parts[-1] not in VERBS:
        return None
    agent = parts[-2]
    if not m.AGENT_NAME.fullmatch(agent):
        return None
    if len(parts) == 5 and parts[2] != m.api_partition(agent):
        return None
    return agent, parts[-1]


def dedup_id(agent: str, req: m.AgentSubmit, replaces: str = "") -> str:
    """The `Nats-Msg-Id` of an agent's request: only the evaluator computes it. `replaces`: the
    patch hash of the evaluation the id holds now, so A, then B, then A again queues A again
    (without it the second A was a duplicate of the first for JetStream's whole window, and its
    answer B's report)."""
    key = "\0".join([agent, req.run_id, req.model, req.instance_id, patch_sha256(req.patch), replaces])
    return "agent:" + hashlib.sha256(key.encode()).hexdigest()[:40]


def _check_token(what: str, value: str) -> str | None:
    if what == "run_id":  # it names the run's folder: the stricter rule the CLI applies too
        try:
            m.check_run_id(value)
        except BadInput as exc:
            return f"{exc} (refused, not rewritten)"
        return None
    if m.TOKEN.fullmatch(value):
        return None
    return f"{what} {value[:80]!r} is not [A-Za-z0-9._-]{{1,128}} (refused, not rewritten)"


async def pending(ctx: ServiceContext, agent: str) -> int:
    """The agent's requests queued or being evaluated (work-queue messages not yet acked)."""
    subject = m.eval_requested_subject(agent)
    info = await ctx.bus.js.stream_info(WORK_QUEUES[m.EVAL_REQUESTED].stream, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def over_quota(ctx: ServiceContext, agent: str, *, queued: int) -> str | None:
    """Why a submit would be one evaluation too many for `agent` (None when it is not): each new
    (run, model, instance) is a key of `evaluations` and a folder under runs/, kept for good, and
    cheap to make (`unknown-instance` takes milliseconds), so without a cap one agent could fill
    the bucket every agent and the services write (`bus.kv_max_bytes`) or the evaluator's disk.
    Asked only for an id the agent does not have (one it has is replaced: always accepted)."""
    limit = ctx.settings.evaluator.agent_max_evaluations
    if limit <= 0:
        return None
    held = await ctx.store.count(EVALUATIONS.name, under=agent) + queued
    if held < limit:
        return None
    return (
        f"{held} evaluations of {agent} kept or queued (limit {limit}): a new run, model or "
        "instance is refused; asking again for one you have replaces it (the operator can raise "
        "evaluator.agent_max_evaluations or forget old runs: `cppperf agents forget`)"
    )


async def submit(ctx: ServiceContext, agent: str, data: bytes) -> m.AgentAnswer:  # noqa: PLR0911 - one refusal per check
    ev = ctx.settings.evaluator
    if len(data) > ev.agent_max_patch_bytes + 64 * 1024:
        return refused(f"request of {len(data)} bytes: patches are capped at {ev.agent_max_patch_bytes}")
    try:
        req = m.decode(data, m.AgentSubmit)
    except CppPerfError as exc:
        return refused(str(exc))
    size = len(req.patch.encode())
    if size > ev.agent_max_patch_bytes:
        return refused(f"patch of {size} bytes is over the {ev.agent_max_patch_bytes}-byte limit")
    for what, value in (("run_id", req.run_id), ("model", req.model), ("instance_id", req.instance_id)):
        if error := _check_token(what, value):
            return refused(error)
    eid = m.evaluation_id(m.agent_run(agent, req.run_id), req.model, req.instance_id)
    held, stored, replaces = await _held(ctx, eid)
    if stored is not None and stored.patch_sha256 == patch_sha256(req.patch):  # this very patch: done
        return m.AgentAnswer(ok=True, id=eid, duplicate=True, status="done")
    queued = await pending(ctx, agent)
    if queued >= ev.agent_max_pending:
        return refused(
            f"{queued} requests of {agent} pending (limit {ev.agent_max_pending}): wait for results"
        )
    if not held and (error := await over_quota(ctx, agent, queued=queued)):
        return refused(error)
    msg = m.EvalRequested(
        request_id=eid,
        agent=agent,
        run_id=req.run_id,
        model=req.model,
        instance_id=req.instance_id,
        patch=req.patch,
    )
    subject, msg_id = m.eval_requested_subject(agent), dedup_id(agent, req, replaces)
    try:
        fresh = await ctx.bus.publish(subject, msg, msg_id=msg_id)
        if not fresh and queued == 0:
            # a duplicate of a request no longer queued, and not stored for this patch: it was
            # dead-lettered; for the dedup window (24 h) every submit of it would be dropped
            # again, answered `queued` with nothing queued. Queued again under an id of its own.
            log.warning("agent_request_requeued", agent=agent, item=msg.id, reason="dead-lettered before")
            fresh = await ctx.bus.publish(subject, msg, msg_id=f"{msg_id}:{uuid.uuid4().hex[:12]}")
    except APIError as exc:  # the stream is full (discard: new) or JetStream is unavailable
        log.warning("agent_request_refused", agent=agent, error=str(exc))
        return refused(f"the evaluation queue refused the request: {exc.description or exc}")
    log.info("agent_request_queued", agent=agent, item=msg.id, duplicate=not fresh)
    return m.AgentAnswer(ok=True, id=msg.id, duplicate=not fresh, status="queued")


async def _held(ctx: ServiceContext, eid: str) -> tuple[bool, EvalReport | None, str]:
    """Whether the agent has the evaluation `eid` (a key of `evaluations`), its stored report,
    and what a new request replaces (`dedup_id`): the stored patch's hash; for a record or
    report that cannot be read, a value of its own (the first submit's dedup id would make this
    one a duplicate: answered `queued`, nothing queued, the id stuck unreadable)."""
    try:
        state = await buckets.get(ctx.store, EVALUATIONS, eid)
        stored = None if state is None else await _report(ctx, eid)
    except (Unreadable, ValueError) as exc:  # msgspec's decode and validation errors are ValueErrors
        log.warning("stored_evaluation_unreadable", evaluation=eid, error=str(exc))
        return True, None, f"unreadable:{uuid.uuid4().hex}"
    if stored is None:
        return state is not None, None, ""
    if stored.patch_sha256 and stored.reason != UNREADABLE_REPORT:
        return True, stored, stored.patch_sha256
    return True, stored, f"unreadable:{uuid.uuid4().hex}"


def owns(agent: str, evaluation_id: str) -> bool:
    """An agent's evaluation ids start `<agent>.` (agent names have no dot, ids escape `/`)."""
    return evaluation_id.split("/", 1)[0].startswith(agent + ".")


class ResultSummary(msgspec.Struct, kw_only=True):
    """One finished evaluation in brief: a `results` row, or a `result` too large to send whole."""

    id: str
    instance_id: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    verdict: EvalVerdict
    opt: bool
    gm_speedup_agent: float | UnsetType = UNSET
    gm_speedup_expert: float | UnsetType = UNSET
    reason: str = ""
    truncated: bool | UnsetType = UNSET


class Unreadable(CppPerfError):
    """A stored evaluation whose record cannot be read (its KV value is not one)."""


UNREADABLE_REPORT = "the stored report is unreadable"


async def _report(ctx: ServiceContext, evaluation_id: str) -> EvalReport | None:
    """The finished report of an evaluation (verdict and `opt` as the bucket records them); a
    report that cannot be read (not JSON, not a report, its blob gone) says so in `reason`; a
    record that cannot be read raises `Unreadable`. A report object gone because a later
    evaluation of the id replaced the record meanwhile (and removed it) is read from the new
    record, not called unreadable."""
    state = await _state(ctx, evaluation_id)
    for _ in range(3):
        verdict = state.verdict
        if verdict is None:
            return None
        try:
            text = await ctx.store.resolve_text(state.report, state.report_ref)
            report = msgspec.convert(json.loads(text), EvalReport)
        except BadInput:  # the blob gone: the record replaced meanwhile, or the blob lost
            again = await _state(ctx, evaluation_id)
            if (again.report, again.report_ref) != (state.report, state.report_ref):
                state = again
                continue
            report = EvalReport(verdict=verdict, reason=UNREADABLE_REPORT)
        except (ValueError, RecursionError):  # not JSON, not a report, too deep
            report = EvalReport(verdict=verdict, reason=UNREADABLE_REPORT)
        # an agent's reports are stored without the expert's files (`handlers.agent_view`); one
        # stored before that is read the same way
        return msgspec.structs.replace(agent_view(report), verdict=verdict, opt=state.opt)
    # replaced three times while being read: say so rather than wait
    if state.verdict is None:
        return None
    return EvalReport(verdict=state.verdict, opt=state.opt, reason=UNREADABLE_REPORT)


async def _state(ctx: ServiceContext, evaluation_id: str) -> EvaluationState:
    try:
        return await buckets.get(ctx.store, EVALUATIONS, evaluation_id) or EvaluationState()
    except ValueError as exc:  # msgspec's decode and validation errors
        raise Unreadable(
            f"the stored evaluation {evaluation_id} is unreadable ({exc}): submit its patch again "
            "to have it evaluated again"
        ) from exc


def _summary(evaluation_id: str, report: EvalReport) -> ResultSummary:
    return ResultSummary(
        id=evaluation_id,
        instance_id=report.instance_id,
        model=report.model,
        verdict=report.verdict,
        opt=report.opt,
        gm_speedup_agent=report.gm_speedup_agent,
        gm_speedup_expert=report.gm_speedup_expert,
        reason=report.reason,
    )


# the longest evaluation id: `<agent>.<run_id>/<model>/<instance_id>`, each part with `%` and `/`
# escaped as three characters (agent name 32, run id and model 128 each, an instance id)
MAX_EVALUATION_ID: Final = 3 * (32 + 1 + 128 + 128 + m.MAX_INSTANCE_ID_BYTES) + 2


def _lost(evaluation_id: str, digest: str) -> str:
    what = "this patch of " if digest else ""
    return (
        f"no evaluation of {what}{evaluation_id[:200]!r} is queued or stored: never submitted, or its "
        "request failed for good (the operator's `cppperf dlq list` says why); submit it again"
    )


async def result(ctx: ServiceContext, agent: str, data: bytes) -> m.AgentAnswer:  # noqa: PLR0911 - one answer per state
    try:
        q = m.decode(data, m.AgentQuery)
    except CppPerfError as exc:
        return refused(str(exc))
    if len(q.id) > MAX_EVALUATION_ID:  # echoed in the answer: a 1 MiB id made it too large to send
        return refused(f"an evaluation id of {len(q.id)} characters: none is longer than {MAX_EVALUATION_ID}")
    if not owns(agent, q.id):
        return refused(f"{q.id[:200]!r} is not an evaluation of {agent}")
    try:
        report = await _report(ctx, q.id)
    except Unreadable as exc:
        return refused(str(exc))
    if report is None or (q.patch_sha256 and report.patch_sha256 != q.patch_sha256):
        # (another patch's report: not this one's)
        if await pending(ctx, agent) == 0:  # the record is written before the request is acked
            return m.AgentAnswer(ok=True, id=q.id, status="lost", error=_lost(q.id, q.patch_sha256))
        return m.AgentAnswer(ok=True, id=q.id, status="pending")
    whole = {**to_json_dict(report), "id": q.id}
    if len(json.dumps(whole)) > MAX_REPORT_REPLY:  # a reply must fit NATS's max payload
        brief = msgspec.structs.replace(_summary(q.id, report), truncated=True)
        return m.AgentAnswer(ok=True, id=q.id, status="done", result=to_json_dict(brief))
    return m.AgentAnswer(ok=True, id=q.id, status="done", result=whole)


async def results(ctx: ServiceContext, agent: str, data: bytes) -> m.AgentAnswer:
    """Every finished evaluation of one of the agent's runs, summarized (full report: `result`),
    in id order, one page per reply: past `MAX_RESULTS_REPLY` the answer says `more` and the
    agent asks again with `after` (a run of thousands once got no answer: over 1 MiB)."""
    try:
        q = m.decode(data, m.AgentQuery)
    except CppPerfError as exc:
        return refused(str(exc))
    if error := _check_token("run_id", q.run_id):
        return refused(error)
    prefix = m.run_prefix(m.agent_run(agent, q.run_id))
    rows: list[dict[str, Any]] = []
    size = 0
    for eid in sorted(await ctx.store.ids(EVALUATIONS.name, under=agent)):  # only this agent's keys
        if not eid.startswith(prefix) or eid <= q.after:
            continue
        try:
            report = await _report(ctx, eid)
        except Unreadable as exc:  # one broken record does not hide the run (`result` says why)
            log.warning("stored_evaluation_unreadable", evaluation=eid, error=str(exc))
            continue
        if report is None:
            continue
        row = to_json_dict(_summary(eid, report))
        size += len(json.dumps(row)) + 2
        if size > MAX_RESULTS_REPLY and rows:  # a page per reply: the rest after this page's last id
            return m.AgentAnswer(ok=True, results=rows, more=True)
        rows.append(row)
    return m.AgentAnswer(ok=True, results=rows)


async def answer(
    ctx: ServiceContext, subject: str, data: bytes, gate: RateGate | None = None
) -> m.AgentAnswer:
    """The reply to one agent request (a refusal for anything malformed; never raises for input)."""
    who = agent_of(subject)
    if who is None:
        return refused(f"{subject[:200]!r} is not eval.api.<agent>.<submit|result|results>")
    agent, verb = who
    if gate is not None and not gate.allow(agent):
        return too_fast(gate, agent)
    try:
        if verb == "submit":
            return await submit(ctx, agent, data)
        if verb == "result":
            return await result(ctx, agent, data)
        return await results(ctx, agent, data)
    except (NotFoundError, APIError) as exc:  # a stream or bucket missing: the service is not ready
        log.warning("agent_request_failed", agent=agent, verb=verb, error=str(exc))
        return refused(f"the evaluator cannot serve {verb} now: {exc}")
