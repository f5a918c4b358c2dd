"""The paper's two-phase vote over any `Asker` (OpenAI-compatible server or in-process vLLM).

Phase 1: both models read message + linked text and answer Yes/No/Maybe. Both Yes → positive,
both No → negative. Otherwise phase 2: one model (default the second) reads message + linked
text + the whole diff within a token budget and answers Yes/No.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from cppperf.services.classifier import prompts
from cppperf.shared.llm import Answer
from cppperf.shared.messages import Vote


class Asker(Protocol):
    async def ask(self, model: str, system: str, prompt: str, choices: list[str]) -> Answer: ...


@dataclass
class VoteResult:
    label: bool
    phase: int
    votes: list[Vote] = field(default_factory=list)


def _vote(model: str, phase: int, a: Answer) -> Vote:
    return Vote(
        model=model,
        phase=phase,
        answer=a.label,
        latency_ms=round(a.latency_ms, 1),
        prompt_tokens=a.prompt_tokens,
        completion_tokens=a.completion_tokens,
    )


async def two_phase(
    asker: Asker,
    models: list[str],
    *,
    message: str,
    issues: str,
    diff: str,
    phase2_model: int,
    diff_budget: int,
) -> VoteResult:
    p1 = prompts.PHASE1.format(message=message.strip(), issues=issues.strip() or "(none)")
    answers = await asyncio.gather(
        *(asker.ask(m, prompts.SYSTEM, p1, prompts.PHASE1_CHOICES) for m in models[:2])
    )
    votes = [_vote(m, 1, a) for m, a in zip(models[:2], answers, strict=True)]
    labels = {a.label for a in answers}
    if labels == {"Yes"}:
        return VoteResult(True, 1, votes)
    if labels == {"No"}:
        return VoteResult(False, 1, votes)
    model = models[min(phase2_model, len(models) - 1)]
    p2 = prompts.PHASE2.format(
        message=message.strip(),
        issues=issues.strip() or "(none)",
        diff=prompts.budget_diff(diff, diff_budget),
    )
    a2 = await asker.ask(model, prompts.SYSTEM, p2, prompts.PHASE2_CHOICES)
    votes.append(_vote(model, 2, a2))
    return VoteResult(a2.label == "Yes", 2, votes)
