"""Cross-validation over repositories for the no-model scorers and the cascade's gate.

Folds group whole repositories, drawn over the union of the repositories of the labelled commits
and of the training pool (CppPerf-DB entries, mined commits) by `union_folds`: each fold trains on
every commit of the other repositories and scores the held-out repositories' commits, so no
repository's vocabulary is both learned and tested. Any training commit whose sha is also a test
commit is dropped first (CppPerf-DB positives overlap the labelled set), so no commit scores itself.

Two evaluation populations, scored by the same fold models:
- `labelled`: the held-out repositories' hand-labelled commits (few positives, true labels);
- `cppperf_db_vs_mined`: the held-out repositories' CppPerf-DB entries (positives: the paper's
  vote said yes and the speed-up was built and timed) against their mined structurally selected
  commits (negatives; a few real speed-ups among them are label noise, so precision here is a
  lower bound). CppPerf-DB entries that are also labelled commits are scored only as labelled.

Scorers: the rule heuristic, and the trained scorer under each of `VARIANTS` — the shipped
training procedure and a small, fixed set of changes to it, every choice (L2, thresholds, the
stacking weights) made inside the training repositories only (nested). For the cascade: the share
of commits the gate passes to the LLM and the share of positives it keeps, on the labelled commits
and on the held-out mined commits (the structural filter's output: the population a cluster sees).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cppperf.classifier.corpus import without_overlap
from cppperf.services.classifier.cascade import gate
from cppperf.services.classifier.heuristic import HeuristicResult, score_commit
from cppperf.services.classifier.scorer import (
    GATE_RECALLS,
    Example,
    Model,
    TrainConfig,
    check_classes,
    choose_l2,
    f1_threshold,
    fit_logistic,
    grid_scores,
    train_from_scores,
)


@dataclass
class Counts:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, predicted: bool, truth: bool) -> None:
        if predicted and truth:
            self.tp += 1
        elif predicted:
            self.fp += 1
        elif truth:
            self.fn += 1
        else:
            self.tn += 1

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        return 2 * self.tp / (2 * self.tp + self.fp + self.fn) if self.tp else 0.0


@dataclass
class FoldResult:
    repositories: int
    commits: int
    positives: int
    model: dict[str, float]
    heuristic: dict[str, float]
    gate_passed_share: float  # labelled commits of the held-out repositories the gate sends on
    gate_recall: float  # their positives the gate sends on
    mined_passed_share: float | None  # held-out mined (unlabelled) commits the gate sends on
    cppperf_db_recall: float | None  # held-out CppPerf-DB positives the gate sends on
    held_out: list[str] = field(default_factory=list)  # the fold's repositories
    cppperf_db_positives: int = 0  # held-out CppPerf-DB entries (not labelled commits)
    mined_commits: int = 0
    populations: dict[str, dict[str, dict[str, float]]] = field(
        default_factory=dict
    )  # population → scorer → P/R/F1
    chosen: dict[str, dict[str, float]] = field(
        default_factory=dict
    )  # variant → L2, threshold (training folds)


@dataclass
class CrossValReport:
    folds: list[FoldResult] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "folds": [asdict(f) for f in self.folds]}


def _prf(c: Counts) -> dict[str, float]:
    return {
        "precision": round(c.precision, 4),
        "recall": round(c.recall, 4),
        "f1": round(c.f1, 4),
        "tp": c.tp,
        "fp": c.fp,
        "fn": c.fn,
        "tn": c.tn,
    }


def _mean_sd(xs: Sequence[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(xs), 4) if xs else 0.0,
        "sd": round(statistics.stdev(xs), 4) if len(xs) > 1 else 0.0,
    }


def _add_curve(
    model: Model,
    tests: Sequence[Example],
    mined: Sequence[Example],
    db_pos: Sequence[Example],
    curve: dict[float, Counts],
    curve_mined: dict[float, list[int]],
    curve_db: dict[float, list[int]],
) -> None:
    """The gate at each of the model's recall operating points, on one fold's held-out commits."""
    for r in GATE_RECALLS:
        t = float(model.meta["gate_thresholds"][f"{r:.2f}"])
        for e in tests:
            curve[r].add(gate(model, t, e.message, e.issue_text, e.diff).passed, e.label)
        curve_mined[r][0] += sum(gate(model, t, e.message, e.issue_text, e.diff).passed for e in mined)
        curve_mined[r][1] += len(mined)
        curve_db[r][0] += sum(gate(model, t, e.message, e.issue_text, e.diff).passed for e in db_pos)
        curve_db[r][1] += len(db_pos)


# ------------------------------------------------------------------ folds
def union_folds(tests: Sequence[Example], pool: Sequence[Example], k: int) -> list[set[str]]:
    """`k` disjoint sets of repositories covering every repository of `tests` and `pool`.

    Deterministic greedy stratification: repositories in the order (labelled positives, pool
    positives, commits), most first, then by name; each goes to the fold with the fewest of what
    it brings most of — labelled positives if it has any, else pool positives if it has any, else
    commits — ties to the fold with fewer commits, then the lower index. So the scarce labelled
    positives spread first, the CppPerf-DB positives next, and repositories without positives
    even out the sizes."""
    stats: dict[str, list[int]] = {}  # repo -> [labelled positives, pool positives, commits]
    for e in tests:
        st = stats.setdefault(e.repo, [0, 0, 0])
        st[0] += e.label
        st[2] += 1
    for e in pool:
        st = stats.setdefault(e.repo, [0, 0, 0])
        st[1] += e.label
        st[2] += 1
    folds: list[set[str]] = [set() for _ in range(k)]
    sizes = [[0, 0, 0] for _ in range(k)]
    for repo, (lp, pp, n) in sorted(stats.items(), key=lambda rs: (-rs[1][0], -rs[1][1], -rs[1][2], rs[0])):
        axis = 0 if lp else 1 if pp else 2
        i = min(range(k), key=lambda j: (sizes[j][axis], sizes[j][2], j))
        folds[i].add(repo)
        for a, v in enumerate((lp, pp, n)):
            sizes[i][a] += v
    return [f for f in folds if f]


# ------------------------------------------------------------------ the variants
@dataclass(frozen=True)
class Variant:
    """One training procedure for the no-model scorer, fixed before any fold was scored."""

    name: str
    description: str
    wide_grid: bool = False  # L2 from WIDE_L2_GRID instead of the shipped grid
    stack_rules: bool = False  # combine the model's log-odds with the rules' score (stacked)
    prevalence_threshold: bool = False  # F1 threshold at the labelled commits' prevalence


WIDE_L2_GRID = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
STACK_L2 = 0.01

VARIANTS = (
    Variant("shipped", "as `classify train`: L2 from 1/3/10 by inner average precision, F1 threshold"),
    Variant("wide-l2", "L2 from 0.3/1/3/10/30/100 by inner average precision", wide_grid=True),
    Variant(
        "stacked-rules",
        "2-weight logistic regression on the model's out-of-fold log-odds and the rules' score",
        stack_rules=True,
    ),
    Variant(
        "prevalence-threshold",
        "F1 threshold with negatives re-weighted to the training folds' hand-labelled prevalence",
        prevalence_threshold=True,
    ),
    Variant("all-three", "wide L2 grid + stacked rules + prevalence threshold", True, True, True),
)


def _logit(p: float) -> float:
    p = min(max(p, 1e-9), 1 - 1e-9)
    return math.log(p / (1 - p))


def _rules(e: Example, threshold: float) -> HeuristicResult:
    return score_commit(e.message, e.issue_text, e.diff, threshold=threshold)


@dataclass
class FittedVariant:
    model: Model
    stack: tuple[float, float, float] | None  # (weight of log-odds, weight of rules' score, bias)
    threshold: float

    def score(self, e: Example, rules_score: float) -> float:
        p = self.model.probability(e.message, e.issue_text, e.diff)
        if self.stack is None:
            return p
        a, c, b = self.stack
        z = a * _logit(p) + c * rules_score + b
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def _fit_stack(
    oof: Sequence[float], rules: Sequence[float], labels: Sequence[bool]
) -> tuple[float, float, float]:
    import numpy as np
    from scipy import sparse

    x = sparse.csr_matrix(np.array([[_logit(p), r] for p, r in zip(oof, rules, strict=True)]))
    w, b = fit_logistic(x, np.array([1.0 if y else 0.0 for y in labels]), STACK_L2)
    return float(w[0]), float(w[1]), b


def _stacked(stack: tuple[float, float, float], oof: Sequence[float], rules: Sequence[float]) -> list[float]:
    a, c, b = stack
    return [
        1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, a * _logit(p) + c * r + b))))
        for p, r in zip(oof, rules, strict=True)
    ]


def labelled_neg_weight(train_set: Sequence[Example]) -> float:
    """How many times to count each negative so that the training pool's positive share equals the
    hand-labelled commits' share among the training repositories (1.0 when there are none)."""
    lab = [e for e in train_set if e.source == "labels"]
    lab_pos = sum(e.label for e in lab)
    pos = sum(e.label for e in train_set)
    neg = len(train_set) - pos
    if not lab or not lab_pos or lab_pos == len(lab) or not pos or not neg:
        return 1.0
    prevalence = lab_pos / len(lab)
    # pos / (pos + w * neg) = prevalence
    return pos * (1 - prevalence) / (prevalence * neg)


