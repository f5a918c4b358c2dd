"""Evaluate one agent patch for one instance; write the run's artifacts.

    OUT/runs/<run_id>/<model>/<instance_id>/report.json, patch.diff, build.log, test.log
    OUT/runs/<run_id>/<model>.summary.json
    OUT/runs/<run_id>/<model>.<run_id>.json (the run-level report, `runreport.py`)

Steps: the instance id is validated before any path is built → checks on the patch text (nothing
runs on a bad patch, checks.py) → three trees, `old` (base), `agent` (base + patch, applied to a
plain export by `git apply` in the jail, apply.py) and `expert` (the instance's commit); the
agent's tree is compared with the base after applying (checks.check_tree) → builds in the jail,
one tree visible per build: `old` and `expert` first, sharing a ccache, then `agent`, which may
only read it → the tests' meaning (`ctest --show-only=json-v1`) of the agent tree must equal the
original's (else `test-edit`) → every test once on the agent tree (all must pass) → original,
agent and expert timed interleaved with the builder's protocol, each tree read-only in its jail
with a fresh /tmp → scores. Only the timed runs hold a timing-core lease (`leases.timing_core`);
everything before them (export, patch, builds, test discovery, correctness runs) runs on the
build cores, so evaluation workers on one host take turns on a timing core only while timing. Without a working jail (bubblewrap) the evaluator refuses
(`untrusted-refused`) unless `evaluator.trust_patches`. Reports are written here only, outside
anything a jail sees, and reused only for the same patch (its sha256) unless `force`.

Verdicts: opt | correct | tests-failed | timeout | build-failed | apply-failed | empty-patch |
malformed-patch | too-large | unsafe-patch | test-edit | forbidden-file | instance-broken |
untrusted-refused | unknown-instance.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypedDict

import msgspec
from msgspec import UNSET

from cppperf.services.evaluator.apply import apply_patch
from cppperf.services.evaluator.checks import check_patch, check_tree, snapshot
from cppperf.services.evaluator.instances import EvalInstance, load_instance
from cppperf.services.evaluator.score import Score, score
from cppperf.services.evaluator.verdict import (
    apply_verdict,
    build_verdict,
    common_tests_verdict,
    correctness_verdict,
    instance_id_verdict,
    refusal,
    score_verdict,
    tests_defined_verdict,
    timing_verdict,
)
from cppperf.shared.domain import (
    BenchmarkSkip,
    EvalReport,
    EvalVerdict,
    FailedTest,
    NativeConfirmation,
    Oracle,
    SkippedBenchmark,
    Verdict,
)
from cppperf.shared.engine.backend import Backend, SideName, build_sides, export_tree
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.engine.benchmarks import Discovered, broken_on, is_benchmark, timed_edits, timed_run
from cppperf.shared.engine.benchmarks import find as find_benchmarks
from cppperf.shared.engine.cmake import StepResult, TestCase, test_description
from cppperf.shared.engine.leases import EXACT_METRICS, exact_metric, on_build_cores, timing_core
from cppperf.shared.engine.leftout import metric_limit
from cppperf.shared.engine.limits import limits_for
from cppperf.shared.engine.protocol import Drop, Measurement, check_metric, measure
from cppperf.shared.engine.sandbox import Limits, RunResult, jail_problem
from cppperf.shared.files import locked, write_atomic
from cppperf.shared.logging import get_logger
from cppperf.shared.messages import RUN_ID, evaluation_id
from cppperf.shared.mirror import ensure_local
from cppperf.shared.rules import Rules
from cppperf.shared.settings import Settings

log = get_logger(__name__)

Phase = Callable[[str, int, int], None]
SIDES = ("old", "agent", "expert")
BUILD_ORDER = ("old", "expert", "agent")  # the trusted trees fill the ccache the agent only reads
LOG_HEAD_TAIL = 100_000  # bytes of each build step's log kept on disk (head and tail each)


@dataclass(frozen=True)
class EvalRequest:
    run_id: str
    model: str
    instance_id: str
    patch: str
    # an agent's request (the bus): only an instance proven improved grades it — a not-improved
    # one was never gold-validated and its expert's speed-up, the bar an `opt` is held to, is not
    # significant (the CLI grades named unproven ids on purpose: cli/predictions.py); and a
    # reason it gets names no path of this host
    for_agent: bool = False

    @property
    def id(self) -> str:
        return evaluation_id(self.run_id, self.model, self.instance_id)


def safe_name(name: str, *, longest: int = 128) -> str:
    """`name` (a run id, a model) as one folder name: itself when it is one unchanged (the run
    id's rule, `messages.RUN_ID`) of at most `longest` characters, else its safe characters and
    `+` and a hash of the whole — `+` is not in an unchanged name, so two names never share a
    folder (`org/model` and `org_model`, `m` and `_m`, `m.`)."""
    if RUN_ID.fullmatch(name) and len(name) <= longest:
        return name
    kept = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[: longest - 11].rstrip("._") or "model"
    return f"{kept}+{hashlib.sha256(name.encode(errors='surrogateescape')).hexdigest()[:10]}"


def model_folder(model: str) -> str:
    """A model's folder (and file-name part): `safe_name` of at most 80 characters, so that
    `<model>.<run_id>.json` (a run id has up to 128) and its temporary file fit in 255 bytes."""
    return safe_name(model, longest=80)


def run_dir(settings: Settings, req: EvalRequest) -> Path:
    return run_dir_of(settings, req.run_id, req.model, req.instance_id)


def run_dir_of(settings: Settings, run_id: str, model: str, instance_id: str) -> Path:
    return settings.runs_path() / safe_name(run_id) / model_folder(model) / instance_id


def _write(path: Path, text: str) -> None:
    write_atomic(path, text)


def patch_sha256(patch: str) -> str:
    return hashlib.sha256(patch.encode("utf-8", "surrogateescape")).hexdigest()


def bounded(text: str, limit: int = LOG_HEAD_TAIL) -> str:
    """The first and last `limit` characters of `text` (a marker says how much was dropped)."""
    if len(text) <= 2 * limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - 2 * limit} characters dropped ...]\n{text[-limit:]}"


def evaluate(
    req: EvalRequest,
    settings: Settings,
    *,
    force: bool = False,
    on_phase: Phase | None = None,
    instance: EvalInstance | None = None,
    validating: bool = False,
) -> dict[str, Any]:
    """`evaluate_report` as the JSON report.json holds (gold validation, the API, the bus)."""
    return as_json(
        evaluate_report(
            req, settings, force=force, on_phase=on_phase, instance=instance, validating=validating
        )
    )


def read_report(path: Path) -> EvalReport | None:
    """A finished `report.json` as its Struct; None when there is none, or it is not a report of
    this version (then it is evaluated again). Python's JSON: a report may hold `Infinity`."""
    try:
        return msgspec.convert(json.loads(path.read_text()), EvalReport)
    except (OSError, ValueError, RecursionError):  # absent, not JSON, another shape, nested too deeply
        return None


def evaluate_report(
    req: EvalRequest,
    settings: Settings,
    *,
    force: bool = False,
    on_phase: Phase | None = None,
    instance: EvalInstance | None = None,
    validating: bool = False,
) -> EvalReport:
    """The report for one request (from disk when already finished for this very patch).
    `instance` is the instance (from the `instances` bucket); without it, its record is read from
    OUT/instances. An instance whose gold validation says it cannot grade (`oracle: none`) grades
    nobody (`instance-broken`), except its own validation (`validating`, gold.py)."""
    digest = patch_sha256(req.patch)
    unknown = instance_id_verdict(req.instance_id)  # before any path is built from it
    if unknown is not None:
        return _verdict(
            unknown,
            f"invalid instance id {req.instance_id[:200]!r} (owner__name-<sha12>)",
            instance_id=req.instance_id[:200],
            run_id=req.run_id,
            model=req.model,
            patch_sha256=digest,
        )
    out = run_dir(settings, req)
    # evaluations of one run, model and instance take turns on its folder (patches A and B at once,
    # on evaluator processes sharing the runs dir): never A's patch.diff beside B's report
    with locked(out.parent / f"{out.name}{LOCK_SUFFIX}"):
        return _in_run_dir(req, settings, out, digest, force, on_phase, instance, validating)


def _in_run_dir(
    req: EvalRequest,
    settings: Settings,
    out: Path,
    digest: str,
    force: bool,
    on_phase: Phase | None,
    instance: EvalInstance | None,
    validating: bool,
) -> EvalReport:
    report_path = out / "report.json"
    cached = None if force else read_report(report_path)
    if cached is not None and cached.patch_sha256 == digest:
        return cached
    report_path.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "patch.diff", req.patch)
    t0 = time.perf_counter()
    report = _evaluate(req, settings, out, on_phase or (lambda _p, _d, _t: None), instance, validating)
    report = msgspec.structs.replace(
        report,
        reason=short_reason(report.reason),
        instance_id=req.instance_id,
        run_id=req.run_id,
        model=req.model,
        evaluation_id=req.id,
        patch_sha256=digest,
        wall_seconds=round(time.perf_counter() - t0, 2),
    )
    _write(report_path, json.dumps(as_json(report), indent=1))
    return report


