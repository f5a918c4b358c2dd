"""Cheap deterministic drop of commits that clearly are not performance work, before any LLM call.

Drops: diffs whose changed lines are all whitespace or comments; pure renames/moves (every file
added/removed with identical line sets); version bumps (message says so and only version-like
lines change). Conservative on purpose: it must keep recall ≥ 0.95 on labelled data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMMENT = re.compile(r"^\s*(//.*|/\*.*|\*.*|.*\*/\s*)$")
_VERSION_MSG = re.compile(
    r"\b(bump(ed)?\s+(the\s+)?version|release\s+v?\d+\.\d+|version\s+\d+\.\d+(\.\d+)?)\b", re.I
)
_VERSION_LINE = re.compile(r"(version|VERSION)\w*\s*[=(:]?.*\d+[._]\d+|#define\s+\w*VERSION\w*")


@dataclass(frozen=True)
class PrefilterResult:
    keep: bool
    reason: str = ""


def changed_lines(diff: str) -> tuple[list[str], list[str]]:
    added: list[str] = []
    removed: list[str] = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            continue
        if line.startswith("+"):
            added.append(line[1:])
        elif line.startswith("-"):
            removed.append(line[1:])
    return added, removed


def prefilter(message: str, diff: str) -> PrefilterResult:
    if not diff.strip():
        return PrefilterResult(True, "")  # nothing to judge on: let the classifier decide
    added, removed = changed_lines(diff)
    changed = added + removed
    if changed and all(not ln.strip() or _COMMENT.match(ln) for ln in changed):
        return PrefilterResult(False, "only comments or whitespace change")
    if changed and sorted(ln.strip() for ln in added) == sorted(ln.strip() for ln in removed):
        return PrefilterResult(False, "lines only moved or re-indented (rename/move)")
    if (
        _VERSION_MSG.search(message)
        and changed
        and all(not ln.strip() or _VERSION_LINE.search(ln) for ln in changed)
    ):
        return PrefilterResult(False, "version bump")
    return PrefilterResult(True, "")