def fit_variants(
    train_set: Sequence[Example], cfg: TrainConfig, heuristic_threshold: float
) -> tuple[dict[str, FittedVariant], dict[str, dict[str, float]]]:
    """Every variant on one training set; the out-of-fold scores for each L2 are computed once."""
    check_classes(train_set)
    labels = [e.label for e in train_set]
    narrow = tuple(cfg.l2_grid) if cfg.l2 is None else (cfg.l2,)
    wide = tuple(sorted(set(narrow) | set(WIDE_L2_GRID)))
    oof_all = grid_scores(train_set, replace(cfg, l2=None, l2_grid=wide))
    bases: dict[bool, tuple[Model, list[float]]] = {}
    narrow_model = train_from_scores(train_set, cfg, {l2: oof_all[l2] for l2 in narrow})
    bases[False] = narrow_model
    wide_l2, _ = choose_l2(oof_all, labels)
    if wide_l2 == narrow_model[0].meta["config"]["l2"]:
        bases[True] = narrow_model
    else:
        bases[True] = train_from_scores(train_set, replace(cfg, l2_grid=wide), oof_all)
    rules = [_rules(e, heuristic_threshold).score for e in train_set]
    neg_w = labelled_neg_weight(train_set)
    fitted: dict[str, FittedVariant] = {}
    chosen: dict[str, dict[str, float]] = {}
    for v in VARIANTS:
        model, oof = bases[v.wide_grid]
        stack = _fit_stack(oof, rules, labels) if v.stack_rules else None
        scores = _stacked(stack, oof, rules) if stack else oof
        w = neg_w if v.prevalence_threshold else 1.0
        t = model.label_threshold if not stack and w == 1.0 else f1_threshold(scores, labels, neg_weight=w)
        fitted[v.name] = FittedVariant(model, stack, t)
        chosen[v.name] = {
            "l2": float(model.meta["config"]["l2"]),
            "threshold": round(t, 5),
            "neg_weight": round(w, 4),
        }
        if stack:
            chosen[v.name]["stack_logit_weight"] = round(stack[0], 4)
            chosen[v.name]["stack_rules_weight"] = round(stack[1], 4)
    return fitted, chosen


