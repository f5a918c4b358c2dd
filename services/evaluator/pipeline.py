"""Evaluate one agent patch for one instance; write the run's artifacts.

    runs/<run_id>/<model>/<instance_id>/report.json, patch.diff, build.log, test.log
    runs/<run_id>/<model>.summary.json

Steps: checks (nothing runs on a bad patch) → three trees in one workspace, `old` (base), `agent`
(base + patch, applied by `git apply`, `--3way`, then `patch --fuzz`) and `expert` (the
instance's commit) → builds sharing one ccache (the agent tree reuses the original's objects) →
every test once on the agent tree (all must pass) → original, agent and expert timed interleaved
with the builder's protocol → scores. Every test run is sandboxed (network unshared, memory, CPU
time, process and output limits). A finished report is not recomputed unless `force`.

Verdicts: opt | correct | tests-failed | timeout | build-failed | apply-failed | empty-patch |
malformed-patch | too-large | unsafe-patch | test-edit | instance-broken | untrusted-refused.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cppperf.services.evaluator.apply import apply_patch, init_tree
from cppperf.services.evaluator.checks import check_patch
from cppperf.services.evaluator.instances import EvalInstance, load_instance
from cppperf.services.evaluator.score import score
from cppperf.services.filter.rules import Rules
from cppperf.shared.domain import EvalVerdict
from cppperf.shared.engine.backend import Backend, SideName, build_sides, export_tree
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.engine.cmake import StepResult, TestCase, normalise
from cppperf.shared.engine.leases import timing_core
from cppperf.shared.engine.limits import limits_for
from cppperf.shared.engine.protocol import check_metric, measure
from cppperf.shared.engine.sandbox import Limits, RunResult, network_prefix
from cppperf.shared.files import write_atomic
from cppperf.shared.messages import evaluation_id
from cppperf.shared.mirror import ensure_local
from cppperf.shared.settings import Settings

Phase = Callable[[str, int, int], None]
SIDES = ("old", "agent", "expert")


@dataclass(frozen=True)
class EvalRequest:
    run_id: str
    model: str
    instance_id: str
    patch: str

    @property
    def id(self) -> str:
        return evaluation_id(self.run_id, self.model, self.instance_id)


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def run_dir(settings: Settings, req: EvalRequest) -> Path:
    return Path(settings.evaluator.runs_dir) / safe_name(req.run_id) / safe_name(req.model) / req.instance_id


def _write(path: Path, text: str) -> None:
    write_atomic(path, text)


def evaluate(
    req: EvalRequest,
    settings: Settings,
    *,
    force: bool = False,
    on_phase: Phase | None = None,
    instance: EvalInstance | None = None,
) -> dict[str, Any]:
    """The report for one request (from disk when already finished). `instance` is the
    instance (from the `instances` bucket); without it, its record is read from OUT/instances."""
    out = run_dir(settings, req)
    report_path = out / "report.json"
    if report_path.is_file() and not force:
        cached: dict[str, Any] = json.loads(report_path.read_text())
        return cached
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "patch.diff", req.patch)
    t0 = time.perf_counter()
    report = _evaluate(req, settings, out, on_phase or (lambda _p, _d, _t: None), instance)
    report.update(
        instance_id=req.instance_id,
        run_id=req.run_id,
        model=req.model,
        evaluation_id=req.id,
        wall_seconds=round(time.perf_counter() - t0, 2),
    )
    _write(report_path, json.dumps(report, indent=1))
    return report


def _verdict(verdict: EvalVerdict, reason: str, **extra: Any) -> dict[str, Any]:
    return {"verdict": verdict, "opt": False, "reason": reason, **extra}


def _evaluate(
    req: EvalRequest, s: Settings, out: Path, phase: Phase, instance: EvalInstance | None
) -> dict[str, Any]:
    ev = s.evaluator
    try:
        inst = instance or load_instance(req.instance_id, Path(s.out_dir))
    except Exception as exc:
        return _verdict(EvalVerdict.UNKNOWN_INSTANCE, str(exc))
    base = {"multi_file": inst.multi_file, "files": inst.files}
    check = check_patch(req.patch, Rules.from_settings(s.mining), max_bytes=ev.max_patch_bytes)
    if not check.ok:
        return _verdict(check.verdict or EvalVerdict.MALFORMED_PATCH, check.reason, applied=False, **base)
    if not ev.trust_patches and not network_prefix(True):
        return _verdict(
            EvalVerdict.UNTRUSTED_REFUSED,
            "no network isolation here (needs unshare or bwrap); "
            "pass --trust-patches to run agents' code anyway",
            **base,
        )
    repo_path = ensure_local(inst.url, inst.repo, s.mirror_dir())
    ws = s.work_dir() / "eval" / hashlib.sha256(req.id.encode()).hexdigest()[:16]
    # local: always sandboxed; docker: network none, memory/pids limits, one core
    backend = make_backend(s.builder, ws, source=(repo_path, inst.expert_sha, inst.date), sandbox=True)
    try:
        return {**base, **_run(req, inst, s, backend, repo_path, out, phase, ws)}
    finally:
        if not s.builder.keep:
            backend.cleanup()


class _Stop(Exception):
    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report


def _prepare(req: EvalRequest, inst: EvalInstance, backend: Backend, repo: Path, out: Path, ws: Path) -> str:
    """Export the three trees and apply the patch to `agent`; the method that applied it.
    The patch is always applied on the host (git, patch); the three trees are then the backend's
    three sides (with the docker backend they go into the container)."""
    if ws.exists():
        shutil.rmtree(ws)
    (ws / "logs").mkdir(parents=True)
    (ws / "current").mkdir()
    agent_src = ws / "agent" / "src"
    export_tree(repo, inst.base_sha, agent_src, backend.submodules)
    init_tree(agent_src)
    patch_file = ws / "agent.patch"
    patch_file.write_text(req.patch)
    applied = apply_patch(agent_src, patch_file)
    shutil.rmtree(agent_src / ".git", ignore_errors=True)
    if applied.ok:
        backend.prepare(repo, {"old": inst.base_sha, "agent": agent_src, "expert": inst.expert_sha})
    _write(out / "build.log", applied.log + "\n")
    if not applied.ok:
        raise _Stop(
            _verdict(
                EvalVerdict.APPLY_FAILED,
                "no method applied the patch (git apply, --3way, patch --fuzz)",
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
                        f"\n===== {side} {st.step} =====\n{st.log_path.read_text(errors='replace')[-200_000:]}"
                    )

    failed = build_sides(
        backend, SIDES, on_built=keep_logs, phase=lambda _p, done, total: phase("build", done, total)
    )
    if failed is not None:
        side, last = failed.side, failed.step
        if side == "agent":
            raise _Stop(
                _verdict(
                    EvalVerdict.BUILD_FAILED,
                    f"{last.step} failed ({last.category})",
                    applied=True,
                    applied_with=applied_with,
                    build_tail=last.result.output[-2000:],
                )
            )
        raise _Stop(
            _verdict(
                EvalVerdict.INSTANCE_BROKEN,
                f"the {side} side does not build: {last.result.output[-800:]}",
                applied=True,
                applied_with=applied_with,
            )
        )
    phase("build", 3, 3)


def _correctness(
    backend: Backend,
    tests: dict[str, TestCase],
    limits_for: Callable[[TestCase], Limits],
    out: Path,
    phase: Phase,
) -> list[dict[str, Any]]:
    """Every test once on the agent tree; the failures."""
    failures: list[dict[str, Any]] = []
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
                    {
                        "test": name,
                        "returncode": res.returncode,
                        "timed_out": res.timed_out,
                        "output_tail": res.output[-1500:],
                    }
                )
    return failures


def _run(
    req: EvalRequest,
    inst: EvalInstance,
    s: Settings,
    backend: Backend,
    repo: Path,
    out: Path,
    phase: Phase,
    ws: Path,
) -> dict[str, Any]:
    ev = s.evaluator
    try:
        phase("prepare", 0, 1)
        applied_with = _prepare(req, inst, backend, repo, out, ws)
        phase("prepare", 1, 1)
        _build_all(backend, out, applied_with, phase)
    except _Stop as stop:
        return stop.report
    tests = {side: {t.name: t for t in backend.tests(side) if not t.disabled} for side in SIDES}
    common = sorted(set(tests["old"]) & set(tests["agent"]) & set(tests["expert"]))
    if not common:
        return _verdict(EvalVerdict.INSTANCE_BROKEN, "no test exists on all three sides", applied=True)

    def limits(t: TestCase, cpu: int | None = None, instructions: bool = False) -> Limits:
        return limits_for(t, s.builder, timeout=ev.test_timeout, cpu=cpu, instructions=instructions)

    info = {"applied": True, "applied_with": applied_with, "builds": True, "tests": common}
    failures = _correctness(backend, {n: tests["agent"][n] for n in common}, limits, out, phase)
    if failures:
        verdict = EvalVerdict.TIMEOUT if all(f["timed_out"] for f in failures) else EvalVerdict.TESTS_FAILED
        names = ", ".join(f["test"] for f in failures)
        return {
            **_verdict(verdict, f"failing tests: {names}"),
            **info,
            "tests_pass": False,
            "failing_tests": failures,
        }
    timed = [n for n in common if n in set(inst.improved_tests)] or common
    count = check_metric(backend, s.builder)
    with timing_core(s.builder, phase) as pin:

        def run_one(side: str, name: str) -> RunResult:
            t = tests[side][name]
            return normalise(t, backend.run_test(side, t, limits(t, pin, count)))

        meas = measure(
            timed,
            run_one,
            rounds=ev.runs,
            warmup=s.builder.warmup,
            seed=s.builder.seed,
            sides=SIDES,
            progress=lambda d, t: phase("measure", d, t),
            metric=s.builder.metric,
            multithread_ratio=s.builder.multithread_ratio,
            floor=s.builder.sample_floor,
            max_repeats=s.builder.max_repeats,
        )
    if meas.failure is not None:
        f = meas.failure
        if f.side == "agent":
            why = f"test {f.test} failed during timing (round {f.round}): flaky or nondeterministic"
            return {
                **_verdict(EvalVerdict.TIMEOUT if f.timed_out else EvalVerdict.TESTS_FAILED, why),
                **info,
                "tests_pass": False,
            }
        return {
            **_verdict(
                EvalVerdict.INSTANCE_BROKEN, f"test {f.test} failed on the {f.side} side during timing"
            ),
            **info,
        }
    scores = score(
        {n: meas.samples[n].by_metric(meas.metric_of(n)) for n in timed},
        alpha=s.builder.alpha,
        min_improvement=s.builder.min_improvement,
        opt_fraction=ev.opt_fraction,
        resamples=s.builder.bootstrap_resamples,
        seed=s.builder.seed,
    )
    return {
        "verdict": EvalVerdict.OPT if scores["opt"] else EvalVerdict.CORRECT,
        "opt": scores["opt"],
        "reason": "",
        **info,
        "tests_pass": True,
        "timed_tests": timed,
        "rounds": ev.runs,
        "seed": s.builder.seed,
        **scores,
        "samples": {n: meas.samples[n].by_metric(meas.metric_of(n)) for n in timed},
        "samples_wall": {n: meas.samples[n].wall for n in timed},
        "samples_cpu": {n: meas.samples[n].cpu for n in timed},
        "metric": s.builder.metric,
        "decided_on": dict(meas.decided_on),
        "repeats": dict(meas.repeats),
        "leased_core": pin,
    }


def summarize(settings: Settings, run_id: str, model: str) -> dict[str, Any]:
    """Counts and `opt` rate over a model's reports, overall and single- vs multi-file (Table 2)."""
    root = Path(settings.evaluator.runs_dir) / safe_name(run_id) / safe_name(model)
    reports = [json.loads(p.read_text()) for p in sorted(root.glob("*/report.json"))]

    def block(rs: list[dict[str, Any]]) -> dict[str, Any]:
        verdicts: dict[str, int] = {}
        for r in rs:
            verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
        n = len(rs)
        return {
            "instances": n,
            "verdicts": verdicts,
            "applied": sum(bool(r.get("applied")) for r in rs),
            "builds": sum(bool(r.get("builds")) for r in rs),
            "tests_pass": sum(bool(r.get("tests_pass")) for r in rs),
            "opt": sum(bool(r.get("opt")) for r in rs),
            "opt_rate": round(sum(bool(r.get("opt")) for r in rs) / n, 4) if n else 0.0,
        }

    summary = {
        "run_id": run_id,
        "model": model,
        "overall": block(reports),
        "single_file": block([r for r in reports if not r.get("multi_file")]),
        "multi_file": block([r for r in reports if r.get("multi_file")]),
    }
    _write(root.parent / f"{safe_name(model)}.summary.json", json.dumps(summary, indent=1))
    return summary
