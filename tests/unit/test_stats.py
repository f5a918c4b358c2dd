"""Statistics on synthetic samples with known shifts: power for real 2× and 10 % speed-ups,
false-positive rate on A/A samples over many seeds, Benjamini-Hochberg, and both rules."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from cppperf.shared.engine.stats import (
    benjamini_hochberg,
    clearly_settled,
    compare_all,
    compare_test,
    decide,
    verdict,
)


def lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> list[float]:
    return list(median * np.exp(rng.normal(0, sigma, n)))


def test_known_shift_is_found_with_its_size() -> None:
    rng = np.random.default_rng(3)
    t = compare_test("t", lognormal(rng, 1.0, 0.03, 30), lognormal(rng, 0.5, 0.03, 30), resamples=500)
    assert 0.47 < t.ratio < 0.53
    assert t.ci_low < t.ratio < t.ci_high < 1.0
    assert t.p_improve < 1e-6 and t.p_regress > 0.99
    assert 0.45 < t.median_change < 0.55


def test_power_for_ten_percent_speedup() -> None:
    hits = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        tests = compare_all(
            {"t": (lognormal(rng, 1.0, 0.03, 30), lognormal(rng, 0.9, 0.03, 30))},
            alpha=0.05,
            min_improvement=0.05,
            resamples=300,
            seed=seed,
        )
        hits += tests[0].improved
    assert hits >= 38  # ≥ 95 % power for a 10 % shift at 3 % noise


def _a_a_flags(sigma: float, trials: int) -> tuple[int, int]:
    ours = paper = 0
    for seed in range(trials):
        rng = np.random.default_rng(1000 + seed)
        samples = {
            f"t{i}": (lognormal(rng, 1.0, sigma, 30), lognormal(rng, 1.0, sigma, 30)) for i in range(5)
        }
        tests = compare_all(samples, alpha=0.05, min_improvement=0.05, resamples=300, seed=seed)
        ours += verdict(tests) != "not-improved"
        paper += verdict(tests, paper=True) != "not-improved"
    return ours, paper


def test_false_positive_rate_on_a_a_samples() -> None:
    # quiet machine (3 % noise): neither rule flags anything
    assert _a_a_flags(0.03, 40) == (0, 0)
    # noisy machine (15 % noise): the paper's uncorrected rule flags many A/A instances, ours few
    ours, paper = _a_a_flags(0.15, 60)
    assert ours <= 9  # ≤ 15 %
    assert paper >= 3 * max(ours, 1)


def test_small_change_is_not_significant_even_if_p_is_tiny() -> None:
    rng = np.random.default_rng(5)
    tests = compare_all(
        {"t": (lognormal(rng, 1.0, 0.002, 30), lognormal(rng, 0.98, 0.002, 30))},
        alpha=0.05,
        min_improvement=0.05,
        resamples=300,
        seed=0,
    )
    assert tests[0].p_improve_adj < 1e-6
    assert not tests[0].improved and not tests[0].paper_improved


def test_regression_and_verdicts() -> None:
    rng = np.random.default_rng(9)
    tests = compare_all(
        {
            "fast": (lognormal(rng, 1.0, 0.02, 30), lognormal(rng, 0.5, 0.02, 30)),
            "slow": (lognormal(rng, 1.0, 0.02, 30), lognormal(rng, 1.5, 0.02, 30)),
        },
        alpha=0.05,
        min_improvement=0.05,
        resamples=300,
        seed=0,
    )
    by = {t.name: t for t in tests}
    assert by["fast"].improved and by["slow"].regressed
    assert verdict(tests) == "regressed"
    assert verdict([by["fast"]]) == "improved"


def test_benjamini_hochberg_matches_hand_computation() -> None:

    adj = benjamini_hochberg([0.01, 0.04, 0.03, 0.5])
    np.testing.assert_allclose(adj, [0.04, 0.05333333, 0.05333333, 0.5], rtol=1e-6)
    assert benjamini_hochberg([]) == []


def test_decide_uses_adjusted_p_values() -> None:
    rng = np.random.default_rng(11)
    raw = [
        compare_test(f"t{i}", lognormal(rng, 1, 0.05, 30), lognormal(rng, 1, 0.05, 30), resamples=200)
        for i in range(10)
    ]
    decided = decide(raw)
    assert all(d.p_improve_adj >= r.p_improve for d, r in zip(decided, raw, strict=True))


def test_early_stop_settles_clear_cases_only() -> None:
    rng = np.random.default_rng(2)
    assert (
        clearly_settled(lognormal(rng, 1, 0.002, 12), lognormal(rng, 1, 0.002, 12), min_improvement=0.05)
        == "unchanged"
    )
    assert (
        clearly_settled(lognormal(rng, 1, 0.02, 12), lognormal(rng, 0.5, 0.02, 12), min_improvement=0.05)
        == "changed"
    )
    assert (
        clearly_settled(lognormal(rng, 1, 0.10, 12), lognormal(rng, 0.97, 0.10, 12), min_improvement=0.05)
        is None
    )


def test_strict_rule_needs_the_whole_ci_beyond_the_threshold() -> None:
    r1, r2 = np.random.default_rng(1), np.random.default_rng(23)
    tests = compare_all(
        {
            "big": (lognormal(r1, 1.0, 0.02, 30), lognormal(r1, 0.7, 0.02, 30)),
            "edge": (lognormal(r2, 1.0, 0.04, 30), lognormal(r2, 0.94, 0.04, 30)),
        },
        alpha=0.05,
        min_improvement=0.05,
        resamples=500,
        seed=0,
    )
    by = {t.name: t for t in tests}
    assert by["big"].improved and by["big"].strict_improved
    assert (
        by["edge"].improved and not by["edge"].strict_improved
    )  # a 6 % point estimate, CI reaching below 5 %
    assert verdict([by["edge"]], rule="strict") == "not-improved"
    assert verdict([by["edge"]]) == "improved"


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_smallest_p_is_what_the_exact_test_gives_for_complete_separation(n: int) -> None:
    from scipy import stats as sps

    from cppperf.shared.engine.stats import smallest_p

    old, new = [10.0 + i for i in range(n)], [1.0 + i / 10 for i in range(n)]
    p = sps.mannwhitneyu(old, new, alternative="greater", method="exact").pvalue
    assert smallest_p(n, n) == pytest.approx(p)


@pytest.mark.parametrize(
    ("tests", "rule", "runs", "decidable"),
    [
        (2, "ours", 5, False),  # the demo (2 tests) with --runs 5: 4 vs 4 samples, 1/70 × 4 > 0.05
        (2, "ours", 6, True),  # 5 vs 5: 1/252 × 4 < 0.05
        (1, "ours", 5, True),  # one test: 1/70 × 2 < 0.05
        (1, "ours", 4, False),  # 3 vs 3: 1/20 × 2
        (3, "paper", 4, False),  # raw p, no correction: 1/20 is not below 0.05
        (3, "paper", 5, True),  # 1/70
        (500, "strict", 9, False),  # 8 vs 8: 1/12870 × 1000 > 0.05
        (500, "strict", 10, True),  # 9 vs 9: 1/48620 × 1000
    ],
)
def test_power_check_names_the_smallest_runs_that_can_decide(
    tests: int, rule: str, runs: int, decidable: bool
) -> None:
    from cppperf.shared.engine.stats import power_problem, runs_needed

    why = power_problem(tests, runs, rule=rule, alpha=0.05, warmup=1)
    assert (why is None) == decidable, why
    need = runs_needed(tests, rule=rule, alpha=0.05, warmup=1)
    assert power_problem(tests, need, rule=rule, alpha=0.05, warmup=1) is None
    assert power_problem(tests, need - 1, rule=rule, alpha=0.05, warmup=1) is not None
    if why:
        assert f"--runs {need}" in why


def test_an_underpowered_proof_says_so_in_its_record() -> None:
    from cppperf.services.builder.instance import InstanceResult, _check_power
    from cppperf.shared.domain import Verdict
    from cppperf.shared.settings import BuilderSettings

    few = InstanceResult(instance_id="x", verdict=Verdict.REJECTED)
    _check_power(3, BuilderSettings(runs=5, warmup=1), few)
    assert "--runs 6" in str(few.environment.power_warning)
    enough = InstanceResult(instance_id="y", verdict=Verdict.REJECTED)
    _check_power(3, BuilderSettings(runs=11, warmup=1), enough)
    assert "power_warning" not in msgspec.to_builtins(enough.environment)
    exact = InstanceResult(instance_id="z", verdict=Verdict.REJECTED)
    _check_power(3, BuilderSettings(runs=5, warmup=1, metric="cachegrind"), exact)
    assert "power_warning" not in msgspec.to_builtins(exact.environment)