def as_json(report: EvalReport) -> dict[str, Any]:
    """The report as JSON-shaped builtins (what report.json holds): a decoding boundary."""
    out: dict[str, Any] = msgspec.to_builtins(report)
    return out


class _Built(TypedDict, total=False):
    """The report's fields once the three trees are built (every later verdict carries them)."""

    applied: bool
    applied_with: str
    builds: bool
    tests: list[str]
    benchmarks_skipped: list[SkippedBenchmark]


# characters of a report's reason: checks quote what a patch names (a file name can be 250 kB)
# and every agent's report is stored in the shared `evaluations` bucket, so it is cut here
REASON_LIMIT: Final = 2000


def short_reason(reason: str) -> str:
    """`reason` cut to `REASON_LIMIT` characters (a marker says how many were cut)."""
    if len(reason) <= REASON_LIMIT:
        return reason
    cut = len(reason) - REASON_LIMIT
    return f"{reason[:REASON_LIMIT]} [... {cut} characters cut]"


def _verdict(verdict: EvalVerdict, reason: str, **fields: Any) -> EvalReport:
    return EvalReport(verdict=verdict, opt=False, reason=reason, **fields)


def evaluation_metric(s: Settings, inst: EvalInstance) -> str:
    """The metric original, agent and expert are compared on: `evaluator.metric` when set, else
    the exact metric the instance was proven on (an instance proven on Cachegrind's counts is
    graded on them too), else `builder.metric`."""
    if s.evaluator.metric:
        return s.evaluator.metric
    if inst.metric in EXACT_METRICS:
        return inst.metric
    return s.builder.metric


