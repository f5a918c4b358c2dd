"""Every bus message as a msgspec Struct, with its subject constant and one decoder built once.

Schema evolution (msgspec `schema-evolution`): new fields get defaults, a field's type never
changes, decoders ignore unknown fields. Each message carries `schema_version` (an integer: the
major version); `decode` refuses a version it does not know with `UnsupportedSchema`, so a
message from a newer producer ends in the dead-letter queue with the reason instead of being
half-understood downstream.
Stable ids (docs/design.md) double as `Nats-Msg-Id`: repo `owner/name`, commit `owner/name@sha`,
instance `owner__name-<sha12>`, evaluation `<run_id>/<model>/<instance_id>` (each part with `%`
and `/` escaped, so two different triples never share an id), and for an agent's request
`<agent>.<run_id>/<model>/<instance_id>` (the agent name comes from the NATS subject its request
arrived on, `eval.api.<agent>.submit`, never from the body).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec

from cppperf.shared.errors import BadInput, MalformedMessage, UnsupportedSchema

SCHEMA_VERSION: Final = 1
READABLE_SCHEMA_VERSIONS: Final = frozenset({SCHEMA_VERSION})

REPO_CANDIDATE: Final = "repo.candidate"
REPO_FOUND: Final = "repo.found"
COMMIT_SELECTED: Final = "commit.selected"
COMMIT_CLASSIFIED: Final = "commit.classified"
PATCH_BUILT: Final = "patch.built"
EVAL_REQUESTED: Final = "eval.requested"
EVAL_COMPLETED: Final = "eval.completed"
VALIDATE_REQUESTED: Final = "validate.requested"  # gold validation of a stored instance (evaluator)
DLQ_PREFIX: Final = "dlq."
EVAL_API: Final = "eval.api"  # eval.api.<agent>.{submit,result,results}: the agents' request-reply API
# the API's verbs: an agent may publish exactly these three subjects (deploy/nats/agents.conf),
# never `eval.api.<agent>.*`, whose last token could be any bytes (not UTF-8, control characters)
AGENT_VERBS: Final = ("submit", "result", "results")
LOCAL_AGENT: Final = "local"  # the agent of requests on an open (unauthenticated) bus
AGENT_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")  # one NATS subject token, no dots
TOKEN: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")  # run_id and model from an agent


def eval_requested_subject(agent: str) -> str:
    """The work-queue subject of one agent's requests (its pending count is this subject's)."""
    return f"{EVAL_REQUESTED}.{agent}"


def eval_completed_subject(agent: str) -> str:
    """Where an agent's results are announced (the agents account may read only its own)."""
    return f"{EVAL_COMPLETED}.{agent}"


def eval_api_subject(agent: str, verb: str) -> str:
    """Where an agent sends its requests (in its own account; on an open bus, where they arrive)."""
    return f"{EVAL_API}.{agent}.{verb}"


# The evaluator reads agents' requests on this many connections, one per partition of the agents'
# names (services/evaluator/api.py): the server closes a connection it cannot write to fast enough
# (a slow consumer), and NATS has no ingress rate limit, so one agent flooding its own subject can
# only take its own partition's connection down, not every agent's.
API_PARTITIONS: Final = 8


def api_partition(agent: str) -> str:
    """The partition token of `agent`'s requests: `p0` … `p7`, fixed by its name."""
    n = int.from_bytes(hashlib.sha256(agent.encode()).digest()[:4], "big") % API_PARTITIONS
    return f"p{n}"


def eval_api_service_subject(agent: str, verb: str) -> str:
    """Where `agent`'s request arrives in SERVICES on a secured bus: its account's import maps
    `eval.api.<agent>.<verb>` to `eval.api.<partition>.<agent>.<verb>` (cppperf/agents.py)."""
    return f"{EVAL_API}.{api_partition(agent)}.{agent}.{verb}"


def dlq_subject(subject: str) -> str:
    return DLQ_PREFIX + subject


# ----------------------------------------------------------------------------------------- ids
def commit_id(repo: str, sha: str) -> str:
    return f"{repo}@{sha}"


def instance_id(repo: str, sha: str) -> str:
    return f"{repo.replace('/', '__')}-{sha[:12]}"


