"""The trained scorer: L2-regularised logistic regression over `features.commit_features`.

Training is a few lines on `scipy.optimize` (L-BFGS on the log-loss with class weights), so the
project needs no machine-learning dependency; scoring is a dictionary look-up per feature, so the
shipped model (`model.json`: vocabulary → weight, bias, thresholds, how it was trained) is plain
JSON that `cppperf classify train` rebuilds byte for byte from the same data.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cppperf.services.classifier.features import commit_features

if TYPE_CHECKING:  # training only: scoring needs neither, so the service never imports them
    import numpy as np
    from scipy import sparse

MODEL_PATH = Path(__file__).with_name("model.json")
# 2: concept and diff-structure features, words kept only when several repositories use them
MODEL_VERSION = 2


@dataclass(frozen=True)
class Example:
    repo: str
    sha: str
    message: str
    issue_text: str
    diff: str
    label: bool
    source: str  # "cppperf-db", "labels", "mined"


@dataclass
class Model:
    weights: dict[str, float]
    bias: float
    label_threshold: float = 0.5  # probability at which the no-model backend says positive
    gate_threshold: float = 0.1  # below this the cascade answers "no" without asking an LLM
    meta: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def digest(self) -> str:
        """Short content hash: part of cache keys and `prompt_version`, so a retrained model never
        reuses an old model's answers."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    def probability(self, message: str, issue_text: str, diff: str) -> float:
        z = self.bias + sum(self.weights.get(f, 0.0) for f in commit_features(message, issue_text, diff))
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))

    def explain(self, message: str, issue_text: str, diff: str, top: int = 5) -> list[str]:
        ws = [(f, self.weights[f]) for f in commit_features(message, issue_text, diff) if f in self.weights]
        ws.sort(key=lambda fw: -abs(fw[1]))
        return [f"{f} ({w:+.2f})" for f, w in ws[:top]]

    def to_json(self) -> str:
        body = {
            "version": MODEL_VERSION,
            "bias": round(self.bias, 5),
            "label_threshold": round(self.label_threshold, 5),
            "gate_threshold": round(self.gate_threshold, 5),
            "meta": self.meta,
            "weights": {f: round(w, 4) for f, w in sorted(self.weights.items())},
        }
        return json.dumps(body, indent=0, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Model:
        d = json.loads(text)
        if d.get("version") != MODEL_VERSION:
            raise ValueError(f"model version {d.get('version')!r}, expected {MODEL_VERSION}")
        return cls(
            weights={str(k): float(v) for k, v in d["weights"].items()},
            bias=float(d["bias"]),
            label_threshold=float(d["label_threshold"]),
            gate_threshold=float(d["gate_threshold"]),
            meta=dict(d.get("meta", {})),
        )


_CACHE: dict[Path, Model] = {}


def load_model(path: Path | None = None) -> Model:
    """The model at `path` (default: the one shipped in the package), read once per process."""
    p = path or MODEL_PATH
    if p not in _CACHE:
        _CACHE[p] = Model.from_json(p.read_text())
    return _CACHE[p]


GATE_RECALLS = (0.9, 0.95, 0.98, 0.99)


L2_GRID = (1.0, 3.0, 10.0)


@dataclass(frozen=True)
class TrainConfig:
    l2: float | None = None  # None: chosen from `l2_grid` by cross-validation over the training repositories
    l2_grid: tuple[float, ...] = L2_GRID
    min_df: int = 2
    min_repos: int = 3  # a word (`w:`/`b:`) is a feature only if this many training repositories use it
    max_features: int = 4000
    gate_recall: float = 0.95  # the cascade threshold keeps this share of out-of-fold positives
    inner_folds: int = 3


def _design(feats: Sequence[frozenset[str]], vocab: dict[str, int]) -> sparse.csr_matrix:
    import numpy as np
    from scipy import sparse

    rows, cols = [], []
    for i, fs in enumerate(feats):
        for f in fs:
            j = vocab.get(f)
            if j is not None:
                rows.append(i)
                cols.append(j)
    data = np.ones(len(rows))
    return sparse.csr_matrix((data, (rows, cols)), shape=(len(feats), len(vocab)))


def fit_logistic(x: sparse.csr_matrix, y: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    import numpy as np
    from scipy import optimize

    pos = max(int(y.sum()), 1)
    neg = max(len(y) - pos, 1)
    sw = np.where(y > 0, len(y) / (2 * pos), len(y) / (2 * neg))  # balanced classes
    n = x.shape[1]

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:n], theta[n]
        z = x @ w + b
        # log(1 + e^z) - y z, stable
        lz = np.logaddexp(0.0, z)
        value = float(np.sum(sw * (lz - y * z)) + 0.5 * l2 * w @ w)
        g = sw * (1.0 / (1.0 + np.exp(-z)) - y)
        grad = np.concatenate([x.T @ g + l2 * w, [g.sum()]])
        return value, grad

    res = optimize.minimize(loss, np.zeros(n + 1), jac=True, method="L-BFGS-B", options={"maxiter": 500})
    return res.x[:n], float(res.x[n])


def _vocabulary(feats: Sequence[frozenset[str]], repos: Sequence[str], cfg: TrainConfig) -> dict[str, int]:
    df: Counter[str] = Counter()
    seen_in: dict[str, set[str]] = {}
    for fs, repo in zip(feats, repos, strict=True):
        df.update(fs)
        for f in fs:
            if f.startswith(("w:", "b:")):
                seen_in.setdefault(f, set()).add(repo)

    def keep(f: str) -> bool:
        return df[f] >= cfg.min_df and (f not in seen_in or len(seen_in[f]) >= cfg.min_repos)

    kept = sorted((f for f in df if keep(f)), key=lambda f: (-df[f], f))
    return {f: i for i, f in enumerate(sorted(kept[: cfg.max_features]))}


def fit_weights(examples: Sequence[Example], cfg: TrainConfig) -> tuple[dict[str, float], float]:
    import numpy as np

    feats = [commit_features(e.message, e.issue_text, e.diff) for e in examples]
    vocab = _vocabulary(feats, [e.repo for e in examples], cfg)
    y = np.array([1.0 if e.label else 0.0 for e in examples])
    w, b = fit_logistic(_design(feats, vocab), y, cfg.l2 if cfg.l2 is not None else 1.0)
    return {f: float(w[j]) for f, j in vocab.items() if abs(w[j]) >= 1e-3}, b


def recall_threshold(pos_scores: Sequence[float], recall: float) -> float:
    """The highest threshold that keeps at least `recall` of the positives (score >= threshold)."""
    if not pos_scores:
        return 0.0
    s = sorted(pos_scores)
    k = math.floor((1.0 - recall) * len(s))  # how many positives we may lose
    return max(0.0, s[k] - 1e-9)


def f1_threshold(scores: Sequence[float], labels: Sequence[bool], *, neg_weight: float = 1.0) -> float:
    """The lowest threshold that maximises F1 on (out-of-fold) scores (`score >= t` is positive).
    `neg_weight` counts each negative that many times: F1 at another prevalence than the sample's."""
    pairs = sorted(zip(scores, labels, strict=True), key=lambda sl: -sl[0])
    total_pos = sum(1 for y in labels if y)
    best, best_t = -1.0, 0.5
    tp = fp = 0
    i = 0
    candidates: list[tuple[float, float]] = []  # (threshold, F1), highest threshold first
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            tp += pairs[j][1]
            fp += not pairs[j][1]
            j += 1
        fn = total_pos - tp
        f1 = 2 * tp / (2 * tp + neg_weight * fp + fn) if tp else 0.0
        candidates.append((pairs[i][0], f1))
        i = j
    for t, f1 in reversed(candidates):  # ascending thresholds: a tie keeps the lowest
        if f1 > best:
            best, best_t = f1, t
    return best_t


def repo_folds(repos: Sequence[str], k: int) -> list[set[str]]:
    """Deterministic grouping of repositories into `k` folds of about equal example counts."""
    counts = Counter(repos)
    folds: list[set[str]] = [set() for _ in range(k)]
    sizes = [0] * k
    for repo, c in sorted(counts.items(), key=lambda rc: (-rc[1], rc[0])):
        i = min(range(k), key=lambda j: (sizes[j], j))
        folds[i].add(repo)
        sizes[i] += c
    return folds


def out_of_fold_scores(examples: Sequence[Example], cfg: TrainConfig, k: int) -> list[float]:
    """Each example scored by a model trained without its repository."""
    scores = [0.0] * len(examples)
    for held in repo_folds([e.repo for e in examples], k):
        train = [e for e in examples if e.repo not in held]
        w, b = fit_weights(train, cfg)
        m = Model(w, b)
        for i, e in enumerate(examples):
            if e.repo in held:
                scores[i] = m.probability(e.message, e.issue_text, e.diff)
    return scores


def average_precision(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the precision-recall curve (ranking quality, threshold-free); ties count together."""
    pos = sum(labels)
    if not pos:
        return 0.0
    pairs = sorted(zip(scores, labels, strict=True), key=lambda sl: -sl[0])
    ap = 0.0
    tp = seen = 0
    i = 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        hits = sum(1 for _, y in pairs[i:j] if y)
        tp += hits
        seen += j - i
        ap += hits / pos * (tp / seen)
        i = j
    return ap


def grid_scores(examples: Sequence[Example], cfg: TrainConfig) -> dict[float, list[float]]:
    """Out-of-fold scores (inner repository folds) for each L2 strength `train` would consider."""
    grid = (cfg.l2,) if cfg.l2 is not None else tuple(sorted(cfg.l2_grid, reverse=True))
    return {l2: out_of_fold_scores(examples, replace(cfg, l2=l2), cfg.inner_folds) for l2 in grid}


def choose_l2(oof_by_l2: dict[float, list[float]], labels: Sequence[bool]) -> tuple[float, float]:
    """(L2, AP): the strength whose out-of-fold scores rank best; strongest first, so a tie keeps
    the simpler model."""
    chosen: tuple[float, float] | None = None  # (AP, l2)
    for l2 in sorted(oof_by_l2, reverse=True):
        ap = average_precision(oof_by_l2[l2], labels)
        if chosen is None or ap > chosen[0] + 1e-9:
            chosen = (ap, l2)
    assert chosen is not None
    return chosen[1], chosen[0]


def train_from_scores(
    examples: Sequence[Example], cfg: TrainConfig, oof_by_l2: dict[float, list[float]]
) -> tuple[Model, list[float]]:
    """`train` once the out-of-fold scores per L2 are known (cross-validation computes them once
    for several grids); also returns the chosen strength's out-of-fold scores."""
    labels = [e.label for e in examples]
    l2, ap = choose_l2(oof_by_l2, labels)
    oof = oof_by_l2[l2]
    grid = sorted(oof_by_l2, reverse=True)
    cfg = replace(cfg, l2=l2)
    pos = [s for s, y in zip(oof, labels, strict=True) if y]
    label_t = f1_threshold(oof, labels)
    # the gate never drops what the scorer itself would call positive
    gate = min(recall_threshold(pos, cfg.gate_recall), label_t)
    # other operating points, for `classifier.cascade_threshold` without retraining
    gates = {f"{r:.2f}": round(min(recall_threshold(pos, r), label_t), 5) for r in GATE_RECALLS}
    w, b = fit_weights(examples, cfg)
    sources = Counter(f"{e.source}:{'pos' if e.label else 'neg'}" for e in examples)
    meta = {
        "examples": len(examples),
        "repositories": len({e.repo for e in examples}),
        "sources": dict(sorted(sources.items())),
        "gate_thresholds": gates,  # held-out positives' recall → threshold
        "inner_average_precision": round(ap, 4),
        "config": {
            "l2": cfg.l2,
            "l2_grid": list(grid),
            "min_repos": cfg.min_repos,
            "min_df": cfg.min_df,
            "max_features": cfg.max_features,
            "gate_recall": cfg.gate_recall,
            "inner_folds": cfg.inner_folds,
        },
    }
    return Model(w, b, label_threshold=label_t, gate_threshold=gate, meta=meta), oof


def check_classes(examples: Sequence[Example]) -> None:
    if not any(e.label for e in examples) or all(e.label for e in examples):
        raise ValueError("training needs both positive and negative examples")


def train(examples: Sequence[Example], cfg: TrainConfig | None = None) -> Model:
    """Fit on everything; choose the regularisation and both thresholds on out-of-fold scores
    (models trained without the scored commit's repository): the L2 strength with the best average
    precision over the grid, the gate for recall, the label threshold for F1."""
    cfg = cfg or TrainConfig()
    check_classes(examples)
    return train_from_scores(examples, cfg, grid_scores(examples, cfg))[0]
