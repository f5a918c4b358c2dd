"""The measurement protocol: interleaved, seeded rounds; early stop; confirmation runs.

Each round runs every still-active test once on each side; the order of tests and, per test, which
side goes first are drawn from a seeded RNG (seed recorded), so drift hits both sides alike. The
first `warmup` rounds are discarded. Every run must pass: the first failure ends the protocol with
the test and side named. After `min_rounds` kept rounds a test whose ratio CI is clearly inside ±1 %
or clearly beyond the threshold stops being run (rounds saved are counted).

Every run records wall time, CPU time (user+sys of the process tree, from `wait4`) and, where the
kernel allows, user-space instructions. One of them decides (`metric`): CPU time by default, which
a busy neighbour does not move for a single-threaded test; a test whose CPU time exceeds its wall
time by `multithread_ratio` is multi-threaded and is decided on wall time (`decided_on` says so per
test). A test whose warm-up run is shorter than `floor` seconds (CPU time, or wall time when that
is shorter) is run `repeats` times back to back inside every sample (the sample is the mean), so
process start-up does not dominate it.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

from cppperf.shared.engine.backend import Backend, SideName
from cppperf.shared.engine.sandbox import RunResult
from cppperf.shared.engine.stats import clearly_settled
from cppperf.shared.errors import ConfigError
from cppperf.shared.settings import BuilderSettings

RunOne = Callable[[SideName, str], RunResult]
Progress = Callable[[int, int], None]
Turn = Callable[[], AbstractContextManager[object]]  # one round's timing-core lease (leases.Turns)
# a failed run -> why its workload is left out of the measurement (the rest goes on), or None: the
# failure stands (`Measurement.failure`)
Drop = Callable[["RunFailure"], str | None]


METRICS = ("cpu", "wall", "instructions", "cachegrind")


def check_metric(backend: Backend, settings: BuilderSettings) -> bool:
    """Whether instructions can be counted by the hardware (then every run counts them); a clear
    error when `builder.metric=instructions` must decide and the kernel or CPU does not allow it,
    or `cachegrind` and the backend cannot run Valgrind. Under Valgrind the hardware count would
    be Valgrind's own: not counted then."""
    if settings.metric == "cachegrind":
        why = backend.valgrind_unsupported()
        if why is not None:
            raise ConfigError(f"builder.metric=cachegrind is not possible here: {why}; use cpu or wall")
        return False
    why = backend.instructions_unsupported()
    if why is not None and settings.metric == "instructions":
        raise ConfigError(
            f"builder.metric=instructions is not possible here: {why}; use cachegrind (Valgrind), cpu or wall"
        )
    return why is None