# a GitHub id is at most 39 + 2 + 100 + 13 bytes; `<id>.json` and its temporary `.<id>.json.XXXXXXXX.tmp`
# must fit a 255-byte file name
MAX_INSTANCE_ID_BYTES = 230


def check_instance_id(iid: str) -> str:
    """`iid` when it can name a file in OUT/instances, else BadInput: never empty, no `/` or NUL (an
    id is one file name, never a path out of the folder), at most MAX_INSTANCE_ID_BYTES."""
    size = len(iid.encode(errors="surrogateescape"))
    if not iid or "/" in iid or "\0" in iid or iid in (".", "..") or size > MAX_INSTANCE_ID_BYTES:
        shown = iid if len(iid) <= 60 else f"{iid[:60]}… ({size} bytes)"
        raise BadInput(
            f"not an instance id: {shown!r} (owner__name-<sha12>: one file name, no `/`, "
            f"at most {MAX_INSTANCE_ID_BYTES} bytes)"
        )
    return iid


# a run id names the folder OUT/runs/<run_id> and the report <model>.<run_id>.json as it is: `.`
# and `_` at either end would be stripped there (`pipeline.safe_name`), so `x`, `_x`, `x.` would
# share one run
RUN_ID: Final = re.compile(r"(?![._])[A-Za-z0-9._-]{1,128}(?<![._])")


def check_run_id(run_id: str) -> str:
    """`run_id` when it names its run folder unchanged, else BadInput (refused, never rewritten):
    1-128 of [A-Za-z0-9._-], not starting or ending with `.` or `_` (so never empty, `.`, `..`)."""
    if RUN_ID.fullmatch(run_id):
        return run_id
    shown = run_id if len(run_id) <= 60 else f"{run_id[:60]}… ({len(run_id)} characters)"
    raise BadInput(
        f"not a run id: {shown!r} (1-128 of [A-Za-z0-9._-], not starting or ending with `.` or `_`: "
        "it names the folder OUT/runs/<run_id>)"
    )


# `owner/name` becomes `owner__name-<sha12>`: the instance id must still fit MAX_INSTANCE_ID_BYTES
MAX_REPO_ID_BYTES: Final = MAX_INSTANCE_ID_BYTES - len("_-") - 12
SHA: Final = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # a full SHA-1 or SHA-256 object name
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else f"{value[:60]}… ({len(value)} characters)")


def check_repo_id(repo: str) -> str:
    """`repo` when it can be a repository id (`owner/name`, `local/<folder>`), else BadInput: one
    `/` between a non-empty owner and name, neither `.` nor `..`, no NUL or other control
    character, at most MAX_REPO_ID_BYTES (its instance ids must name a file)."""
    owner, _, name = repo.partition("/")
    size = len(repo.encode(errors="surrogateescape"))
    if (
        not owner
        or not name
        or "/" in name
        or {owner, name} & {".", ".."}
        or _CONTROL.search(repo)
        or size > MAX_REPO_ID_BYTES
    ):
        raise BadInput(
            f"not a repository id: {_shown(repo)} (owner/name: one `/`, no NUL or control "
            f"character, at most {MAX_REPO_ID_BYTES} bytes)"
        )
    return repo


def check_sha(sha: str) -> str:
    """`sha` when it is a full commit name (40 or 64 lower-case hex digits), else BadInput (a
    `--option` or a NUL would reach git's command line)."""
    if not SHA.fullmatch(sha):
        raise BadInput(f"not a commit sha: {_shown(sha)} (40 or 64 lower-case hex digits)")
    return sha


def check_text(text: str) -> str:
    """`text` (a clone URL or path) when it has no NUL or other control character, else BadInput."""
    if _CONTROL.search(text):
        raise BadInput(f"{_shown(text)} holds a NUL or control character")
    return text