def on_metric(s: Settings, inst: EvalInstance) -> Settings:
    """`s` with `builder.metric` the evaluation's metric (`evaluation_metric`): checks, limits,
    leases, measurement and report all follow it."""
    return with_metric(s, evaluation_metric(s, inst))


def with_metric(s: Settings, metric: str) -> Settings:
    """`s` with `builder.metric` = `metric` (`s` itself when it is already)."""
    if metric == s.builder.metric:
        return s
    return msgspec.structs.replace(s, builder=msgspec.structs.replace(s.builder, metric=metric))


def cannot_grade(inst: EvalInstance, *, for_agent: bool) -> str | None:
    """Why `inst` grades nobody (`instance-broken`), or None: its gold validation found no oracle
    (an agent would pick exactly these); or, for an agent's request (`for_agent`), it is not
    proven improved."""
    if inst.oracle == Oracle.NONE:
        return (
            f"instance {inst.instance_id} cannot grade: its gold validation found no workload on which "
            "the expert's patch is opt and a comment-only patch is not (oracle none)"
        )
    if for_agent and inst.verdict != Verdict.IMPROVED:
        return (
            f"instance {inst.instance_id} cannot grade: it is {inst.verdict or 'of no known verdict'}, "
            "not proven improved (agents are graded only on proven instances)"
        )
    return None


def refused_report(req: EvalRequest, verdict: EvalVerdict, reason: str) -> EvalReport:
    """The report of a request answered without evaluating it (nothing built, nothing written)."""
    return _verdict(
        verdict,
        short_reason(reason),
        instance_id=req.instance_id,
        run_id=req.run_id,
        model=req.model,
        evaluation_id=req.id,
        patch_sha256=patch_sha256(req.patch),
    )


def _evaluate(
    req: EvalRequest,
    s: Settings,
    out: Path,
    phase: Phase,
    instance: EvalInstance | None,
    validating: bool = False,
) -> EvalReport:
    ev = s.evaluator
    try:
        inst = instance or load_instance(req.instance_id, Path(s.out_dir))
    except Exception as exc:
        if req.for_agent:  # the record's path and the reader's error are this host's business
            return _verdict(
                EvalVerdict.UNKNOWN_INSTANCE, f"unknown instance {req.instance_id!r}: no readable record"
            )
        return _verdict(EvalVerdict.UNKNOWN_INSTANCE, str(exc))
    why = None if validating else cannot_grade(inst, for_agent=req.for_agent)
    if why is not None:
        return _verdict(EvalVerdict.INSTANCE_BROKEN, why)
    s = on_metric(s, inst)
    base = {"multi_file": inst.multi_file, "files": inst.files}
    rules = Rules.from_settings(s.mining)
    check = check_patch(
        req.patch, rules, max_bytes=ev.max_patch_bytes, allow_build_changes=ev.allow_build_changes
    )
    if not check.ok:
        return _verdict(check.verdict or EvalVerdict.MALFORMED_PATCH, check.reason, applied=False, **base)
    docker = s.builder.backend == "docker"
    why_not = jail_problem()
    refused = refusal(why_not, trust_patches=ev.trust_patches, docker=docker)
    if refused is not None:
        return _verdict(
            refused,
            f"no sandbox for agents' code here: {why_not} (install bubblewrap; or pass --trust-patches "
            "to run it unsandboxed, only for patches you trust)",
            **base,
        )
    if why_not and not docker:
        log.warning("evaluating without the jail (trust_patches)", reason=why_not, evaluation=req.id)
    repo_path = ensure_local(inst.url, inst.repo, s.mirror_dir())
    ws = workspace(s, req)
    with in_use(ws):
        return _in_workspace(req, inst, s, out, phase, ws, repo_path, rules, why_not, base)


def _in_workspace(
    req: EvalRequest,
    inst: EvalInstance,
    s: Settings,
    out: Path,
    phase: Phase,
    ws: Path,
    repo_path: Path,
    rules: Rules,
    why_not: str | None,
    base: dict[str, Any],
) -> EvalReport:
    docker = s.builder.backend == "docker"
    # local: always sandboxed, jailed when bubblewrap works; docker: see docker_backend.py
    # hardened for agents' code (or an InfraFailure: never a silent unhardened run)
    backend = make_backend(s.builder, ws, source=(repo_path, inst.expert_sha, inst.date), untrusted=True)
    sandbox = "docker" if docker else ("none" if why_not else "bwrap")
    jailed = not why_not  # the patch is applied on the host: in the jail when there is one
    report: EvalReport | None = None
    try:
        with on_build_cores(s.builder):  # untimed work (and its children) off the timing cores
            report = msgspec.structs.replace(
                _run(req, inst, s, backend, repo_path, out, phase, ws, rules, jailed), sandbox=sandbox, **base
            )
            return report
    finally:
        if not keep_workspace(s, report):
            backend.cleanup()
            shutil.rmtree(ws, ignore_errors=True)  # the host side too (exports, patch, logs)


def workspace(s: Settings, req: EvalRequest) -> Path:
    """This evaluation's own folder, `work_dir/eval/<hash of the id>-<random>` (not made here: the
    backend makes it as before). Not the id's alone: an agent repeats an id at will (patches A and
    B for one run, model and instance at once), and evaluator processes sharing a work dir
    (`builder.work_dir`) would then build, run and remove their trees in one folder — B's build
    rewriting the binaries A's tests run."""
    return (
        s.work_dir() / "eval" / f"{hashlib.sha256(req.id.encode()).hexdigest()[:16]}-{uuid.uuid4().hex[:12]}"
    )