@dataclass
class Samples:
    """Wall seconds, CPU seconds and instructions per side (`old`/`new` for the builder; any names
    for the evaluator). With `repeats` > 1 each value is the mean of that many back-to-back runs."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    instructions: dict[str, list[float]] = field(default_factory=dict)
    ir: dict[str, list[float]] = field(default_factory=dict)  # Cachegrind's counts (`cachegrind`)
    # estimated cycles from Cachegrind's simulated cache misses (`builder.cachegrind_cache_sim`):
    # a figure beside `ir`, never the deciding metric
    est_cycles: dict[str, list[float]] = field(default_factory=dict)

    def add(self, side: SideName, res: RunResult) -> None:
        self.wall.setdefault(side, []).append(res.wall_s)
        self.cpu.setdefault(side, []).append(res.cpu_s)
        if res.instructions is not None:
            self.instructions.setdefault(side, []).append(float(res.instructions))
        if res.ir is not None:
            self.ir.setdefault(side, []).append(float(res.ir))
        if res.est_cycles is not None:
            self.est_cycles.setdefault(side, []).append(float(res.est_cycles))

    def by_metric(self, metric: str) -> dict[str, list[float]]:
        return {"wall": self.wall, "cpu": self.cpu, "instructions": self.instructions, "cachegrind": self.ir}[
            metric
        ]

    def pair(self, metric: str) -> tuple[list[float], list[float]]:
        m = self.by_metric(metric)
        return m.get("old", []), m.get("new", [])

    @property
    def old(self) -> list[float]:
        return self.wall.get("old", [])

    @property
    def new(self) -> list[float]:
        return self.wall.get("new", [])

    @property
    def old_cpu(self) -> list[float]:
        return self.cpu.get("old", [])

    @property
    def new_cpu(self) -> list[float]:
        return self.cpu.get("new", [])


def cpu_wall_ratio(s: Samples) -> float:
    """The largest median(CPU)/median(wall) over the sides: above ~1 the test runs threads."""
    ratios = [
        statistics.median(cpu) / max(statistics.median(s.wall[side]), 1e-9)
        for side, cpu in s.cpu.items()
        if cpu and s.wall.get(side)
    ]
    return max(ratios, default=0.0)


def decision_metric(s: Samples, metric: str, multithread_ratio: float) -> str:
    """The metric that decides this test: `metric`, except a multi-threaded test under `cpu`
    (CPU time markedly above wall time) is decided on wall time; `instructions` needs counts."""
    if metric == "cpu" and cpu_wall_ratio(s) > multithread_ratio:
        return "wall"
    if metric in ("instructions", "cachegrind") and not all(s.by_metric(metric).get(side) for side in s.wall):
        return "cpu"
    return metric


@dataclass(frozen=True)
class RunFailure:
    test: str
    side: SideName
    round: int
    returncode: int
    timed_out: bool
    output_tail: str
    valgrind_unhandled: str | None = None  # `RunResult.valgrind_unhandled`: the metric's limit

    @classmethod
    def of(cls, test: str, side: SideName, round_: int, res: RunResult) -> RunFailure:
        """The failure of `res`, a run of `test` on `side` in round `round_` (-1: calibration)."""
        return cls(
            test, side, round_, res.returncode, res.timed_out, res.output[-2000:], res.valgrind_unhandled
        )


@dataclass
class Measurement:
    seed: int
    rounds: int
    warmup: int
    samples: dict[str, Samples]
    rounds_run: dict[str, int]
    settled: dict[str, str] = field(default_factory=dict)
    failure: RunFailure | None = None
    metric: str = "wall"
    decided_on: dict[str, str] = field(default_factory=dict)  # test -> metric that decides it
    repeats: dict[str, int] = field(default_factory=dict)  # test -> runs inside one sample
    multithread_ratio: float = 1.2
    left_out: dict[str, str] = field(default_factory=dict)  # workload -> why `drop` took it out

    @property
    def rounds_saved(self) -> int:
        return sum(self.rounds - n for n in self.rounds_run.values())

    def metric_of(self, name: str) -> str:
        return self.decided_on.get(name) or decision_metric(
            self.samples[name], self.metric, self.multithread_ratio
        )

    def decision_samples(self) -> dict[str, tuple[list[float], list[float]]]:
        """Per test, the old and new samples of the metric that decides it."""
        return {n: s.pair(self.metric_of(n)) for n, s in self.samples.items()}

    def decide_metrics(self) -> None:
        self.decided_on = {
            n: decision_metric(s, self.metric, self.multithread_ratio) for n, s in self.samples.items()
        }


def repeated(run_one: RunOne, side: SideName, name: str, times: int) -> RunResult:
    """`times` runs back to back as one sample (mean of each metric); the first failure returned."""
    if times <= 1:
        return run_one(side, name)
    results = []
    for _ in range(times):
        res = run_one(side, name)
        if not res.ok:
            return res
        results.append(res)
    counts = [r.instructions for r in results]
    irs = [r.ir for r in results]
    cycles = [r.est_cycles for r in results]
    return replace(
        results[-1],
        wall_s=sum(r.wall_s for r in results) / times,
        cpu_s=sum(r.cpu_s for r in results) / times,
        instructions=None if None in counts else sum(c or 0 for c in counts) // times,
        ir=None if None in irs else sum(c or 0 for c in irs) // times,
        est_cycles=None if None in cycles else sum(c or 0 for c in cycles) // times,
    )


def _length(res: RunResult) -> float:
    """How long a run is for the floor: its CPU time when single-threaded (a busy host stretches
    wall time, not the work), its wall time when it ran threads (CPU time above wall time)."""
    return min(res.wall_s, res.cpu_s) if res.cpu_s > 0 else res.wall_s


def repeats_for(seconds: float, floor: float, max_repeats: int) -> int:
    """How many runs one sample needs so that together they last at least `floor` seconds."""
    if floor <= 0 or seconds >= floor:
        return 1
    return max(1, min(max_repeats, math.ceil(floor / max(seconds, 1e-6))))


def _calibrate(
    tests: list[str], sides: tuple[SideName, ...], run_one: RunOne, shortest: dict[str, float]
) -> RunFailure | None:
    for name in tests:
        for side in sides:
            res = run_one(side, name)
            if not res.ok:
                return RunFailure.of(name, side, -1, res)
            shortest[name] = min(shortest.get(name, math.inf), _length(res))
    return None


def _settle(meas: Measurement, active: list[str], min_improvement: float, seed: int) -> list[str]:
    """The active tests that early stop may drop now (their state recorded in `settled`)."""
    out = []
    for name in active:
        old, new = meas.samples[name].pair(meas.metric_of(name))
        state = clearly_settled(old, new, min_improvement=min_improvement, seed=seed)
        if state is not None:
            meas.settled[name] = state
            out.append(name)
    return out


def _run_sides(
    meas: Measurement,
    run_one: RunOne,
    name: str,
    sides: list[SideName],
    r: int,
    shortest: dict[str, float],
    warm: dict[str, float] | None = None,
) -> RunFailure | None:
    """One round of one test: each side once (a sample of `repeats` runs); warm-up runs only
    teach how long the test is (`shortest` run; `warm`: the seconds they took, overheads in)."""
    started = time.monotonic()
    for side in sides:
        res = repeated(run_one, side, name, meas.repeats[name])
        if not res.ok:
            return RunFailure.of(name, side, r, res)
        if r >= meas.warmup:
            meas.samples[name].add(side, res)
        else:
            shortest[name] = min(shortest.get(name, math.inf), _length(res))
    if r < meas.warmup and warm is not None:
        warm[name] = warm.get(name, 0.0) + time.monotonic() - started
    return None


def budgeted_rounds(per_round: float, *, budget: float, warmup: int, at_least: int, at_most: int) -> int:
    """The rounds (warm-up included) whose kept rounds, `per_round` seconds each, take about
    `budget` seconds; within [`at_least`, `at_most`] (`at_most` below `at_least`: `at_least`)."""
    want = warmup + math.ceil(budget / per_round) if per_round > 0 else at_most
    return max(at_least, min(want, at_most))


def _after_warmup(
    meas: Measurement,
    shortest: dict[str, float],
    warm: dict[str, float],
    warm_repeats: dict[str, int],
    floor: float,
    max_repeats: int,
    pinned: Mapping[str, int],
    budget: float,
    max_rounds: int,
) -> None:
    """Each test's runs per sample from its shortest warm-up run (`floor` 0: kept as they are);
    with a `budget`, `meas.rounds` grown to fill it: a kept round costs each test's warm-up
    seconds per run times its runs per sample now."""
    if floor > 0:
        meas.repeats = {
            n: pinned.get(n) or repeats_for(shortest.get(n, floor), floor, max_repeats) for n in meas.samples
        }
    if budget > 0:
        per_round = sum(d / meas.warmup / warm_repeats[n] * meas.repeats[n] for n, d in warm.items())
        meas.rounds = budgeted_rounds(
            per_round, budget=budget, warmup=meas.warmup, at_least=meas.rounds, at_most=max_rounds
        )


def _left_out(meas: Measurement, drop: Drop | None, active: list[str], warm: dict[str, float]) -> bool:
    """Whether `drop` takes the failed run's workload out of the measurement (then out of
    `active` and `warm`, its samples gone, the failure cleared, `left_out` says why). The last
    workload is never left out: a measurement of nothing is the failure's."""
    f = meas.failure
    if f is None or drop is None or len(meas.samples) <= 1:
        return False
    why = drop(f)
    if not why:
        return False
    meas.left_out[f.test] = why
    warm.pop(f.test, None)
    meas.failure = None
    meas.samples.pop(f.test, None)
    meas.rounds_run.pop(f.test, None)
    meas.repeats.pop(f.test, None)
    active.remove(f.test)
    return True


