"""Prompts for the two-phase vote. Changing a prompt's text changes `PROMPT_VERSION`, which is part
of the cache key, so old answers are never reused for a new prompt."""

from __future__ import annotations

import hashlib

SYSTEM = (
    "You are an expert C++ performance engineer. You judge whether a commit is focused on "
    "improving execution time (speed), as opposed to fixing bugs, refactoring, style, features, "
    "build or documentation changes. Answer with exactly one word."
)

PHASE1 = """Commit message:
{message}

Linked issue / pull request text:
{issues}

Is this commit focused on improving execution time? Answer Yes, No, or Maybe."""

PHASE2 = """Commit message:
{message}

Linked issue / pull request text:
{issues}

Diff:
{diff}

Is this commit focused on improving execution time? Answer Yes or No."""

PROMPT_VERSION = hashlib.sha256((SYSTEM + PHASE1 + PHASE2).encode()).hexdigest()[:12]
PHASE1_CHOICES = ["Yes", "No", "Maybe"]
PHASE2_CHOICES = ["Yes", "No"]


def approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def budget_diff(diff: str, budget_tokens: int) -> str:
    """Split the budget fairly across files: each file gets an equal share; files smaller than
    their share give the rest back to the others. Cuts are marked."""
    if approx_tokens(diff) <= budget_tokens:
        return diff
    files = [("diff --git" + part) if i else part for i, part in enumerate(diff.split("diff --git"))]
    files = [f for f in files if f.strip()]
    budget = budget_tokens * 4  # in characters
    sizes = sorted(range(len(files)), key=lambda i: len(files[i]))
    share: dict[int, int] = {}
    remaining, left = budget, len(files)
    for i in sizes:
        fair = remaining // max(left, 1)
        share[i] = min(len(files[i]), fair)
        remaining -= share[i]
        left -= 1
    out = []
    for i, f in enumerate(files):
        if share[i] < len(f):
            out.append(f[: share[i]] + f"\n[... {len(f) - share[i]} characters of this file cut ...]\n")
        else:
            out.append(f)
    return "".join(out)