LOCK_SUFFIX = ".lock"


@contextlib.contextmanager
def in_use(ws: Path) -> Iterator[None]:
    """Hold `<ws>.lock` (an flock, released by the kernel when the process dies) while the
    evaluation may use `ws`; the lock file is removed at the end, whether the workspace is
    removed or kept (`keep_workspace`: then nothing marks it, and nothing ever removes it). A
    lock file nobody holds is an evaluator that died mid-evaluation (`remove_stale_workspaces`)."""
    with locked(ws.parent / (ws.name + LOCK_SUFFIX), remove=True):
        yield


def remove_stale_workspaces(s: Settings) -> list[Path]:
    """Remove the workspaces (`work_dir/eval/<hash>-<random>`) of evaluations whose evaluator died
    (SIGKILL, OOM, power): their `<ws>.lock` exists and nobody holds it. A workspace being used
    (its lock held, by this or another process sharing the work dir) and one kept on purpose or
    made before these locks (no lock file) are left alone. Random names: no later evaluation
    reuses a folder, so without this they stayed for good."""
    root = s.work_dir() / "eval"
    removed: list[Path] = []
    try:
        locks = sorted(root.glob(f"*{LOCK_SUFFIX}"))
    except OSError as exc:  # an unreadable work dir: the evaluations will say so themselves
        log.warning("stale_workspace_not_removed", workspace=str(root), error=str(exc))
        return removed
    for lock in locks:
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:  # removed meanwhile (its evaluation ended)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: an evaluation in progress
            os.close(fd)
            continue
        ws = lock.with_name(lock.name.removesuffix(LOCK_SUFFIX))
        try:
            shutil.rmtree(ws, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(ws)
        except OSError as exc:  # a read-only or broken work dir: say so, never stop the evaluator
            log.warning("stale_workspace_not_removed", workspace=str(ws), error=str(exc))
        finally:
            os.close(fd)
    if removed:
        log.warning("stale_workspace_removed", count=len(removed), workspaces=[p.name for p in removed])
    return removed


def keep_workspace(s: Settings, report: EvalReport | None) -> bool:
    """`builder.keep` keeps every workspace; `evaluator.keep_failed` (debugging) those of
    evaluations that raised or did not end `opt`/`correct`. Else work_dir/eval/<hash>-<random> is removed."""
    if s.builder.keep:
        return True
    ok = report is not None and report.verdict in (EvalVerdict.OPT, EvalVerdict.CORRECT)
    return s.evaluator.keep_failed and not ok


class _Stop(Exception):
    def __init__(self, report: EvalReport) -> None:
        self.report = report


def _prepare(
    req: EvalRequest,
    inst: EvalInstance,
    backend: Backend,
    repo: Path,
    out: Path,
    ws: Path,
    rules: Rules,
    *,
    jailed: bool,
    allow_build_changes: bool,
) -> str:
    """Export the three trees and apply the patch to `agent`; the method that applied it.
    The patch is applied to a plain export (no .git), in the jail when there is one, and the
    applied tree is checked against the base; the three trees are then the backend's three sides
    (with the docker backend they go into the container)."""
    if ws.exists():
        shutil.rmtree(ws)
    (ws / "logs").mkdir(parents=True)
    (ws / "current").mkdir()
    agent_src = ws / "agent" / "src"
    export_tree(repo, inst.base_sha, agent_src, backend.submodules)
    before = snapshot(agent_src)
    (ws / "patch").mkdir()
    patch_file = ws / "patch" / "agent.patch"
    patch_file.write_text(req.patch)
    applied = apply_patch(agent_src, patch_file, jailed=jailed)
    if applied.ok:
        tree = check_tree(before, snapshot(agent_src), rules, allow_build_changes=allow_build_changes)
        if not tree.ok:
            _write(out / "build.log", bounded(applied.log) + "\n")
            raise _Stop(
                _verdict(
                    tree.verdict or EvalVerdict.UNSAFE_PATCH,
                    tree.reason,
                    applied=False,
                    apply_log=applied.log[-3000:],
                )
            )
        backend.prepare(repo, {"old": inst.base_sha, "agent": agent_src, "expert": inst.expert_sha})
    _write(out / "build.log", bounded(applied.log) + "\n")
    not_applied = apply_verdict(applied.ok)
    if not_applied is not None:
        raise _Stop(
            _verdict(
                not_applied,
                "no method applied the patch (git apply, git apply --recount -C1)",
                applied=False,
                apply_log=applied.log[-3000:],
            )
        )
    return applied.method


def _build_all(backend: Backend, out: Path, applied_with: str, phase: Phase) -> None:
    def keep_logs(side: SideName, steps: list[StepResult]) -> None:
        with (out / "build.log").open("a") as fh:
            for st in steps:
                if st.log_path and st.log_path.is_file():
                    fh.write(
                        f"\n===== {side} {st.step} =====\n{bounded(st.log_path.read_text(errors='replace'))}"
                    )

    failed = build_sides(
        backend, BUILD_ORDER, on_built=keep_logs, phase=lambda _p, done, total: phase("build", done, total)
    )
    if failed is not None:
        side, last = failed.side, failed.step
        verdict = build_verdict(side)
        if verdict == EvalVerdict.BUILD_FAILED:
            raise _Stop(
                _verdict(
                    verdict,
                    f"{last.step} failed ({last.category})",
                    applied=True,
                    applied_with=applied_with,
                    build_tail=last.result.output[-2000:],
                )
            )
        why = f"the {side} side does not build"
        if side == "expert":  # its compiler's output can quote the expert's change: not for agents
            why += f" ({last.step} failed: {last.category}; its log is build.log in the run folder)"
        else:
            why += f": {last.result.output[-800:]}"
        raise _Stop(_verdict(verdict, why, applied=True, applied_with=applied_with))
    phase("build", 3, 3)


def timed_workloads(
    common: list[str], inst: EvalInstance, benchmarks: list[str], *, exact: bool
) -> list[str]:
    """What is timed: the expert's improved tests and the benchmarks, else the tests that run its
    change (coverage), else every test; counted under Valgrind (`exact`), never a test the builder
    could not count (`inst.left_out`) while another is left."""
    countable = [n for n in common if not (exact and n in set(inst.left_out))] or common
    timed = [n for n in countable if n in set(inst.improved_tests)] + benchmarks
    return timed or [n for n in countable if n in set(inst.deciding_tests)] or countable


def _same_tests(backend: Backend, applied_with: str) -> None:
    """The agent's tree must define the original's tests, by meaning (cmake.test_description)."""
    agent = test_description(backend.tests_json("agent"), backend.tree_root("agent"))
    edited = tests_defined_verdict(
        agent == test_description(backend.tests_json("old"), backend.tree_root("old"))
    )
    if edited is not None:
        raise _Stop(
            _verdict(
                edited,
                "the agent's tree defines different tests "
                "(ctest --show-only=json-v1 differs from the original's)",
                applied=True,
                applied_with=applied_with,
            )
        )


def _benchmarks(backend: Backend, s: Settings, inst: EvalInstance, applied_with: str) -> Discovered:
    """The instance's own benchmarks (those that proved it), timed beside its improved tests; the
    agent may not change their definitions (their own sources, from the original's file API)."""
    benches = find_benchmarks(backend, SIDES, s.builder, only=inst.improved_benchmarks)
    if edits := timed_edits(backend, benches, "old", "agent"):
        why = f"edits the source of a timed benchmark: {', '.join(edits)} (benchmarks are the specification)"
        raise _Stop(_verdict(EvalVerdict.TEST_EDIT, why, applied=True, applied_with=applied_with))
    if broken := broken_on(benches, "agent"):  # the agent's tree breaks a benchmark the others run
        first = broken[0]
        verdict = EvalVerdict.TIMEOUT if first.reason == BenchmarkSkip.TIMEOUT else EvalVerdict.TESTS_FAILED
        why = f"benchmark {first.name} on the agent's tree: {first.reason} {first.detail[:300]}"
        raise _Stop(_verdict(verdict, why, applied=True, applied_with=applied_with, tests_pass=False))
    return benches


FAILURE_OUTPUT: Final = 6000  # characters of failing tests' output in one report
TEST_OUTPUT: Final = 1500  # characters of one failing test's output (its tail)


def _tail(output: str, failures: list[FailedTest]) -> str:
    """The tail of the next failing test's output the report keeps: the first failures' tails,
    `TEST_OUTPUT` characters each, `FAILURE_OUTPUT` in all (every test of a big project failing loudly must not make
    an agent's stored report one of megabytes)."""
    keep = max(0, min(TEST_OUTPUT, FAILURE_OUTPUT - sum(len(f.output_tail) for f in failures)))
    return output[-keep:] if keep else ""


def _correctness(
    backend: Backend,
    tests: dict[str, TestCase],
    limits_for: Callable[[TestCase], Limits],
    out: Path,
    phase: Phase,
) -> list[FailedTest]:
    """Every test once on the agent tree; the failures."""
    failures: list[FailedTest] = []
    with (out / "test.log").open("w") as log:
        for i, (name, t) in enumerate(sorted(tests.items())):
            phase("correctness", i, len(tests))
            res = backend.run_test("agent", t, limits_for(t))
            passed = t.passed(res.returncode, res.output, timed_out=res.timed_out)
            log.write(
                f"===== {name}: {'PASS' if passed else 'FAIL'} (exit {res.returncode}"
                f"{', timed out' if res.timed_out else ''}, {res.wall_s:.3f}s) =====\n{res.output}\n"
            )
            if not passed:
                failures.append(
                    FailedTest(
                        test=name,
                        returncode=res.returncode,
                        timed_out=res.timed_out,
                        output_tail=_tail(res.output, failures),
                    )
                )
    return failures


def _run(  # noqa: PLR0911 - one verdict per stage that can stop an evaluation
    req: EvalRequest,
    inst: EvalInstance,
    s: Settings,
    backend: Backend,
    repo: Path,
    out: Path,
    phase: Phase,
    ws: Path,
    rules: Rules,
    jailed: bool,
) -> EvalReport:
    ev = s.evaluator
    try:
        phase("prepare", 0, 1)
        applied_with = _prepare(
            req,
            inst,
            backend,
            repo,
            out,
            ws,
            rules,
            jailed=jailed,
            allow_build_changes=ev.allow_build_changes,
        )
        phase("prepare", 1, 1)
        _build_all(backend, out, applied_with, phase)
        _same_tests(backend, applied_with)
        benches = _benchmarks(backend, s, inst, applied_with)
    except _Stop as stop:
        return stop.report
    tests = {side: {t.name: t for t in backend.tests(side) if not t.disabled} for side in SIDES}
    common = sorted(set(tests["old"]) & set(tests["agent"]) & set(tests["expert"]))
    broken = common_tests_verdict(common)
    if broken is not None:
        return _verdict(broken, "no test exists on all three sides", applied=True)

    def limits(t: TestCase, cpu: int | None = None, instructions: bool = False) -> Limits:
        return limits_for(t, s.builder, timeout=ev.test_timeout, cpu=cpu, instructions=instructions)

    info = _Built(applied=True, applied_with=applied_with, builds=True, tests=common)
    if benches.skipped:
        info["benchmarks_skipped"] = list(benches.skipped)
    exact = exact_metric(s.builder)
    timed = timed_workloads(common, inst, benches.common, exact=exact)
    workloads = {side: {**tests[side], **benches.by_side[side]} for side in SIDES}
    count = check_metric(backend, s.builder)
    # correctness runs are untimed: on the build cores, before the timing core is leased, so a
    # second evaluation worker can time while this one checks. A timed test cannot behave only
    # while it is checked: every timed run on the leased core must pass too (measure).
    failures = _correctness(backend, {n: tests["agent"][n] for n in common}, limits, out, phase)
    failed = correctness_verdict([f.timed_out for f in failures])
    if failed is not None:
        names = ", ".join(f.test for f in failures)
        return _verdict(failed, f"failing tests: {names}", **info, tests_pass=False, failing_tests=failures)
    trees = Trees(backend, timed, workloads, benches.common, limits, phase)
    meas, pin, cpu_fallback = _timed(trees, s, count=count)
    if cpu_fallback is not None:  # Valgrind could not count what decides: timed on CPU instead
        s, exact = with_metric(s, "cpu"), False
    timed = [n for n in timed if n not in meas.left_out]
    if meas.failure is not None:
        f = meas.failure
        timing = timing_verdict(f.side, timed_out=f.timed_out)
        if timing != EvalVerdict.INSTANCE_BROKEN:
            why = f"test {f.test} failed during timing (round {f.round}): flaky or nondeterministic"
            return _verdict(timing, why, **info, tests_pass=False)
        return _verdict(timing, f"test {f.test} failed on the {f.side} side during timing", **info)
    sc = score(
        {n: meas.samples[n].by_metric(meas.metric_of(n)) for n in timed},
        alpha=s.builder.alpha,
        min_improvement=s.builder.min_improvement,
        opt_fraction=ev.opt_fraction,
        resamples=s.builder.bootstrap_resamples,
        seed=s.builder.seed,
        exact=[n for n in timed if meas.metric_of(n) == "cachegrind"],
        tolerance=s.builder.exact_tolerance,
    )
    opt, reason = sc.opt, ""
    confirmation: NativeConfirmation | None = None
    confirm_samples: dict[str, dict[str, list[float]]] = {}
    # counts can be made to disagree with the work, time cannot: an opt on counts is timed too
    # every counted test (one the count leaves alone may be slower natively), when one improved
    counted = [n for n in timed if not is_benchmark(n)]
    on_counts = [n for n in counted if sc.per_test[n].agent_improved]
    if opt and exact and on_counts:
        step = _confirm(s, counted, on_counts, workloads, backend, limits, phase)
        if isinstance(step, EvalReport):  # a run failed natively that passed counted
            return msgspec.structs.replace(step, **info)
        confirmation, confirm_samples = step
        opt, reason = confirmation.confirmed, _unconfirmed(confirmation)
    return EvalReport(
        verdict=score_verdict(opt),
        opt=opt,
        reason=reason,
        **info,
        tests_pass=True,
        timed_tests=timed,
        timed_benchmarks=benches.common,
        left_out=dict(meas.left_out) or UNSET,
        cpu_fallback=cpu_fallback.reason if cpu_fallback else UNSET,
        cpu_fallback_expert=(cpu_fallback and cpu_fallback.expert_where) or UNSET,
        rounds=s.builder.exact_runs if exact else ev.runs,
        seed=s.builder.seed,
        per_test=sc.per_test,
        gm_speedup_agent=sc.gm_speedup_agent,
        gm_speedup_expert=sc.gm_speedup_expert,
        fraction_of_expert=sc.fraction_of_expert,
        agent_significant=sc.agent_significant,
        agent_regressed=sc.agent_regressed,
        samples={n: meas.samples[n].by_metric(meas.metric_of(n)) for n in timed},
        samples_wall={n: meas.samples[n].wall for n in timed},
        samples_cpu={n: meas.samples[n].cpu for n in timed},
        samples_est_cycles={n: c for n in timed if (c := meas.samples[n].est_cycles)} or UNSET,
        metric=s.builder.metric,
        decided_on=dict(meas.decided_on),
        repeats=dict(meas.repeats),
        leased_core=pin,
        native_confirmation=confirmation or UNSET,
        samples_confirm=confirm_samples or UNSET,
    )


@dataclass(frozen=True)
class CpuFallback:
    """Why the exact metric could not grade and the trees were timed on CPU instead. `expert_where`:
    where in the expert's tree Valgrind stopped (the expert's business: the operator's report
    keeps it as `cpu_fallback_expert`, an agent's view drops it)."""

    reason: str
    expert_where: str = ""


@dataclass(frozen=True)
class Trees:
    """What a measurement of the three trees needs besides the settings: the backend, the timed
    workloads (their names, and each side's), the benchmarks among them, the limits, progress."""

    backend: Backend
    timed: list[str]
    workloads: Mapping[str, Mapping[str, TestCase]]
    benchmarks: list[str]
    limits: Callable[..., Limits]
    phase: Phase


def _timed(trees: Trees, s: Settings, *, count: bool) -> tuple[Measurement, int | None, CpuFallback | None]:
    """The three trees timed (or counted) on the leased timing core; the core; and, when the
    exact metric met its limit on what decides, why the trees were timed on CPU instead.

    Under the exact metric a test that fails counted on every side and passes natively on every
    side is left out (`leftout.metric_limit`). When that cannot be (it is the last workload), or
    a run met an instruction Valgrind lacks (an agent's AVX-512 is an optimisation, not a fault),
    the counts cannot grade: the measurement is made once more on CPU time — as the builder's
    `cpu_fallback` does — never blamed on the agent's tree."""
    meas, pin, drop = _measure_on(trees, s, count=count)
    fallback = _uncountable(meas, drop)
    if fallback is None:
        return meas, pin, None
    log.info("eval_cpu_fallback", reason=fallback.reason)
    cpu = with_metric(s, "cpu")
    meas, pin, _ = _measure_on(trees, cpu, count=check_metric(trees.backend, cpu.builder))
    return meas, pin, fallback


def _measure_on(trees: Trees, s: Settings, *, count: bool) -> tuple[Measurement, int | None, Drop | None]:
    """One measurement of the three trees on `s`'s metric; the leased core; under the exact
    metric, the rule that left out what Valgrind cannot count (`drop`)."""
    ev, exact = s.evaluator, exact_metric(s.builder)
    backend, workloads, limits, phase = trees.backend, trees.workloads, trees.limits, trees.phase
    with timing_core(s.builder, phase, priority=ev.lease_priority) as pin:

        def pinned(t: TestCase) -> Limits:
            if is_benchmark(t.name):  # timed by its own JSON, never counted
                return limits_for(t, s.builder, cpu=pin)
            if exact:  # counted under Valgrind, on any core
                return limits_for(t, s.builder, timeout=ev.test_timeout, counted=True)
            return limits(t, pin, count)

        def run_one(side: str, name: str) -> RunResult:
            t = workloads[side][name]
            return timed_run(backend, side, t, pinned(t))

        def native(side: str, name: str) -> RunResult:  # untimed, on the build cores
            t = workloads[side][name]
            return timed_run(backend, side, t, limits(t))

        drop = metric_limit(SIDES, run_one, native) if exact else None
        meas = measure(
            trees.timed,
            run_one,
            # an exact count needs no warm-up: a few identical runs (as the builder counts)
            rounds=s.builder.exact_runs if exact else ev.runs,
            warmup=0 if exact else s.builder.warmup,
            seed=s.builder.seed,
            sides=SIDES,
            progress=lambda d, t: phase("measure", d, t),
            metric=s.builder.metric,
            multithread_ratio=s.builder.multithread_ratio,
            floor=0.0 if exact else s.builder.sample_floor,
            max_repeats=s.builder.max_repeats,
            pinned=dict.fromkeys(trees.benchmarks, 1),
            drop=drop,  # what Valgrind cannot count on any side (and runs natively on all) is left out
        )
    return meas, pin, drop


def _uncountable(meas: Measurement, drop: Drop | None) -> CpuFallback | None:
    """Why `meas`'s failed counted run is the exact metric's limit, not a tree's (None when it is
    not, or nothing failed). `drop` is asked here only about the last workload still measured
    (`measure` never leaves out the last: it asked about every other failure itself)."""
    f = meas.failure
    if f is None or drop is None:
        return None
    if f.valgrind_unhandled:
        if f.side == "expert":  # where in the expert's tree (function, file, line): not the agent's to read
            why = f"Valgrind cannot run {f.test} on the expert side (an instruction it lacks)"
            return CpuFallback(f"{why}: timed on cpu instead", expert_where=f.valgrind_unhandled)
        why = f"Valgrind cannot run {f.test} on the {f.side} side ({f.valgrind_unhandled})"
        return CpuFallback(f"{why}: timed on cpu instead")
    if len(meas.samples) > 1:  # `measure` asked `drop` already, and the failure stood
        return None
    limit = drop(f)
    return CpuFallback(f"{f.test} {limit}: timed on cpu instead") if limit else None


def _unconfirmed(c: NativeConfirmation) -> str:
    """The reason of an `opt` on counts that native time did not confirm ("" when it did)."""
    if c.confirmed:
        return ""
    speedups = ", ".join(
        f"{n} {x:.2f}x (expert {c.expert_speedup.get(n, 0):.2f}x)" for n, x in sorted(c.speedup.items())
    )
    return (
        f"opt on Cachegrind's counts but not in native CPU time (speed-up {speedups}): "
        "a patch must run faster, not only count fewer instructions under Valgrind"
    )


def _confirm(
    s: Settings,
    tests: list[str],
    on_counts: list[str],
    workloads: dict[str, dict[str, TestCase]],
    backend: Backend,
    limits: Callable[[TestCase, int | None, bool], Limits],
    phase: Phase,
) -> tuple[NativeConfirmation, dict[str, dict[str, list[float]]]] | EvalReport:
    """Confirm an `opt` decided on exact counts by native CPU time: the three trees,
    `evaluator.confirm_runs` interleaved rounds (the first a warm-up; short tests get more, as
    many as fit in `evaluator.confirm_seconds`, at most `evaluator.confirm_max_runs`, fixed from
    the warm-up's durations) on a leased timing core, without Valgrind, scored as a timed
    evaluation is (`score`): confirmed when that is `opt` too — the agent significantly faster
    than the original on one of `on_counts` (the tests its counts improved: the hypotheses the
    counted runs chose, corrected over that family alone), slower on none of `tests` (every
    counted test), and not clearly slower than the expert on any. A patch that detects
    Valgrind (its client request, its preload library, its mappings, …) and does less work
    there counts like a faster one but runs like the original (or like a lesser patch); whatever
    the means, the time shows it. A test failing natively: its verdict."""
    ev = s.evaluator
    native = msgspec.structs.replace(s.builder, metric="cpu")

    with timing_core(native, phase, priority=ev.lease_priority) as pin:

        def run_one(side: str, name: str) -> RunResult:
            t = workloads[side][name]
            return timed_run(backend, side, t, limits(t, pin, False))

        meas = measure(
            tests,
            run_one,
            rounds=ev.confirm_runs,
            warmup=1,
            budget=ev.confirm_seconds,
            max_rounds=ev.confirm_max_runs,
            seed=s.builder.seed + 1,
            sides=SIDES,
            progress=lambda d, t: phase("confirm", d, t),
            metric="cpu",
            multithread_ratio=s.builder.multithread_ratio,
            floor=s.builder.sample_floor,
            max_repeats=s.builder.max_repeats,
        )
    if meas.failure is not None:
        f = meas.failure
        why = f"test {f.test} failed natively during the confirmation of its counts (round {f.round})"
        return _verdict(timing_verdict(f.side, timed_out=f.timed_out), why, tests_pass=False)
    kept = {n: dict(meas.samples[n].by_metric(meas.metric_of(n))) for n in tests}  # warm-up dropped
    return native_verdict(s, kept, on_counts, rounds=meas.rounds, leased_core=pin), kept


def native_verdict(
    s: Settings,
    kept: Mapping[str, Mapping[str, list[float]]],
    on_counts: list[str],
    *,
    rounds: int,
    leased_core: int | None,
) -> NativeConfirmation:
    """The confirmation's decision on native samples (`kept[test][side]`, every counted test):
    confirmed when the agent is significantly faster than the original on one of `on_counts`
    — corrected over that family alone: the counted runs chose these hypotheses on other data —,
    significantly slower on none of `kept` (corrected over all of them), and not clearly slower
    than the expert on any."""

    def timed_score(names: Collection[str]) -> Score:
        return score(
            {n: kept[n] for n in names},
            alpha=s.builder.alpha,
            min_improvement=s.builder.min_improvement,
            opt_fraction=s.evaluator.opt_fraction,
            resamples=s.builder.bootstrap_resamples,
            seed=s.builder.seed,
        )

    every, family = timed_score(kept), timed_score([n for n in on_counts if n in kept])
    per = every.per_test
    improved = [n for n, v in family.per_test.items() if v.agent_improved]
    short = [n for n, v in per.items() if not v.within_opt_fraction]
    return NativeConfirmation(
        rounds=rounds,
        confirmed=bool(improved) and not every.agent_regressed and not short,
        speedup={n: round(v.agent_speedup, 4) for n, v in per.items()},
        expert_speedup={n: round(v.expert_speedup, 4) for n, v in per.items()},
        improved=improved,
        regressed=[n for n, v in per.items() if v.agent_regressed],
        short_of_expert=short,
        leased_core=leased_core,
    )


class SummaryBlock(msgspec.Struct, kw_only=True):
    """Counts over some of a model's reports."""

    instances: int
    verdicts: dict[str, int]
    applied: int
    builds: int
    tests_pass: int
    opt: int
    opt_rate: float


class RunSummary(msgspec.Struct, kw_only=True):
    """`OUT/runs/<run_id>/<model>.summary.json`: Table 2 of the paper for one model."""

    run_id: str
    model: str
    overall: SummaryBlock
    single_file: SummaryBlock
    multi_file: SummaryBlock


def _block(rs: list[EvalReport]) -> SummaryBlock:
    verdicts: dict[str, int] = {}
    for r in rs:
        verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
    n = len(rs)
    opt = sum(r.opt for r in rs)
    return SummaryBlock(
        instances=n,
        verdicts=verdicts,
        applied=sum(r.applied is True for r in rs),
        builds=sum(r.builds is True for r in rs),
        tests_pass=sum(r.tests_pass is True for r in rs),
        opt=opt,
        opt_rate=round(opt / n, 4) if n else 0.0,
    )


def summarize(settings: Settings, run_id: str, model: str) -> RunSummary:
    """Counts and `opt` rate over a model's reports, overall and single- vs multi-file (Table 2);
    a report.json that is not a report is left out."""
    root = settings.runs_path() / safe_name(run_id) / model_folder(model)
    reports = [r for p in sorted(root.glob("*/report.json")) if (r := read_report(p)) is not None]
    summary = RunSummary(
        run_id=run_id,
        model=model,
        overall=_block(reports),
        single_file=_block([r for r in reports if r.multi_file is not True]),
        multi_file=_block([r for r in reports if r.multi_file is True]),
    )
    _write(
        root.parent / f"{model_folder(model)}.summary.json",
        json.dumps(msgspec.to_builtins(summary), indent=1),
    )
    return summary