POPULATIONS = ("labelled", "cppperf_db_vs_mined")
RULES = "rules"


def _summarise(fold_counts: list[dict[str, Counts]], pooled: dict[str, Counts]) -> dict[str, Any]:
    """mean ± sd over the folds that have positives in this population, and pooled counts."""
    out: dict[str, Any] = {}
    for name, c in pooled.items():
        per = [fc[name] for fc in fold_counts if fc[name].tp + fc[name].fn]
        out[name] = {
            **{m: _mean_sd([getattr(x, m) for x in per]) for m in ("precision", "recall", "f1")},
            "pooled": _prf(c),
            "folds_with_positives": len(per),
        }
    return out


def _add_counts(into: Counts, c: Counts) -> None:
    into.tp, into.fp, into.fn, into.tn = into.tp + c.tp, into.fp + c.fp, into.fn + c.fn, into.tn + c.tn


def _score_population(
    examples: Sequence[Example], fitted: dict[str, FittedVariant], scorers: Sequence[str], threshold: float
) -> dict[str, Counts]:
    """Confusion counts of the rules and of every fitted variant on one fold's population."""
    counts = {sc: Counts() for sc in scorers}
    for e in examples:
        h = _rules(e, threshold)
        counts[RULES].add(h.label, e.label)
        for v in VARIANTS:
            f = fitted[v.name]
            counts[v.name].add(f.score(e, h.score) >= f.threshold, e.label)
    return counts


