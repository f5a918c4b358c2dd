"""The cascade's gate: which commits the LLM vote never needs to see.

A commit goes on to the vote when the trained scorer gives it at least the gate threshold (chosen
on held-out repositories to keep ~95 % of positives) or when the rule heuristic calls it positive
(its rules are precise, and a rule hit costs two calls at most). Everything else is answered "no"
here, with the scorer's evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cppperf.services.classifier.features import MAX_DIFF_CHARS
from cppperf.services.classifier.heuristic import score_commit
from cppperf.services.classifier.scorer import Model


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    probability: float
    evidence: list[str] = field(default_factory=list)


def gate(
    model: Model, threshold: float, message: str, issues: str, diff: str, *, heuristic_threshold: float = 2.0
) -> GateDecision:
    p = model.probability(message, issues, diff)
    if p >= threshold:
        return GateDecision(True, p)
    h = score_commit(message, issues, diff[:MAX_DIFF_CHARS], threshold=heuristic_threshold)
    if h.label:
        return GateDecision(True, p, [f"rules say positive (score {h.score:g})"])
    return GateDecision(
        False, p, [f"scorer p={p:.3f} < gate {threshold:.3f}", *model.explain(message, issues, diff)]
    )