def measure(
    tests: list[str],
    run_one: RunOne,
    *,
    rounds: int,
    warmup: int,
    seed: int,
    early_stop: bool = False,
    min_rounds: int = 10,
    min_improvement: float = 0.05,
    progress: Progress | None = None,
    sides: tuple[SideName, ...] = ("old", "new"),
    metric: str = "wall",
    multithread_ratio: float = 1.2,
    floor: float = 0.0,
    max_repeats: int = 200,
    repeats: dict[str, int] | None = None,
    turn: Turn | None = None,
    pinned: Mapping[str, int] | None = None,
    budget: float = 0.0,
    max_rounds: int = 0,
    drop: Drop | None = None,
) -> Measurement:
    """Run the rounds. `repeats` fixes the runs per sample (confirmation runs reuse the main
    protocol's); else tests shorter than `floor` get theirs from the warm-up runs, except those
    in `pinned`, which keep their own count (benchmarks: their sample is their own timing).
    `turn`: the timing-core lease each round (and the calibration) runs under.

    `budget` (seconds, with a warm-up): short tests get more rounds — after the warm-up, as many
    kept rounds as the warm-up says fit in `budget` (each test's warm-up duration times its
    repeats per sample), never fewer than `rounds`, at most `max_rounds`. The count is fixed
    from the warm-up's durations alone, before any kept sample: it cannot depend on the outcome.

    `drop`: asked about a failed run of a round; a reason takes that workload out of the
    measurement (its samples too: `left_out`) and the rounds go on with the rest."""
    pinned = pinned or {}
    turn = turn or contextlib.nullcontext
    rng = random.Random(seed)
    samples = {t: Samples() for t in tests}
    rounds_run = dict.fromkeys(tests, 0)
    meas = Measurement(
        seed=seed,
        rounds=rounds,
        warmup=warmup,
        samples=samples,
        rounds_run=rounds_run,
        metric=metric,
        multithread_ratio=multithread_ratio,
        repeats={t: (repeats or pinned).get(t, 1) for t in tests},
    )
    shortest: dict[str, float] = {}  # test -> shortest warm-up (or calibration) run, seconds
    if floor > 0 and repeats is None and warmup == 0:  # no warm-up to learn from: one calibration run
        with turn():
            meas.failure = _calibrate(tests, sides, run_one, shortest)
        if meas.failure is not None:
            return meas
        meas.repeats = {n: pinned.get(n) or repeats_for(shortest[n], floor, max_repeats) for n in tests}
    active = list(tests)
    total = rounds * len(tests)
    done = 0
    warm: dict[str, float] = {}  # test -> seconds its warm-up runs took (all sides, with overheads)
    warm_repeats = dict(meas.repeats)
    r = 0
    while r < rounds:
        order = active[:]
        rng.shuffle(order)
        with turn():
            for name in order:
                order_sides = list(sides)
                rng.shuffle(order_sides)
                meas.failure = _run_sides(meas, run_one, name, order_sides, r, shortest, warm)
                if _left_out(meas, drop, active, warm):
                    total -= rounds - r  # its runs from this round on
                    continue
                if meas.failure is not None:
                    return meas
                rounds_run[name] += 1
                done += 1
                if progress:
                    progress(done, total)
        if r == warmup - 1:
            learn = floor if repeats is None else 0.0
            _after_warmup(meas, shortest, warm, warm_repeats, learn, max_repeats, pinned, budget, max_rounds)
            total += (meas.rounds - rounds) * len(meas.samples)  # the workloads not left out
            rounds = meas.rounds
        kept = r + 1 - warmup
        if early_stop and kept >= min_rounds and set(sides) == {"old", "new"}:
            for name in _settle(meas, active, min_improvement, seed + r):
                active.remove(name)
                done += rounds - r - 1
        if not active:
            break
        r += 1
    if progress:
        progress(total, total)
    meas.decide_metrics()
    return meas
