"""The classifier's quality on labelled commits (`cppperf classify eval`): score a backend on
labelled commits (lines with message, diff, manual_label, optional issue text)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cppperf.classifier.cost import CommitCost, commit_cost, cost_report
from cppperf.services.classifier.cascade import gate
from cppperf.services.classifier.prefilter import prefilter
from cppperf.services.classifier.service import Classifier, linked_text
from cppperf.shared.messages import CommitSelected, LinkedText


@dataclass
class QualityReport:
    total: int
    tp: int
    fp: int
    fn: int
    tn: int
    precision: float
    recall: float
    f1: float
    prefilter_recall: float
    prefilter_pruned_share: float
    llm_calls: int
    prompt_tokens: int
    completion_tokens: int
    wall_seconds: float
    backend: str
    cascade: dict[str, Any] = field(default_factory=dict)  # cost.CostReport: calls per 1,000, recall kept
    crossval: dict[str, Any] | None = None  # crossval.CrossValReport, with `classify eval --cv`

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_labels(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            raise ValueError(f"{path}:{n}: JSON nested too deeply") from None
        if "message" not in row or "manual_label" not in row:
            raise ValueError(f"{path}:{n}: needs 'message' and 'manual_label'")
        rows.append(row)
    return rows


def _commit(row: dict[str, Any], n: int) -> CommitSelected:
    issue = row.get("issue_text") or row.get("issue") or ""
    linked = [LinkedText(kind="issue", number=0, title="", body=str(issue))] if issue else []
    return CommitSelected(
        repo=row.get("repo", "labels/unknown"),
        url="",
        sha=row.get("sha", f"row{n}"),
        parent=row.get("parent", ""),
        date=row.get("date", ""),
        message=row["message"],
        linked=linked,
        diff=row.get("diff", ""),
    )


async def evaluate(
    classifier: Classifier,
    rows: list[dict[str, Any]],
    *,
    progress: Callable[[int, int], None] | None = None,
    assumed_phase2_share: float = 0.2,
) -> QualityReport:
    t0 = time.perf_counter()
    tp = fp = fn = tn = 0
    pos = pos_kept = pruned = 0
    ptok = ctok = 0
    costs: list[CommitCost] = []
    voted = phase2 = 0
    llm = classifier.settings.backend in ("openai", "vllm")
    for i, row in enumerate(rows):
        commit = _commit(row, i)
        truth = bool(row["manual_label"])
        kept = prefilter(commit.message, commit.diff).keep
        pruned += not kept
        if truth:
            pos += 1
            pos_kept += kept
        res = await classifier.classify(commit, commit.diff)
        issues = linked_text(commit)
        if llm:
            asked = res.backend not in ("prefilter", "cascade")
            voted += bool(res.votes)
            phase2 += res.phase == 2
        else:  # what the cascade would do: prefilter, then the scorer's gate
            asked = (
                kept
                and gate(
                    classifier.scorer,
                    classifier.gate_threshold,
                    commit.message,
                    issues,
                    commit.diff,
                    heuristic_threshold=classifier.settings.heuristic_threshold,
                ).passed
            )
        costs.append(
            commit_cost(
                truth, asked, commit.message, issues, commit.diff, classifier.settings.diff_token_budget
            )
        )
        for v in res.votes:
            ptok += v.prompt_tokens
            ctok += v.completion_tokens
        if res.label and truth:
            tp += 1
        elif res.label:
            fp += 1
        elif truth:
            fn += 1
        else:
            tn += 1
        if progress:
            progress(i + 1, len(rows))
    measured = llm and voted > 0
    cascade = cost_report(
        costs, phase2_share=phase2 / voted if measured else assumed_phase2_share, measured=measured
    )
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return QualityReport(
        total=len(rows),
        tp=tp,
        fp=fp,
        fn=fn,
        tn=tn,
        precision=round(p, 4),
        recall=round(r, 4),
        f1=round(2 * p * r / (p + r), 4) if p + r else 0.0,
        prefilter_recall=round(pos_kept / pos, 4) if pos else 1.0,
        prefilter_pruned_share=round(pruned / len(rows), 4) if rows else 0.0,
        llm_calls=classifier.llm_calls,
        prompt_tokens=ptok,
        completion_tokens=ctok,
        wall_seconds=round(time.perf_counter() - t0, 3),
        backend=classifier.settings.backend,
        cascade=cascade.as_dict(),
    )
