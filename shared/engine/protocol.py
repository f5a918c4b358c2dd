"""The measurement protocol: interleaved, seeded rounds; early stop; confirmation runs.

Each round runs every still-active test once on each side; the order of tests and, per test, which
side goes first are drawn from a seeded RNG (seed recorded), so drift hits both sides alike. The
first `warmup` rounds are discarded. Every run must pass: the first failure ends the protocol with
the test and side named. After `min_rounds` kept rounds a test whose ratio CI is clearly inside ±1 %
or clearly beyond the threshold stops being run (rounds saved are counted).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from cppperf.shared.engine.backend import SideName
from cppperf.shared.engine.sandbox import RunResult
from cppperf.shared.engine.stats import clearly_settled

RunOne = Callable[[SideName, str], RunResult]
Progress = Callable[[int, int], None]


@dataclass
class Samples:
    """Wall and CPU seconds per side (`old`/`new` for the builder; any names for the evaluator)."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def add(self, side: SideName, res: RunResult) -> None:
        self.wall.setdefault(side, []).append(res.wall_s)
        self.cpu.setdefault(side, []).append(res.cpu_s)

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


@dataclass(frozen=True)
class RunFailure:
    test: str
    side: SideName
    round: int
    returncode: int
    timed_out: bool
    output_tail: str


@dataclass
class Measurement:
    seed: int
    rounds: int
    warmup: int
    samples: dict[str, Samples]
    rounds_run: dict[str, int]
    settled: dict[str, str] = field(default_factory=dict)
    failure: RunFailure | None = None

    @property
    def rounds_saved(self) -> int:
        return sum(self.rounds - n for n in self.rounds_run.values())


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
) -> Measurement:
    rng = random.Random(seed)
    samples = {t: Samples() for t in tests}
    rounds_run = dict.fromkeys(tests, 0)
    meas = Measurement(seed=seed, rounds=rounds, warmup=warmup, samples=samples, rounds_run=rounds_run)
    active = list(tests)
    total = rounds * len(tests)
    done = 0
    for r in range(rounds):
        order = active[:]
        rng.shuffle(order)
        for name in order:
            order_sides = list(sides)
            rng.shuffle(order_sides)
            for side in order_sides:
                res = run_one(side, name)
                if not res.ok:
                    meas.failure = RunFailure(
                        name, side, r, res.returncode, res.timed_out, res.output[-2000:]
                    )
                    return meas
                if r >= warmup:
                    samples[name].add(side, res)
            rounds_run[name] += 1
            done += 1
            if progress:
                progress(done, total)
        kept = r + 1 - warmup
        if early_stop and kept >= min_rounds and set(sides) == {"old", "new"}:
            for name in list(active):
                s = samples[name]
                state = clearly_settled(s.old, s.new, min_improvement=min_improvement, seed=seed + r)
                if state is not None:
                    meas.settled[name] = state
                    active.remove(name)
                    done += rounds - r - 1
        if not active:
            break
    if progress:
        progress(total, total)
    return meas