def _gate_fold(
    model: Model, tests: Sequence[Example], mined: Sequence[Example], db_pos: Sequence[Example]
) -> tuple[Counts, int, int]:
    """The gate at the model's own threshold: counts on the labelled commits (predicted = passed),
    mined commits passed, CppPerf-DB positives passed."""

    def passed(e: Example) -> bool:
        return gate(model, model.gate_threshold, e.message, e.issue_text, e.diff).passed

    lab = Counts()
    for t in tests:
        lab.add(passed(t), t.label)
    return lab, sum(passed(e) for e in mined), sum(passed(e) for e in db_pos)


def cross_validate(
    pool: Sequence[Example],
    tests: Sequence[Example],
    *,
    k: int = 5,
    cfg: TrainConfig | None = None,
    heuristic_threshold: float = 2.0,
    progress: Callable[[int, int], None] | None = None,
) -> CrossValReport:
    """`pool`: every training example (CppPerf-DB, mined, and the labelled commits themselves);
    `tests`: the labelled commits to score. Folds are drawn over the repositories of both
    (`union_folds`)."""
    cfg = cfg or TrainConfig()
    pool = [p for p in pool if p.source != "labels"] + list(tests)
    test_all = {t.sha for t in tests}
    folds = union_folds(tests, [p for p in pool if p.source != "labels"], k)
    report = CrossValReport()
    scorers = [RULES, *(v.name for v in VARIANTS)]
    pop_folds: dict[str, list[dict[str, Counts]]] = {p: [] for p in POPULATIONS}
    pop_pooled = {p: {s: Counts() for s in scorers} for p in POPULATIONS}
    pooled_model, pooled_heur = Counts(), Counts()
    gate_lab = Counts()  # the gate on labelled commits: tp = positive passed, fp = negative passed
    mined_all = mined_passed = db_all = db_passed = 0
    curve = {r: Counts() for r in GATE_RECALLS}  # tp: positive passed, fn: positive dropped, ...
    curve_mined = {r: [0, 0] for r in GATE_RECALLS}  # [passed, all]
    curve_db = {r: [0, 0] for r in GATE_RECALLS}
    for i, held in enumerate(folds):
        test_shas = {t.sha for t in tests if t.repo in held}
        train_set = without_overlap(
            [p for p in pool if p.repo not in held], (t for t in tests if t.sha in test_shas)
        )
        fitted, chosen = fit_variants(train_set, cfg, heuristic_threshold)
        model: Model = fitted["shipped"].model
        held_tests = [t for t in tests if t.repo in held]
        mined = [p for p in pool if p.repo in held and p.source == "mined"]
        db_pos = [p for p in pool if p.repo in held and p.source == "cppperf-db" and p.sha not in test_all]
        pops = {"labelled": held_tests, "cppperf_db_vs_mined": db_pos + mined}
        fold_pop: dict[str, dict[str, dict[str, float]]] = {}
        for pop, examples in pops.items():
            counts = _score_population(examples, fitted, scorers, heuristic_threshold)
            for sc, c in counts.items():
                _add_counts(pop_pooled[pop][sc], c)
            pop_folds[pop].append(counts)
            fold_pop[pop] = {sc: _prf(c) for sc, c in counts.items()}
        c_model = pop_folds["labelled"][-1]["shipped"]
        c_heur = pop_folds["labelled"][-1][RULES]
        g_lab, m_passed, db_kept = _gate_fold(model, held_tests, mined, db_pos)
        _add_counts(gate_lab, g_lab)
        f_pos, f_kept, f_passed = g_lab.tp + g_lab.fn, g_lab.tp, g_lab.tp + g_lab.fp
        mined_all, mined_passed = mined_all + len(mined), mined_passed + m_passed
        db_all, db_passed = db_all + len(db_pos), db_passed + db_kept
        _add_curve(model, held_tests, mined, db_pos, curve, curve_mined, curve_db)
        report.folds.append(
            FoldResult(
                repositories=len(held),
                commits=len(held_tests),
                positives=f_pos,
                model=_prf(c_model),
                heuristic=_prf(c_heur),
                gate_passed_share=round(f_passed / len(held_tests), 4) if held_tests else 0.0,
                gate_recall=round(f_kept / f_pos, 4) if f_pos else 1.0,
                mined_passed_share=round(m_passed / len(mined), 4) if mined else None,
                cppperf_db_recall=round(db_kept / len(db_pos), 4) if db_pos else None,
                held_out=sorted(held),
                cppperf_db_positives=len(db_pos),
                mined_commits=len(mined),
                populations=fold_pop,
                chosen=chosen,
            )
        )
        _add_counts(pooled_model, c_model)
        _add_counts(pooled_heur, c_heur)
        if progress:
            progress(i + 1, len(folds))
    fs = report.folds
    n_lab = gate_lab.tp + gate_lab.fp + gate_lab.fn + gate_lab.tn
    with_pos = [f for f in fs if f.positives]
    report.summary = {
        "folds": len(fs),
        "k": k,
        "fold_scheme": "union of the repositories of the labelled commits, CppPerf-DB and mined "
        "commits; greedy stratified (crossval.union_folds)",
        "variants": [asdict(v) for v in VARIANTS],
        "populations": {
            pop: {
                "commits": sum(c[RULES].tp + c[RULES].fp + c[RULES].fn + c[RULES].tn for c in pop_folds[pop]),
                "positives": sum(c[RULES].tp + c[RULES].fn for c in pop_folds[pop]),
                "scorers": _summarise(pop_folds[pop], pop_pooled[pop]),
            }
            for pop in POPULATIONS
        },
        "model": {
            metric: _mean_sd([f.model[metric] for f in with_pos]) for metric in ("precision", "recall", "f1")
        },
        "heuristic": {
            metric: _mean_sd([f.heuristic[metric] for f in with_pos])
            for metric in ("precision", "recall", "f1")
        },
        "model_pooled": _prf(pooled_model),
        "heuristic_pooled": _prf(pooled_heur),
        "gate": {
            "passed_share": round((gate_lab.tp + gate_lab.fp) / n_lab, 4) if n_lab else 0.0,
            "recall_kept": round(gate_lab.recall, 4) if gate_lab.tp + gate_lab.fn else 1.0,
            "mined_passed_share": round(mined_passed / mined_all, 4) if mined_all else None,
            "cppperf_db_recall_kept": round(db_passed / db_all, 4) if db_all else None,
        },
        "gate_curve": [
            {
                "gate_recall_target": r,
                "passed_share": round((c.tp + c.fp) / (c.tp + c.fp + c.fn + c.tn), 4)
                if c.tp + c.fp + c.fn + c.tn
                else 0.0,
                "recall_kept": round(c.recall, 4),
                "mined_passed_share": round(curve_mined[r][0] / curve_mined[r][1], 4)
                if curve_mined[r][1]
                else None,
                "cppperf_db_recall_kept": round(curve_db[r][0] / curve_db[r][1], 4)
                if curve_db[r][1]
                else None,
            }
            for r, c in curve.items()
        ],
    }
    report.summary["targets"] = targets(report.summary)
    return report


