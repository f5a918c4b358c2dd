"""Confirming an `opt` on Cachegrind's counts by native time (`pipeline.native_verdict`, and the
budgeted rounds of `protocol.measure` it runs on): the speed-up must show on a test the counts
improved, corrected over that family alone — the counted runs chose it on other data — while a
regression anywhere, or a patch clearly behind the expert, still refuses it; short tests get more
rounds, fixed from the warm-up's durations before any kept sample."""

from __future__ import annotations

import random
import time

import pytest

from cppperf.services.evaluator.pipeline import native_verdict
from cppperf.shared.engine.protocol import budgeted_rounds, measure
from cppperf.shared.engine.sandbox import RunResult
from cppperf.shared.errors import ConfigError
from cppperf.shared.settings import Settings, load_settings

ROUNDS = 7


def noisy(center: float, seed: int, spread: float = 0.2) -> list[float]:
    """Seven samples within ±spread/2 of `center`: a loaded host's round-to-round noise."""
    rng = random.Random(seed)
    return [center * (1 + spread * (rng.random() - 0.5)) for _ in range(ROUNDS)]


def trees(old: float, new: float, seed: int) -> dict[str, list[float]]:
    return {"old": noisy(old, seed), "agent": noisy(new, seed + 1), "expert": noisy(new, seed + 2)}


def fourteen_tests(fast: float) -> dict[str, dict[str, list[float]]]:
    """One test `fast` times faster natively, thirteen unchanged."""
    kept = {f"same{i:02d}": trees(1.0, 1.0, 10 * i) for i in range(13)}
    kept["fast"] = trees(1.0, 1.0 / fast, 999)
    return kept


def test_a_speedup_the_counts_chose_is_confirmed_on_its_own_family() -> None:
    kept = fourteen_tests(1.12)
    # over all fourteen tests (28 hypotheses) seven noisy rounds cannot carry it
    over_all = native_verdict(Settings(), kept, list(kept), rounds=ROUNDS, leased_core=1)
    assert not over_all.confirmed and over_all.improved == []
    # the counts chose `fast`: the family is that one test
    c = native_verdict(Settings(), kept, ["fast"], rounds=ROUNDS, leased_core=1)
    assert c.confirmed and c.improved == ["fast"] and c.regressed == [] and c.short_of_expert == []
    assert set(c.speedup) == set(kept) and c.speedup["fast"] > 1.05 and c.rounds == ROUNDS


def test_no_native_speedup_on_the_chosen_test_is_not_confirmed() -> None:
    kept = fourteen_tests(1.12)
    c = native_verdict(Settings(), kept, ["same03"], rounds=ROUNDS, leased_core=1)
    assert not c.confirmed and c.improved == []


def test_a_regression_outside_the_family_still_refuses() -> None:
    kept = fourteen_tests(1.12)
    kept["same05"] = {"old": noisy(1.0, 5, 0.02), "agent": noisy(1.5, 6, 0.02), "expert": noisy(1.0, 7, 0.02)}
    c = native_verdict(Settings(), kept, ["fast"], rounds=ROUNDS, leased_core=1)
    assert not c.confirmed and c.improved == ["fast"] and "same05" in c.regressed


def test_clearly_behind_the_expert_is_not_confirmed() -> None:
    kept = fourteen_tests(1.12)
    kept["fast"]["expert"] = noisy(1.0 / 1.6, 77, 0.02)
    c = native_verdict(Settings(), kept, ["fast"], rounds=ROUNDS, leased_core=1)
    assert not c.confirmed and c.short_of_expert == ["fast"]


def test_budgeted_rounds_fill_the_budget_within_bounds() -> None:
    assert budgeted_rounds(0.5, budget=10.0, warmup=1, at_least=8, at_most=31) == 21
    assert budgeted_rounds(0.1, budget=10.0, warmup=1, at_least=8, at_most=31) == 31
    assert budgeted_rounds(5.0, budget=10.0, warmup=1, at_least=8, at_most=31) == 8
    assert budgeted_rounds(0.1, budget=10.0, warmup=1, at_least=8, at_most=0) == 8  # no growth asked


class Sleeper:
    """Each run sleeps `seconds`; reports `cpu[side]` seconds of CPU (the outcome), whatever it slept."""

    def __init__(self, seconds: float, cpu: dict[str, float]) -> None:
        self.seconds, self.cpu, self.calls = seconds, cpu, 0

    def __call__(self, side: str, _name: str) -> RunResult:
        self.calls += 1
        time.sleep(self.seconds)
        c = self.cpu[side]
        return RunResult(0, c, c, "", False, False)


def _measure(run: Sleeper, **kw: float) -> int:
    meas = measure(
        ["a", "b"],
        run,
        rounds=8,
        warmup=1,
        seed=3,
        sides=("old", "agent"),
        metric="cpu",
        budget=kw.get("budget", 2.0),
        max_rounds=31,
        floor=kw.get("floor", 0.0),
    )
    assert meas.failure is None
    kept = {len(meas.samples[n].cpu["old"]) for n in ("a", "b")}
    assert kept == {meas.rounds - 1} and set(meas.rounds_run.values()) == {meas.rounds}
    return meas.rounds


def test_short_tests_get_more_rounds_long_ones_keep_theirs() -> None:
    # 4 runs of ~2 ms a round: 2 s of budget asks for hundreds; capped at 31
    assert _measure(Sleeper(0.002, {"old": 0.002, "agent": 0.002})) == 31
    # 4 runs of 50 ms a round: 0.1 s holds one kept round, fewer than asked for: 8 stay
    assert _measure(Sleeper(0.05, {"old": 0.05, "agent": 0.05}), budget=0.1) == 8


def test_the_rounds_depend_on_durations_not_on_the_outcome() -> None:
    same = _measure(Sleeper(0.03, {"old": 0.03, "agent": 0.03}), budget=2.0)
    faster = _measure(Sleeper(0.03, {"old": 0.03, "agent": 0.01}), budget=2.0)
    assert 8 < same < 31 and abs(same - faster) <= 2, (same, faster)  # only the sleeps' jitter differs


def test_repeats_per_sample_count_in_the_estimate() -> None:
    # runs of 2 ms repeated to a 40 ms floor: a kept round costs ~20x a warm-up round
    repeated = _measure(Sleeper(0.002, {"old": 0.002, "agent": 0.002}), budget=2.0, floor=0.04)
    assert 8 <= repeated <= 15, repeated


def test_confirm_max_runs_below_confirm_runs_is_refused() -> None:
    assert load_settings(env={}).evaluator.confirm_max_runs == 31
    with pytest.raises(ConfigError, match=r"evaluator\.confirm_max_runs"):
        load_settings(env={"CPPPERF_EVALUATOR_CONFIRM_MAX_RUNS": "7"})
