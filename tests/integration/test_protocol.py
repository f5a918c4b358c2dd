"""The measurement protocol's metrics: every run records wall, CPU and (where allowed) instructions;
CPU time decides by default, a multi-threaded test (CPU well above wall) is decided on wall and
says so; short tests are repeated inside a sample until they pass the floor; `instructions` gives a
clear error where the kernel does not allow hardware counters; CPU time of a real process is not
moved by a busy neighbour the way wall time is."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cppperf.shared.engine.backend import LocalBackend
from cppperf.shared.engine.cmake import BuildSpec
from cppperf.shared.engine.protocol import check_metric, decision_metric, measure, repeats_for
from cppperf.shared.engine.runner_script import instructions_unsupported
from cppperf.shared.engine.sandbox import Limits, RunResult, run
from cppperf.shared.errors import ConfigError
from cppperf.shared.settings import BuilderSettings


def result(wall: float, cpu: float, instructions: int | None = None) -> RunResult:
    return RunResult(0, wall, cpu, "", False, False, instructions=instructions)


@dataclass
class Fake:
    """Old takes `old` seconds of CPU, new `new`; wall is `stretch` times the CPU time."""

    old: float
    new: float
    stretch: float = 3.0
    calls: int = 0

    def __call__(self, side: str, _name: str) -> RunResult:
        self.calls += 1
        cpu = self.old if side == "old" else self.new
        return result(cpu * self.stretch, cpu)


def test_cpu_decides_by_default_and_all_metrics_are_kept() -> None:
    meas = measure(["t"], Fake(0.1, 0.08), rounds=6, warmup=1, seed=1, metric="cpu", floor=0.05)
    s = meas.samples["t"]
    assert meas.decided_on == {"t": "cpu"} and meas.repeats == {"t": 1}
    assert len(s.wall["old"]) == len(s.cpu["old"]) == 5
    assert meas.decision_samples()["t"] == (s.cpu["old"], s.cpu["new"])


def test_multithreaded_test_is_decided_on_wall() -> None:
    meas = measure(["mt"], Fake(0.4, 0.3, stretch=0.25), rounds=4, warmup=1, seed=1, metric="cpu")
    assert meas.decided_on == {"mt": "wall"}
    assert meas.decision_samples()["mt"] == (meas.samples["mt"].old, meas.samples["mt"].new)


def test_instructions_fall_back_to_cpu_without_counts() -> None:
    meas = measure(["t"], Fake(0.1, 0.1), rounds=3, warmup=1, seed=1, metric="instructions")
    assert meas.decided_on == {"t": "cpu"}
    s = meas.samples["t"]
    s.add("old", result(0.1, 0.1, 1000))
    assert decision_metric(s, "instructions", 1.2) == "cpu"  # counts on one side only


def test_short_tests_are_repeated_inside_a_sample() -> None:
    assert repeats_for(0.2, 0.05, 200) == 1
    assert repeats_for(0.004, 0.05, 200) == 13
    assert repeats_for(1e-7, 0.05, 200) == 200
    fake = Fake(0.004, 0.002)
    meas = measure(["short"], fake, rounds=5, warmup=1, seed=1, metric="cpu", floor=0.05)
    k = meas.repeats["short"]
    assert k == 25  # the shorter side's warm-up run sets it: 0.05 / 0.002
    assert fake.calls == 2 + 4 * 2 * k  # warm-up single, then k runs per sample
    assert meas.samples["short"].cpu["old"] == pytest.approx([0.004] * 4)  # a sample is the mean


def test_floor_without_warmup_calibrates_first() -> None:
    fake = Fake(0.01, 0.01)
    meas = measure(["t"], fake, rounds=2, warmup=0, seed=1, floor=0.05)
    assert meas.repeats["t"] == 5 and fake.calls == 2 + 2 * 2 * 5


def test_instructions_metric_is_a_clear_error_where_not_allowed(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, BuildSpec(), {})
    why = instructions_unsupported()
    settings = BuilderSettings(metric="instructions")
    if why is None:
        assert check_metric(backend, settings) is True
        res = run(
            [sys.executable, "-c", "sum(range(10**6))"], limits=Limits(instructions=True), sandbox=False
        )
        assert res.instructions is not None and res.instructions > 1_000_000
    else:
        with pytest.raises(
            ConfigError,
            match=r"builder.metric=instructions is not possible here: .+; use cachegrind \(Valgrind\), cpu",
        ):
            check_metric(backend, settings)
        assert check_metric(backend, BuilderSettings()) is False  # the default just does not count
        res = run(["true"], limits=Limits(instructions=True), sandbox=False)
        assert res.ok and res.instructions is None


def _spin(seconds_of_work: int) -> list[str]:
    return [sys.executable, "-c", f"s=0\nfor i in range({seconds_of_work}): s+=i*i"]


def test_cpu_time_is_not_moved_by_a_busy_neighbour_on_the_core() -> None:
    """Two spinners on one core share it: wall time doubles, CPU time does not."""
    import os
    import subprocess

    core = min(os.sched_getaffinity(0))  # a build core: never one a replica may be timing on
    alone = run(_spin(2_000_000), limits=Limits(cpu=core), sandbox=False)
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    try:
        busy = run(_spin(2_000_000), limits=Limits(cpu=core), sandbox=False)
    finally:
        hog.kill()
        hog.wait()
    assert alone.ok and busy.ok
    assert busy.wall_s > 1.4 * busy.cpu_s  # the neighbour took about half the core
    assert busy.cpu_s < 1.5 * alone.cpu_s  # the work measured the same


def test_samples_by_metric() -> None:
    meas: Any = measure(["t"], Fake(0.1, 0.1), rounds=3, warmup=1, seed=1)
    assert meas.samples["t"].by_metric("cpu") is meas.samples["t"].cpu
    assert meas.samples["t"].pair("wall") == (meas.samples["t"].old, meas.samples["t"].new)
