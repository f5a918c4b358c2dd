"""Scores: per-test speed-up vs the original with CIs, geometric means, fraction of the expert's
speed-up, and `opt`: a significant speed-up vs the original, no regression, and on every timed
test the agent is not *significantly* short of 95 % of the expert's speed-up — i.e. the 95 % CI of
t_agent / t_expert reaches down to 1/0.95. (Comparing point estimates would fail an agent whose
patch equals the expert's about half the time, from noise alone.)"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import msgspec

from cppperf.shared.domain import PerTestScore, StatsRecord
from cppperf.shared.engine.stats import compare_all, compare_exact, compare_test


class Score(msgspec.Struct, kw_only=True, frozen=True):
    """The score block of a report (`EvalReport` has these fields)."""

    per_test: dict[str, PerTestScore]
    gm_speedup_agent: float
    gm_speedup_expert: float
    fraction_of_expert: float | None
    agent_significant: bool
    agent_regressed: bool
    opt: bool


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 1.0


def score(
    samples: Mapping[str, Mapping[str, list[float]]],
    *,
    alpha: float,
    min_improvement: float,
    opt_fraction: float,
    resamples: int,
    seed: int,
    exact: Collection[str] = (),
    tolerance: float = 0.001,
) -> Score:
    """`samples[test][side]` with sides old, agent, expert → the score block of a report. Tests in
    `exact` are counted (Cachegrind), not timed: decided on the counts' change when each side's
    counts agree within `tolerance` (`stats.compare_exact`), as the builder decides them."""

    def against_old(side: str) -> dict[str, StatsRecord]:
        decided = compare_all(
            {n: (s["old"], s[side]) for n, s in samples.items()},
            alpha=alpha,
            min_improvement=min_improvement,
            resamples=resamples,
            seed=seed,
            exact=exact,
            tolerance=tolerance,
        )
        return {t.name: t for t in decided}

    agent, expert = against_old("agent"), against_old("expert")
    per_test: dict[str, PerTestScore] = {}
    within = True
    for i, name in enumerate(sorted(samples)):
        a, e = agent[name], expert[name]
        counted = name in exact and (
            compare_exact(name, samples[name]["expert"], samples[name]["agent"], tolerance=tolerance)
        )
        vs = counted or compare_test(
            name, samples[name]["expert"], samples[name]["agent"], resamples=resamples, seed=seed + i
        )
        close_enough = vs.ci_low <= 1 / opt_fraction  # t_agent / t_expert
        within = within and close_enough
        per_test[name] = PerTestScore(
            agent_speedup=1 / a.ratio,
            agent_ci=[1 / a.ci_high, 1 / a.ci_low] if a.ci_low > 0 else None,
            agent_improved=a.improved,
            agent_regressed=a.regressed,
            expert_speedup=1 / e.ratio,
            expert_ci=[1 / e.ci_high, 1 / e.ci_low] if e.ci_low > 0 else None,
            expert_improved=e.improved,
            **_medians(name in exact, {"old": a.median_old, "agent": a.median_new, "expert": e.median_new}),
            agent_vs_expert_time_ratio=vs.ratio,
            agent_vs_expert_ci=[vs.ci_low, vs.ci_high],
            within_opt_fraction=close_enough,
        )
    gm_agent = geomean([v.agent_speedup for v in per_test.values()])
    gm_expert = geomean([v.expert_speedup for v in per_test.values()])
    fraction = (gm_agent - 1) / (gm_expert - 1) if gm_expert > 1 else None
    significant = any(v.agent_improved for v in per_test.values())
    regressed = any(v.agent_regressed for v in per_test.values())
    return Score(
        per_test=per_test,
        gm_speedup_agent=gm_agent,
        gm_speedup_expert=gm_expert,
        fraction_of_expert=fraction,
        agent_significant=significant,
        agent_regressed=regressed,
        opt=significant and not regressed and within,
    )


def _medians(counted: bool, medians: dict[str, float]) -> dict[str, Any]:
    """A counted test's medians are instruction counts, a timed test's seconds (as milliseconds)."""
    if counted:
        return {"median_instructions": {k: round(v) for k, v in medians.items()}}
    return {"median_ms": {k: v * 1e3 for k, v in medians.items()}}
