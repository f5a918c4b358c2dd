"""Prove (or refute) one patch: build both sides, compare binaries, time tests, decide.

Verdicts: `improved`, `not-improved`, `regressed`, `unchanged-binaries`, `rejected` (with a
failure category: configure, dependency, compile, test-failure, timeout, infra, no-tests).
A rejected instance is a verdict about the patch or its build, never an exception.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cppperf.shared.engine.backend import SIDES, Backend, SideName
from cppperf.shared.engine.cases import split as split_cases
from cppperf.shared.engine.cmake import StepResult, TestCase, normalise
from cppperf.shared.engine.protocol import Measurement, measure
from cppperf.shared.engine.sandbox import Limits, RunResult
from cppperf.shared.engine.stats import TestStats, compare_all, compare_test, verdict
from cppperf.shared.messages import CommitSelected, instance_id
from cppperf.shared.settings import BuilderSettings

PhaseCallback = Callable[[str, int, int], None]  # phase, done, total


@dataclass
class InstanceResult:
    instance_id: str
    verdict: str
    verdict_paper: str = ""
    failure_category: str | None = None
    failure_detail: str = ""
    improved_tests: list[str] = field(default_factory=list)
    regressed_tests: list[str] = field(default_factory=list)
    tests: list[TestStats] = field(default_factory=list)
    confirmations: dict[str, dict[str, Any]] = field(default_factory=dict)
    measurement: Measurement | None = None
    build_steps: list[dict[str, Any]] = field(default_factory=list)
    added_tests: list[str] = field(default_factory=list)
    removed_tests: list[str] = field(default_factory=list)
    missing_packages: list[str] = field(default_factory=list)
    llm_proposed_packages: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)


def environment_facts(settings: BuilderSettings) -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "build_type": settings.build_type,
        "thread_env": dict(settings.thread_env),
        "pinned_cpu": settings.pin_cpu,
    }


def _step_dict(side: SideName, s: StepResult) -> dict[str, Any]:
    return {
        "side": side,
        "step": s.step,
        "ok": s.ok,
        "seconds": round(s.result.wall_s, 3),
        "category": s.category,
        "log": str(s.log_path) if s.log_path else None,
    }


def _pin_cpu(settings: BuilderSettings) -> int | None:
    if not settings.pin_cpu:
        return None
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None
    return cpus[-1] if cpus else None


def _build_both(
    backend: Backend,
    result: InstanceResult,
    phase: PhaseCallback,
    llm_propose: Callable[[str], list[str]] | None,
) -> tuple[str, str] | None:
    """Configure and build both sides; the (category, detail) of the first failure, if any."""
    for i, side in enumerate(SIDES):
        phase(f"build {side}", i, 2)
        steps = backend.build(side)
        result.build_steps += [_step_dict(side, s) for s in steps]
        last = steps[-1]
        if last.ok:
            continue
        if last.missing is not None:
            result.missing_packages = last.missing.debian
        if (
            llm_propose is not None
            and last.step == "configure"
            and (last.missing is None or last.missing.unknown)
        ):
            proposed = [p for p in llm_propose(last.result.output) if p not in result.missing_packages]
            if proposed:
                result.missing_packages += proposed
                result.llm_proposed_packages = proposed
                last.category = "dependency"
        detail = last.missing.describe() if last.missing else last.result.output[-1500:]
        if result.llm_proposed_packages:
            detail += f"; model proposes: {' '.join(result.llm_proposed_packages)}"
        return last.category or "infra", f"{side} {last.step} failed: {detail}"
    return None


def prove(
    commit: CommitSelected,
    repo_path: Path,
    backend: Backend,
    settings: BuilderSettings,
    *,
    on_phase: PhaseCallback | None = None,
    seed: int | None = None,
    llm_propose: Callable[[str], list[str]] | None = None,
) -> InstanceResult:
    """Run the whole protocol for one commit against its parent."""
    phase = on_phase or (lambda _p, _d, _t: None)
    iid = instance_id(commit.repo, commit.sha)
    result = InstanceResult(instance_id=iid, verdict="rejected", environment=environment_facts(settings))

    def reject(category: str, detail: str) -> InstanceResult:
        result.verdict, result.failure_category, result.failure_detail = "rejected", category, detail
        result.verdict_paper = "rejected"
        return result

    phase("checkout", 0, 1)
    backend.prepare(repo_path, {"old": commit.parent, "new": commit.sha})
    phase("checkout", 1, 1)
    failure = _build_both(backend, result, phase, llm_propose)
    if failure is not None:
        return reject(*failure)
    phase("build new", 2, 2)

    tests_by_side: dict[SideName, dict[str, TestCase]] = {
        side: {t.name: t for t in backend.tests(side) if not t.disabled} for side in SIDES
    }
    common = sorted(set(tests_by_side["old"]) & set(tests_by_side["new"]))
    result.added_tests = sorted(set(tests_by_side["new"]) - set(tests_by_side["old"]))
    result.removed_tests = sorted(set(tests_by_side["old"]) - set(tests_by_side["new"]))
    if not common:
        return reject("no-tests", "no CTest test exists on both sides")
    if backend.binaries_identical(common):
        result.verdict = result.verdict_paper = "unchanged-binaries"
        return result
    if settings.split_cases:
        tests_by_side, common = _split_cases(backend, tests_by_side, common, phase)

    cpu = _pin_cpu(settings)

    def run_one(side: SideName, name: str) -> Any:
        t = tests_by_side[side][name]
        timeout = t.timeout or settings.test_timeout
        limits = Limits(
            timeout=timeout,
            cpu_seconds=int(timeout * 2) + 1,
            memory_mb=settings.memory_limit_mb,
            processes=settings.max_processes,
            cpu=cpu,
        )
        res = backend.run_test(side, t, limits)
        return normalise(t, res)

    run_seed = settings.seed if seed is None else seed
    meas = measure(
        common,
        run_one,
        rounds=settings.runs,
        warmup=settings.warmup,
        seed=run_seed,
        early_stop=settings.early_stop,
        min_rounds=settings.early_stop_min_rounds,
        min_improvement=settings.min_improvement,
        progress=lambda d, t: phase("measure", d, t),
    )
    result.measurement = meas
    if meas.failure is not None:
        f = meas.failure
        killed = f.returncode in (-9, 137) and not f.timed_out  # the kernel's OOM killer or the pids wall
        why = (
            "timed out"
            if f.timed_out
            else ("killed (resource limit)" if killed else f"exit code {f.returncode}")
        )
        return reject(
            "timeout" if f.timed_out else ("resource-limit" if killed else "test-failure"),
            f"test {f.test} failed on the {f.side} side in round {f.round} ({why}): {f.output_tail[-800:]}",
        )
    decided = compare_all(
        {n: (s.old, s.new) for n, s in meas.samples.items()},
        alpha=settings.alpha,
        min_improvement=settings.min_improvement,
        resamples=settings.bootstrap_resamples,
        seed=run_seed,
    )
    if settings.confirm:
        decided = _confirm(decided, run_one, settings, run_seed, result, phase)
    result.tests = decided
    rule = settings.decision_rule
    result.verdict = verdict(decided, rule=rule)
    result.verdict_paper = verdict(decided, paper=True)
    imp, reg = ("improved", "regressed") if rule == "ours" else (f"{rule}_improved", f"{rule}_regressed")
    result.improved_tests = [t.name for t in decided if getattr(t, imp)]
    result.regressed_tests = [t.name for t in decided if getattr(t, reg)]
    return result


def _split_cases(
    backend: Backend,
    tests_by_side: dict[SideName, dict[str, TestCase]],
    common: list[str],
    phase: PhaseCallback,
) -> tuple[dict[SideName, dict[str, TestCase]], list[str]]:
    """Each common test split into its framework cases on both sides; the cases on both sides."""
    split_by_side: dict[SideName, dict[str, TestCase]] = {}
    for side in SIDES:

        def listing(tc: TestCase, side: SideName = side) -> RunResult:
            return backend.run_test(side, tc, Limits(timeout=60))

        out: dict[str, TestCase] = {}
        for i, name in enumerate(common):
            phase(f"list cases {side}", i, len(common))
            for t in split_cases(tests_by_side[side][name], listing):
                out[t.name] = t
        split_by_side[side] = out
    return split_by_side, sorted(set(split_by_side["old"]) & set(split_by_side["new"]))


_CLEARED = {"improved": False, "regressed": False, "strict_improved": False, "strict_regressed": False}


def _confirm(
    decided: list[TestStats],
    run_one: Callable[[SideName, str], Any],
    settings: BuilderSettings,
    seed: int,
    result: InstanceResult,
    phase: PhaseCallback,
) -> list[TestStats]:
    """Re-run each flagged test alone with a fresh order; a change must hold there to count."""
    flagged = [t for t in decided if t.improved or t.regressed or t.strict_improved or t.strict_regressed]
    if not flagged:
        return decided
    rounds = max(settings.early_stop_min_rounds, settings.runs // 2) + settings.warmup
    out: dict[str, TestStats] = {t.name: t for t in decided}
    for i, t in enumerate(flagged):
        phase("confirm", i, len(flagged))
        meas = measure(
            [t.name],
            run_one,
            rounds=rounds,
            warmup=settings.warmup,
            seed=seed + 7919 * (i + 1),
            early_stop=False,
        )
        if meas.failure is not None:
            result.confirmations[t.name] = {"held": False, "failure": meas.failure.output_tail[-500:]}
            out[t.name] = TestStats(**{**t.as_dict(), **_CLEARED})
            continue
        s = meas.samples[t.name]
        c = compare_test(t.name, s.old, s.new, resamples=settings.bootstrap_resamples, seed=seed + i)
        if t.improved or t.strict_improved:
            held = c.p_improve < settings.alpha and c.median_change >= settings.min_improvement
        else:
            held = c.p_regress < settings.alpha and c.median_change <= -settings.min_improvement
        result.confirmations[t.name] = {
            "held": held,
            "old": s.old,
            "new": s.new,
            "median_change": c.median_change,
            "p_improve": c.p_improve,
            "p_regress": c.p_regress,
            "ratio": c.ratio,
            "ci": [c.ci_low, c.ci_high],
        }
        if not held:
            out[t.name] = TestStats(**{**t.as_dict(), **_CLEARED})
    phase("confirm", len(flagged), len(flagged))
    return [out[t.name] for t in decided]
