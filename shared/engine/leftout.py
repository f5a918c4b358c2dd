"""The exact metric's limit: which failed counted run leaves its workload out of the measurement.

    metric_limit(sides, counted, native, keep=…, left=…) -> Drop   (`measure(drop=…)`)

Valgrind is not the machine: it computes x87 `long double` at 64 bits, runs timing-sensitive code
50x slower. A test that fails counted on every side and passes natively on every side is that
limit — not the project's, the commit's or an agent's — and is left out of the counted tests
instead of deciding the run. The builder (old/new) and the evaluator (old/expert/agent) share
this one rule."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cppperf.shared.engine.backend import SideName
from cppperf.shared.engine.benchmarks import is_benchmark
from cppperf.shared.engine.protocol import Drop, RunFailure
from cppperf.shared.engine.sandbox import KILLED, RunResult

RunOn = Callable[[SideName, str], RunResult]


def why_left_out(f: RunFailure, sides: int) -> str:
    every = "both" if sides == 2 else f"all {sides}"
    return (
        f"fails under Valgrind on {every} sides (exit {f.returncode}) and passes natively on "
        f"{every}: the exact metric's limit, not the change's"
    )


def metric_limit(
    sides: Sequence[SideName],
    counted: RunOn,
    native: RunOn,
    *,
    keep: Callable[[str], bool] = lambda _test: False,
    left: Callable[[str, str], None] = lambda _test, _why: None,
) -> Drop:
    """The `drop` of a counted measurement over `sides`: a failed run is left out (its reason)
    when its test fails counted on every other side too and passes natively (`native`, untimed)
    on every side. It keeps its failure — blame or the verdict decide as before — when it is a
    benchmark (never counted), met an instruction Valgrind lacks, ran out of a limit (timeout,
    killed), passes counted on another side (then the failing side's code is the cause), fails
    natively anywhere, or `keep(test)` (the last workload that can show the change). `left`
    hears each workload left out and why."""

    def drop(f: RunFailure) -> str | None:
        if is_benchmark(f.test) or f.valgrind_unhandled or keep(f.test):
            return None
        if f.timed_out or f.returncode in KILLED:
            return None
        if any(counted(side, f.test).ok for side in sides if side != f.side):
            return None
        if not all(native(side, f.test).ok for side in sides):
            return None
        why = why_left_out(f, len(sides))
        left(f.test, why)
        return why

    return drop
