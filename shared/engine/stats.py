"""Statistics that decide whether a test got faster (scipy + numpy, no timing code here).

Per test, with `old` and `new` run times (seconds):
- Mann-Whitney U, one-sided each way (`p_improve`: new stochastically smaller; `p_regress`).
- `median_change` = (median(old) - median(new)) / median(old): positive means faster.
- `ratio` = Hodges-Lehmann estimate of new/old: exp(median of all pairwise log(new_j) - log(old_i)),
  with a bootstrap 95 % percentile CI (`ci_low`, `ci_high`); a ratio below 1 means faster.

Ours: a test improves significantly when its Benjamini-Hochberg adjusted `p_improve` < α,
`median_change` ≥ the threshold (5 %) and the CI lies wholly below 1; a regression mirrors this.
The paper's rule (per-test one-sided MWU p < 0.05 and mean improvement ≥ 5 %, no correction) is
computed beside it, and a `strict` variant (adjusted p < α and the whole CI beyond the threshold:
the improvement is *confidently* ≥ 5 %) for users who prefer fewer false positives to power.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import msgspec
import numpy as np
from numpy.typing import NDArray
from scipy import stats as sps

from cppperf.shared.domain import DecisionRule, StatsRecord, Verdict

FloatArray = NDArray[np.float64]
# the smallest value a sample is taken as (logs need it > 0): a femtosecond, below any real
# sample — a Google Benchmark per-iteration time can be well under a nanosecond
FLOOR = 1e-15


def hodges_lehmann_ratio(old: FloatArray, new: FloatArray) -> float:
    diffs = np.log(new)[None, :] - np.log(old)[:, None]
    return float(np.exp(np.median(diffs)))


def bootstrap_ratio_ci(
    old: FloatArray, new: FloatArray, *, resamples: int, rng: np.random.Generator, level: float = 0.95
) -> tuple[float, float]:
    """Percentile CI of the Hodges-Lehmann ratio, resampling both sides (vectorised)."""
    lo_old, lo_new = np.log(old), np.log(new)
    est = np.empty(resamples)
    step = max(1, 2_000_000 // max(1, len(old) * len(new)))
    for start in range(0, resamples, step):
        b = min(step, resamples - start)
        o = lo_old[rng.integers(0, len(old), size=(b, len(old)))]
        n = lo_new[rng.integers(0, len(new), size=(b, len(new)))]
        diffs = n[:, None, :] - o[:, :, None]
        est[start : start + b] = np.median(diffs.reshape(b, -1), axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(est, [alpha, 1 - alpha])
    return float(np.exp(low)), float(np.exp(high))


def _mwu(old: FloatArray, new: FloatArray, alternative: str) -> float:
    if np.all(old == old[0]) and np.all(new == new[0]) and old[0] == new[0]:
        return 1.0
    return float(sps.mannwhitneyu(old, new, alternative=alternative).pvalue)


def compare_test(
    name: str,
    old: Sequence[float],
    new: Sequence[float],
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> StatsRecord:
    """Unadjusted statistics for one test (decisions need `decide` across the instance)."""
    o = np.asarray(old, dtype=np.float64)
    n = np.asarray(new, dtype=np.float64)
    if len(o) < 2 or len(n) < 2:
        raise ValueError(f"{name}: need at least 2 samples per side, got {len(o)} and {len(n)}")
    o = np.maximum(o, FLOOR)
    n = np.maximum(n, FLOOR)
    if resamples > 0:
        ci_low, ci_high = bootstrap_ratio_ci(o, n, resamples=resamples, rng=np.random.default_rng(seed))
    else:  # not computed: an unknown CI never "excludes 1"
        ci_low, ci_high = 0.0, math.inf
    return _test_stats(name, o, n, ci_low, ci_high, _mwu(o, n, "greater"), _mwu(o, n, "less"))


def _test_stats(
    name: str, o: FloatArray, n: FloatArray, ci_low: float, ci_high: float, p_improve: float, p_regress: float
) -> StatsRecord:
    med_o, med_n = float(np.median(o)), float(np.median(n))
    mean_o, mean_n = float(np.mean(o)), float(np.mean(n))
    return StatsRecord(
        name=name,
        n_old=len(o),
        n_new=len(n),
        median_old=med_o,
        median_new=med_n,
        mean_old=mean_o,
        mean_new=mean_n,
        median_change=(med_o - med_n) / med_o,
        mean_change=(mean_o - mean_n) / mean_o,
        ratio=hodges_lehmann_ratio(o, n),
        ci_low=ci_low,
        ci_high=ci_high,
        p_improve=p_improve,
        p_regress=p_regress,
    )


_EXACT_MWU_MAX = 8  # scipy's `auto` MWU is exact up to this sample size: keep those per test


def compare_batch(samples: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> list[StatsRecord]:
    """`compare_test(..., resamples=0)` for many tests at once, sorted by name: medians, means,
    Hodges-Lehmann ratios and one Mann-Whitney U per sample-size group, vectorised (per-call
    overhead dominates thousands of small tests, e.g. importing published records)."""
    names = sorted(samples)
    arrays: list[tuple[FloatArray, FloatArray]] = []
    groups: dict[tuple[int, int], list[int]] = {}
    for i, name in enumerate(names):
        o = np.maximum(np.asarray(samples[name][0], dtype=np.float64), FLOOR)
        n = np.maximum(np.asarray(samples[name][1], dtype=np.float64), FLOOR)
        if len(o) < 2 or len(n) < 2:
            raise ValueError(f"{name}: need at least 2 samples per side, got {len(o)} and {len(n)}")
        arrays.append((o, n))
        groups.setdefault((len(o), len(n)), []).append(i)
    out: list[StatsRecord | None] = [None] * len(names)
    for (n_old, n_new), idx in groups.items():
        old_m = np.stack([arrays[i][0] for i in idx])
        new_m = np.stack([arrays[i][1] for i in idx])
        med_o, med_n = np.median(old_m, axis=1), np.median(new_m, axis=1)
        mean_o, mean_n = np.mean(old_m, axis=1), np.mean(new_m, axis=1)
        diffs = np.log(new_m)[:, None, :] - np.log(old_m)[:, :, None]
        ratio = np.exp(np.median(diffs.reshape(len(idx), -1), axis=1))
        same = (old_m == new_m[:, :1]).all(axis=1) & (new_m == new_m[:, :1]).all(axis=1)
        p_imp, p_reg = np.ones(len(idx)), np.ones(len(idx))
        varied = np.flatnonzero(~same)
        if len(varied) and min(n_old, n_new) <= _EXACT_MWU_MAX:
            for v in varied.tolist():
                p_imp[v] = _mwu(old_m[v], new_m[v], "greater")
                p_reg[v] = _mwu(old_m[v], new_m[v], "less")
        elif len(varied):
            p_imp[varied] = sps.mannwhitneyu(
                old_m[varied], new_m[varied], alternative="greater", axis=1
            ).pvalue
            p_reg[varied] = sps.mannwhitneyu(old_m[varied], new_m[varied], alternative="less", axis=1).pvalue
        for k, i in enumerate(idx):
            mo, mn, ao, an = float(med_o[k]), float(med_n[k]), float(mean_o[k]), float(mean_n[k])
            out[i] = StatsRecord(
                name=names[i],
                n_old=n_old,
                n_new=n_new,
                median_old=mo,
                median_new=mn,
                mean_old=ao,
                mean_new=an,
                median_change=(mo - mn) / mo,
                mean_change=(ao - an) / ao,
                ratio=float(ratio[k]),
                ci_low=0.0,
                ci_high=math.inf,
                p_improve=float(p_imp[k]),
                p_regress=float(p_reg[k]),
            )
    return [t for t in out if t is not None]


def compare_exact(
    name: str, old: Sequence[float], new: Sequence[float], *, tolerance: float
) -> StatsRecord | None:
    """Statistics for exact counts (Cachegrind's instructions): when each side's counts agree
    within `tolerance` (relative spread; a deterministic test's re-runs are identical), the change
    is certain and only its size decides — p is 0 in the direction the counts moved (1 the other
    way and when they did not move), and the "CI" is the range of new/old over all pairs. None
    when a side's counts spread wider: they are not exact, and the usual statistics decide."""
    o = np.maximum(np.asarray(old, dtype=np.float64), FLOOR)
    n = np.maximum(np.asarray(new, dtype=np.float64), FLOOR)
    if len(o) < 2 or len(n) < 2:
        raise ValueError(f"{name}: need at least 2 samples per side, got {len(o)} and {len(n)}")
    if max(o.max() / o.min(), n.max() / n.min()) - 1 > tolerance:
        return None
    low, high = float(n.min() / o.max()), float(n.max() / o.min())
    p_improve = 0.0 if high < 1.0 else 1.0
    p_regress = 0.0 if low > 1.0 else 1.0
    return msgspec.structs.replace(_test_stats(name, o, n, low, high, p_improve, p_regress), exact=True)


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    if not pvalues:
        return []
    return [float(p) for p in sps.false_discovery_control(np.asarray(pvalues, dtype=np.float64), method="bh")]


def decide(
    tests: Sequence[StatsRecord], *, alpha: float = 0.05, min_improvement: float = 0.05
) -> list[StatsRecord]:
    """Apply BH across the instance's tests and both decision rules.

    The family is every hypothesis tested: both directions of every test (an instance is flagged
    by an improvement *or* a regression), so BH runs over the 2m one-sided p-values together."""
    both = benjamini_hochberg([t.p_improve for t in tests] + [t.p_regress for t in tests])
    adj_i, adj_r = both[: len(tests)], both[len(tests) :]
    out = []
    for t, pi, pr in zip(tests, adj_i, adj_r, strict=True):
        out.append(
            msgspec.structs.replace(
                t,
                p_improve_adj=pi,
                p_regress_adj=pr,
                improved=pi < alpha and t.median_change >= min_improvement and t.ci_high < 1.0,
                regressed=pr < alpha and t.median_change <= -min_improvement and t.ci_low > 1.0,
                paper_improved=t.p_improve < alpha and t.mean_change >= min_improvement,
                paper_regressed=t.p_regress < alpha and t.mean_change <= -min_improvement,
                strict_improved=pi < alpha and t.ci_high <= 1.0 - min_improvement,
                strict_regressed=pr < alpha and t.ci_low >= 1.0 + min_improvement,
            )
        )
    return out


def verdict(tests: Sequence[StatsRecord], *, paper: bool = False, rule: str = "ours") -> Verdict:
    """improved | regressed | not-improved for one instance's decided tests under a rule:
    `ours` (the default), `paper`, or `strict` (the whole CI beyond the threshold)."""
    by = DecisionRule.PAPER if paper else DecisionRule(rule)
    imp = any(by.improved(t) for t in tests)
    reg = any(by.regressed(t) for t in tests)
    if reg:
        return Verdict.REGRESSED
    return Verdict.IMPROVED if imp else Verdict.NOT_IMPROVED


def clearly_settled(
    old: Sequence[float], new: Sequence[float], *, min_improvement: float, band: float = 0.01, seed: int = 0
) -> str | None:
    """Early-stop check: 'unchanged' when the ratio CI lies inside ±band, 'changed' when beyond
    the threshold; None while undecided."""
    o = np.maximum(np.asarray(old, dtype=np.float64), FLOOR)
    n = np.maximum(np.asarray(new, dtype=np.float64), FLOOR)
    low, high = bootstrap_ratio_ci(o, n, resamples=400, rng=np.random.default_rng(seed))
    if 1 - band <= low and high <= 1 + band:
        return "unchanged"
    if high < 1 - min_improvement or low > 1 + min_improvement:
        return "changed"
    return None


def compare_all(
    samples: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    alpha: float,
    min_improvement: float,
    resamples: int,
    seed: int,
    all_cis: bool = True,
    exact: Collection[str] = (),
    tolerance: float = 0.001,
) -> list[StatsRecord]:
    """Decide every test. With `all_cis=False` the (costly) bootstrap CI is computed only for
    tests whose adjusted p and magnitude already qualify: the others' decisions cannot depend on
    it (their CI fields are then 0 and inf). Tests in `exact` (counted, not timed) are decided
    by `compare_exact` when their counts are exact within `tolerance`."""
    items = sorted(samples.items())
    counted = {
        name: c
        for name, (old, new) in items
        if name in exact and (c := compare_exact(name, old, new, tolerance=tolerance)) is not None
    }
    raw = [counted.get(name) or compare_test(name, old, new, resamples=0) for name, (old, new) in items]
    prelim = decide(raw, alpha=alpha, min_improvement=min_improvement)
    out = []
    for i, (t, p) in enumerate(zip(raw, prelim, strict=True)):
        qualifies = p.p_improve_adj < alpha or p.p_regress_adj < alpha  # only then can a CI matter
        if (qualifies or all_cis) and resamples > 0 and not t.exact:
            old, new = items[i][1]
            out.append(compare_test(t.name, old, new, resamples=resamples, seed=seed + i))
        else:
            out.append(t)
    return decide(out, alpha=alpha, min_improvement=min_improvement)


def smallest_p(n_old: int, n_new: int) -> float:
    """The smallest one-sided Mann-Whitney p two samples of these sizes can give: complete
    separation in the exact test, one arrangement of C(n_old + n_new, n_old)."""
    return 1.0 / math.comb(n_old + n_new, n_old)


def runs_needed(tests: int, *, rule: str, alpha: float, warmup: int) -> int:
    """The fewest rounds with which a clean speed-up of one test among `tests` can be significant:
    the paper's rule compares the raw p with α; ours and strict the BH-adjusted one, and alone in
    a family of 2 × tests hypotheses (both directions) a p is adjusted to p × 2 × tests."""
    family = 1 if rule == "paper" else 2 * max(tests, 1)
    n = 2
    while smallest_p(n, n) * family >= alpha:
        n += 1
    return n + warmup


def power_problem(tests: int, runs: int, *, rule: str, alpha: float, warmup: int) -> str | None:
    """None when `runs` rounds can decide an instance of `tests` tests under `rule`; else why
    not, with the smallest `--runs` that can."""
    need = runs_needed(tests, rule=rule, alpha=alpha, warmup=warmup)
    if runs >= need:
        return None
    return (
        f"{runs} rounds ({runs - warmup} samples a side) cannot reach alpha={alpha} over {tests} "
        f"tests under the {rule!r} rule: even a clean speed-up's p stays at or above it; "
        f"use --runs {need} or more"
    )