# the issue's targets: no-model F1 >= 0.55 at precision >= 0.6 (means over folds); the cascade at
# <= 0.5x the paper's calls keeping >= 0.95 of the positives (labelled and CppPerf-DB, held out)
NO_MODEL_F1, NO_MODEL_PRECISION = 0.55, 0.6
CASCADE_RATIO, CASCADE_RECALL = 0.5, 0.95


def targets(summary: dict[str, Any]) -> dict[str, Any]:
    """Which of the issue's targets the cross-validated figures meet. The cascade's calls ratio is
    the share of held-out mined commits the gate passes (phase-2 disagreements spread evenly)."""

    met = [
        c["gate_recall_target"]
        for c in summary["gate_curve"]
        if c["mined_passed_share"] is not None
        and c["mined_passed_share"] <= CASCADE_RATIO
        and c["recall_kept"] >= CASCADE_RECALL
        and (c["cppperf_db_recall_kept"] is None or c["cppperf_db_recall_kept"] >= CASCADE_RECALL)
    ]

    def met_by(m: dict[str, Any]) -> bool:
        return bool(m["f1"]["mean"] >= NO_MODEL_F1 and m["precision"]["mean"] >= NO_MODEL_PRECISION)

    per_population = {
        pop: {name: met_by(m) for name, m in p["scorers"].items()}
        for pop, p in summary.get("populations", {}).items()
    }
    return {
        "no_model": {
            "f1_min": NO_MODEL_F1,
            "precision_min": NO_MODEL_PRECISION,
            "model_met": met_by(summary["model"]),
            "heuristic_met": met_by(summary["heuristic"]),
            "by_population": per_population,  # population → scorer → met (means over folds)
        },
        "cascade": {"calls_ratio_max": CASCADE_RATIO, "recall_min": CASCADE_RECALL, "met_at_gates": met},
    }