def _id_part(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


def evaluation_id(run_id: str, model: str, instance: str) -> str:
    """`run/model/instance` with `/` escaped inside each part: ("a/b","c") and ("a","b/c") differ."""
    return "/".join(_id_part(p) for p in (run_id, model, instance))


def agent_run(agent: str, run_id: str) -> str:
    """An agent's run as the evaluator keys it: `<agent>.<run_id>` (agent names have no dot)."""
    return f"{agent}.{run_id}" if agent else run_id


def run_prefix(run_id: str) -> str:
    """What every `evaluation_id` of `run_id` starts with."""
    return f"{_id_part(run_id)}/"


class _Msg(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: int = SCHEMA_VERSION


# ------------------------------------------------------------------------------------ payloads
class FileChange(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    status: str = "M"  # git name-status letter: A M D R C T
    added: int = 0
    deleted: int = 0
    old_path: str | None = None


class LinkedText(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "issue" | "pull"
    number: int
    url: str = ""
    title: str = ""
    body: str = ""


class Vote(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    phase: int
    answer: str  # Yes | No | Maybe
    latency_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False


# ------------------------------------------------------------------------------------ subjects
class RepoCandidate(_Msg, frozen=True, kw_only=True):
    repo: str  # owner/name or local/<dirname>
    url: str  # clone URL or local path
    source: str = "list"  # github | list | url | path
    stars: int | None = None
    default_branch: str | None = None
    language: str | None = None

    @property
    def id(self) -> str:
        return self.repo


class RepoFound(_Msg, frozen=True, kw_only=True):
    repo: str
    url: str
    default_branch: str | None = None
    head_sha: str | None = None
    validated: bool = False  # True when the builder built and tested the latest commit
    test_count: int | None = None
    build_seconds: float | None = None
    test_seconds: float | None = None
    build_type: str | None = None  # the build type its tests passed in (the Debug fallback, or not)

    @property
    def id(self) -> str:
        return self.repo


class CommitSelected(_Msg, frozen=True, kw_only=True):
    repo: str
    url: str
    sha: str
    parent: str
    date: str  # ISO 8601 commit date
    author: str = ""
    message: str
    files: list[FileChange] = msgspec.field(default_factory=list)
    linked: list[LinkedText] = msgspec.field(default_factory=list)
    links_fetched: bool = False  # False offline: linked texts are references only
    diff: str = ""  # inline when small
    diff_ref: str | None = None  # object-store name when the diff exceeds the inline limit

    @property
    def id(self) -> str:
        return commit_id(self.repo, self.sha)


class CommitClassified(_Msg, frozen=True, kw_only=True):
    commit: CommitSelected
    label: bool
    backend: str
    phase: int = 0  # 0 prefilter/heuristic, 1 agreement, 2 diff vote
    votes: list[Vote] = msgspec.field(default_factory=list)
    score: float | None = None
    evidence: list[str] = msgspec.field(default_factory=list)
    prompt_version: str = ""

    @property
    def id(self) -> str:
        return self.commit.id


class PatchBuilt(_Msg, frozen=True, kw_only=True):
    instance_id: str
    repo: str
    sha: str
    parent: str
    verdict: str  # improved | not-improved | regressed | unchanged-binaries | rejected
    improved_tests: list[str] = msgspec.field(default_factory=list)
    regressed_tests: list[str] = msgspec.field(default_factory=list)
    failure_category: str | None = None
    failure_detail: str = ""
    # the project's benchmarks (`bench:<target>/<benchmark>`) that improved / regressed
    improved_benchmarks: list[str] = msgspec.field(default_factory=list)
    regressed_benchmarks: list[str] = msgspec.field(default_factory=list)
    record_path: str = ""  # deprecated, always empty: the record is in `instances` by id

    @property
    def id(self) -> str:
        return self.instance_id


class EvalRequested(_Msg, frozen=True, kw_only=True):
    request_id: str
    run_id: str
    model: str
    instance_id: str
    patch: str = ""
    patch_ref: str | None = None  # set only by services (agents' patches travel inline, capped)
    reply_to: str | None = None  # set only by services (agents get answers on their own inbox)
    agent: str = ""  # set by the evaluator's gateway from the subject the agent's request came on

    @property
    def id(self) -> str:
        return evaluation_id(agent_run(self.agent, self.run_id), self.model, self.instance_id)


class EvalCompleted(_Msg, frozen=True, kw_only=True):
    request_id: str
    run_id: str
    model: str
    instance_id: str
    verdict: str
    opt: bool = False
    report: dict[str, Any] = msgspec.field(default_factory=dict)
    agent: str = ""

    @property
    def id(self) -> str:
        return evaluation_id(agent_run(self.agent, self.run_id), self.model, self.instance_id)


class ValidateRequested(_Msg, frozen=True, kw_only=True):
    """Gold-validate a stored instance (services/evaluator/gold.py): published by the builder
    (`builder.validate_gold`) or `cppperf validate` on a bus, consumed by the evaluator. Its result
    is the instance's state: `oracle` in the `instances` bucket and the record's `validation`."""

    instance_id: str
    force: bool = False  # validate again even when the stored record has a validation
    # part of the dedup id: the builder's is the stored record's hash (a rebuilt instance is asked
    # again), a forced `cppperf validate` a fresh one
    request_id: str = ""

    @property
    def id(self) -> str:
        return f"validate/{self.instance_id}" + (f"/{self.request_id}" if self.request_id else "")


class AgentSubmit(_Msg, frozen=True, kw_only=True):
    """An agent's request on `eval.api.<agent>.submit` (the agent is the subject's, not a field)."""

    run_id: str
    model: str
    instance_id: str
    patch: str  # inline only: agents have no object-store rights


class AgentQuery(_Msg, frozen=True, kw_only=True):
    """`eval.api.<agent>.result` (by `id`) or `eval.api.<agent>.results` (by `run_id`)."""

    id: str = ""
    run_id: str = ""
    after: str = ""  # results: only the ids after this one (the last id of the previous page)
    # result: the report only when it is of this patch (`pending` while the id holds another's)
    patch_sha256: str = ""


class AgentAnswer(_Msg, frozen=True, kw_only=True):
    """The evaluator's reply to an agent: `ok` with the id/result(s), or `error` (the refusal)."""

    ok: bool
    error: str = ""
    id: str = ""
    duplicate: bool = False  # the same request (agent, run, model, instance, patch) was queued before
    # submit: queued | done (this very patch's report is there) | result: done | pending | lost
    # (neither queued nor stored: never submitted, or dead-lettered; `error` says so)
    status: str = ""
    result: dict[str, Any] | None = None
    results: list[dict[str, Any]] = msgspec.field(default_factory=list)
    more: bool = False  # results: rows beyond this page (ask again with `after` = its last id)


class DeadLetter(_Msg, frozen=True, kw_only=True):
    """A message a service gave up on, with the reason. The original payload is kept inline when
    it fits; a large one is stored in the object store (`payload_ref`) and the letter keeps its
    size, SHA-256 and first bytes, so a dead letter always fits the server's max payload."""

    subject: str  # the original subject
    service: str
    error: str
    error_type: str
    attempts: int
    payload: bytes  # the original payload, unchanged (empty when `payload_ref` is set)
    msg_id: str | None = None
    failed_at: str = ""
    stream_seq: int | None = None  # the original message's stream sequence: tells equal payloads apart
    payload_ref: str | None = None  # object-store name of the payload when too large to inline
    payload_size: int | None = None
    payload_sha256: str = ""
    payload_head: str = ""  # the first bytes, as text, for `dlq list`

    @property
    def id(self) -> str:
        digest = self.msg_id or self.payload_sha256[:16] or hashlib.sha256(self.payload).hexdigest()[:16]
        if self.stream_seq is not None:
            # One letter per original message: a redelivered message dead-lettered twice (crash
            # between the letter and the term) collapses, two equal payloads never do.
            return f"{self.subject}:{digest}:seq{self.stream_seq}"
        return f"{self.subject}:{digest}:{self.attempts}"


# ------------------------------------------------------------------------------------ codecs
SUBJECT_TYPES: Final[dict[str, type[msgspec.Struct]]] = {
    REPO_CANDIDATE: RepoCandidate,
    REPO_FOUND: RepoFound,
    COMMIT_SELECTED: CommitSelected,
    COMMIT_CLASSIFIED: CommitClassified,
    PATCH_BUILT: PatchBuilt,
    EVAL_REQUESTED: EvalRequested,
    EVAL_COMPLETED: EvalCompleted,
    VALIDATE_REQUESTED: ValidateRequested,
}

_ALL_TYPES: Final[list[type[msgspec.Struct]]] = [
    *SUBJECT_TYPES.values(),
    DeadLetter,
    AgentSubmit,
    AgentQuery,
    AgentAnswer,
]
_DECODERS: Final[dict[type[msgspec.Struct], msgspec.json.Decoder[Any]]] = {
    t: msgspec.json.Decoder(t) for t in _ALL_TYPES
}
_ENCODER: Final = msgspec.json.Encoder()

M = TypeVar("M", bound=msgspec.Struct)


def encode(msg: msgspec.Struct) -> bytes:
    return _ENCODER.encode(msg)


def decode(data: bytes, typ: type[M]) -> M:
    """Decode with the type's prebuilt decoder; any failure becomes `MalformedMessage`, an
    unknown `schema_version` `UnsupportedSchema` (checked before the fields, whose meaning may
    have changed in that version), a name or id no worker can process (a repository id with a
    NUL, a sha that is not one, a run id that cannot name its folder: `check_ids`)
    `MalformedMessage` naming the field."""
    try:
        result: M = _DECODERS[typ].decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:  # deep nesting: recursion
        version = _peek_version(data)
        if version is not None and version not in READABLE_SCHEMA_VERSIONS:
            raise _unsupported(typ, version) from exc
        raise MalformedMessage(f"cannot decode {typ.__name__}: {exc}") from exc
    version = getattr(result, "schema_version", SCHEMA_VERSION)
    if version not in READABLE_SCHEMA_VERSIONS:
        raise _unsupported(typ, version)
    check_ids(result)
    return result


class _Versioned(msgspec.Struct):
    schema_version: int | None = None


_VERSION_DECODER: Final = msgspec.json.Decoder(_Versioned)


def _peek_version(data: bytes) -> int | None:
    try:
        return _VERSION_DECODER.decode(data).schema_version
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def _unsupported(typ: type[msgspec.Struct], version: object) -> UnsupportedSchema:
    known = ", ".join(str(v) for v in sorted(READABLE_SCHEMA_VERSIONS))
    return UnsupportedSchema(
        f"{typ.__name__} has schema_version {version}; this worker reads version {known} "
        "(upgrade the worker, or replay the message once one that reads it runs)"
    )


def _ids(msg: msgspec.Struct) -> list[tuple[str, Callable[[str], str], str]]:  # noqa: PLR0911 - one per type
    """(field, check, value) for every name or id of a consumed message a worker builds a path, a
    key or a command line from; a value that fails its check can never be processed."""
    match msg:
        case RepoCandidate() | RepoFound():
            head = getattr(msg, "head_sha", None)
            return [
                ("repo", check_repo_id, msg.repo),
                ("url", check_text, msg.url),
                *([("head_sha", check_sha, head)] if head is not None else []),
            ]
        case CommitSelected():
            return [
                ("repo", check_repo_id, msg.repo),
                ("url", check_text, msg.url),
                ("sha", check_sha, msg.sha),
                ("parent", check_sha, msg.parent),
            ]
        case CommitClassified():
            return [(f"commit.{f}", check, v) for f, check, v in _ids(msg.commit)]
        case PatchBuilt():
            return [
                ("instance_id", check_instance_id, msg.instance_id),
                ("repo", check_repo_id, msg.repo),
                ("sha", check_sha, msg.sha),
                ("parent", check_sha, msg.parent),
            ]
        case EvalRequested():
            # instance_id is judged by the evaluator (an `unknown-instance` answer, see verdict.py)
            return [
                ("run_id", check_run_id, msg.run_id),
                *([("agent", check_agent, msg.agent)] if msg.agent else []),
            ]
        case ValidateRequested():
            return [("instance_id", check_instance_id, msg.instance_id)]
    return []


def check_agent(agent: str) -> str:
    if not AGENT_NAME.fullmatch(agent):
        raise BadInput(f"not an agent name: {_shown(agent)} ([a-z0-9][a-z0-9_-]{{0,31}})")
    return agent


def check_ids(msg: msgspec.Struct) -> None:
    """MalformedMessage naming the first field of `msg` whose name or id can never be processed
    (`decode` calls it: the worker dead-letters such a message at its first delivery, never
    retrying it `bus.max_deliver` times as if something were down)."""
    for field, check, value in _ids(msg):
        try:
            check(value)
        except BadInput as exc:
            raise MalformedMessage(f"{type(msg).__name__}.{field}: {exc}") from None


def msg_id(msg: msgspec.Struct) -> str:
    """The stable id of a message, used as Nats-Msg-Id."""
    value = getattr(msg, "id", None)
    if not isinstance(value, str):
        raise TypeError(f"{type(msg).__name__} has no stable id")
    return value
