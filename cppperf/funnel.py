"""The pipeline funnel (paper: commits scanned → structural → LLM-positive → built → verified),
computed from the store, overall and per repository."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from cppperf.shared.buckets import COMMITS, INSTANCES, REPOS
from cppperf.shared.domain import BUILT_VERDICTS, Stage, Verdict
from cppperf.shared.store import Store


@dataclass
class Funnel:
    repos: int = 0
    repos_rejected: int = 0
    scanned: int = 0
    selected: int = 0
    classified: int = 0
    positive: int = 0
    built: int = 0
    improved: int = 0
    rejected_builds: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


async def compute_funnel(store: Store) -> tuple[Funnel, dict[str, Funnel], dict[str, int]]:
    """Overall funnel, per-repo funnels, and counts of repository rejection reasons."""
    total = Funnel()
    per: dict[str, Funnel] = defaultdict(Funnel)
    reasons: dict[str, int] = defaultdict(int)
    for rec in await store.all(REPOS.name):
        repo = rec["id"]
        f = per[repo]
        f.repos = 1
        if rec.get("stage") == Stage.REJECTED:
            f.repos_rejected = 1
            reasons[str(rec.get("reason", ""))[:80]] += 1
        filt: dict[str, Any] = rec.get("filter") or {}
        f.scanned = int(filt.get("scanned", 0))
        f.selected = int(filt.get("selected", 0))
    for rec in await store.all(COMMITS.name):
        f = per[str(rec.get("repo", "?"))]
        if "label" in rec:
            f.classified += 1
            f.positive += bool(rec["label"])
    for rec in await store.all(INSTANCES.name):
        f = per[str(rec.get("repo", "?"))]
        verdict = rec.get("verdict")
        if verdict in BUILT_VERDICTS:
            f.built += 1
            f.improved += verdict == Verdict.IMPROVED
        elif verdict == Verdict.REJECTED:
            f.rejected_builds += 1
    for f in per.values():
        for k, v in f.as_dict().items():
            setattr(total, k, getattr(total, k) + v)
    return total, dict(per), dict(reasons)
