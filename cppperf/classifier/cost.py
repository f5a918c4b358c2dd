"""What the LLM vote costs with and without the cascade, per 1,000 structurally selected commits.

The paper's vote asks two models per commit (phase 1) and a third call for each disagreement
(phase 2). The cascade asks nothing for a commit the prefilter drops or the scorer puts below the
gate. Phase-2 share: measured when an LLM backend ran (its share among the commits it was asked
about); otherwise an assumed figure, said so in the report. Tokens are estimated from the prompts
themselves (`prompts.approx_tokens`, 4 characters a token) so that no-model runs still price the
choice; an LLM run also reports the server's own token counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cppperf.services.classifier import prompts


@dataclass(frozen=True)
class CommitCost:
    truth: bool
    asked: bool  # passed prefilter and gate: the LLM vote runs
    phase1_tokens: int  # one phase-1 prompt
    phase2_tokens: int  # the phase-2 prompt (diff within budget)


@dataclass
class CostReport:
    commits: int
    asked_share: float  # commits the cascade sends to the LLM vote
    recall_kept: float  # positives the cascade sends on (its loss is 1 - this)
    phase2_share: float
    phase2_measured: bool
    paper_calls_per_1000: float
    cascade_calls_per_1000: float
    calls_ratio: float  # cascade / paper
    paper_prompt_tokens_per_1000: int
    cascade_prompt_tokens_per_1000: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def commit_cost(
    truth: bool, asked: bool, message: str, issues: str, diff: str, diff_budget: int
) -> CommitCost:
    issues = issues.strip() or "(none)"
    p1 = prompts.SYSTEM + prompts.PHASE1.format(message=message.strip(), issues=issues)
    p2 = prompts.SYSTEM + prompts.PHASE2.format(
        message=message.strip(), issues=issues, diff=prompts.budget_diff(diff, diff_budget)
    )
    return CommitCost(truth, asked, prompts.approx_tokens(p1), prompts.approx_tokens(p2))


def cost_report(costs: list[CommitCost], *, phase2_share: float, measured: bool) -> CostReport:
    n = len(costs) or 1
    asked = [c for c in costs if c.asked]
    pos = [c for c in costs if c.truth]
    per = 1000 / n
    d = phase2_share
    paper_calls = len(costs) * (2 + d)
    cascade_calls = len(asked) * (2 + d)

    def tokens(cs: list[CommitCost]) -> float:
        return sum(2 * c.phase1_tokens + d * c.phase2_tokens for c in cs)

    return CostReport(
        commits=len(costs),
        asked_share=round(len(asked) / n, 4),
        recall_kept=round(sum(c.asked for c in pos) / len(pos), 4) if pos else 1.0,
        phase2_share=round(d, 4),
        phase2_measured=measured,
        paper_calls_per_1000=round(paper_calls * per, 1),
        cascade_calls_per_1000=round(cascade_calls * per, 1),
        calls_ratio=round(cascade_calls / paper_calls, 4) if paper_calls else 0.0,
        paper_prompt_tokens_per_1000=round(tokens(costs) * per),
        cascade_prompt_tokens_per_1000=round(tokens(asked) * per),
    )
