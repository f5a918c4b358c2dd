"""The no-model default classifier: a scored, explainable rule set over message, issue text and diff.

Positive evidence: performance vocabulary in the message or linked texts (speed up, faster,
optimise, latency, throughput, allocation, vectorise, SIMD, `Nx` factors, ⚡), and code patterns in
added lines that usually serve speed (reserve, move semantics, emplace, string_view, pass by const
reference, SIMD intrinsics, likely/unlikely hints, unordered containers, caching). Negative
evidence: bug-fix, style, documentation, test, build and refactor vocabulary. The score is the sum
of the weights of the rules that fire; `label = score >= threshold`. Deterministic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_W = re.IGNORECASE

MESSAGE_RULES: list[tuple[str, re.Pattern[str], float]] = [
    (
        "perf-word",
        re.compile(r"\b(perf(ormance)?|speed[- ]?up|speedups?|faster|fast[- ]path|quicker)\b", _W),
        2.5,
    ),
    (
        "optimi[sz]e",
        re.compile(r"\b(optimi[sz](e|es|ed|ing|ation|ations)|de-?pessimi[sz]\w*|pessimi[sz]\w*)\b", _W),
        2.5,
    ),
    ("latency/throughput", re.compile(r"\b(latency|throughput|hot ?path|bottleneck|overhead)\b", _W), 1.5),
    ("efficient", re.compile(r"\b(efficien(t|cy|tly)|inefficien\w*|cheaper|expensive)\b", _W), 1.5),
    ("speed factor", re.compile(r"\b\d+(\.\d+)?\s?x\b(?!\d)|\b\d+\s?%\s*(faster|speed|improv)", _W), 2.0),
    ("zap", re.compile(r":zap:|\u26a1|:rocket:"), 2.0),
    (
        "avoid work",
        re.compile(
            r"\b(avoid|reduce|remove|eliminate|skip|save)\w*\s+(\w+\s+){0,3}"
            r"(cop(y|ies)|alloc\w*|realloc\w*|lookups?|recomput\w*|lock\w*|syscalls?|"
            r"branch\w*|work|overhead|temporar\w*)",
            _W,
        ),
        2.0,
    ),
    (
        "simd",
        re.compile(
            r"\b(simd|sse\d?|avx\d*|avx-?512|neon|sve\d*|rvv|vectori[sz]\w*|auto-?vectori[sz]\w*|"
            r"intrinsics?|codegen)\b",
            _W,
        ),
        1.5,
    ),
    ("complexity", re.compile(r"\bO\((n|log|1)[^)]*\)|\b(quadratic|linear time|complexity)\b", _W), 1.5),
    ("cache/memo", re.compile(r"\b(cach(e|ed|ing)|memoi[sz]\w*|precomput\w*|lazy|lazily)\b", _W), 1.0),
    ("speed words", re.compile(r"\b(speed|slow(er|ness|down)?|benchmark\w*|profil\w*)\b", _W), 1.0),
    (
        "bugfix",
        re.compile(
            r"\b(fix(es|ed)?\s+(a\s+)?(bug|crash|leak|warning|typo|build|compil\w*|test)|"
            r"segfault|regression test|undefined behaviou?r)\b",
            _W,
        ),
        -2.0,
    ),
    (
        "style/docs",
        re.compile(
            r"\b(style|format(ting)?|clang-format|typo|comments?|docs?|documentation|"
            r"readme|license|copyright|whitespace|lint)\b",
            _W,
        ),
        -1.5,
    ),
    (
        "refactor",
        re.compile(r"\b(refactor\w*|rename\w*|cleanup|clean up|tidy\w*|deprecat\w*|move .* to)\b", _W),
        -1.0,
    ),
    (
        "tests/build",
        re.compile(r"\b(unit tests?|add(ed)? tests?|ci|cmake|build system|warnings?)\b", _W),
        -1.0,
    ),
    (
        "feature",
        re.compile(r"\b(add(ed|s)? (support|option|feature|api)|implement(ed)? (new|support))\b", _W),
        -0.5,
    ),
]

DIFF_RULES: list[tuple[str, re.Pattern[str], float]] = [
    ("reserve", re.compile(r"^\+.*\.reserve\(", re.MULTILINE), 1.0),
    ("move", re.compile(r"^\+.*std::move\(", re.MULTILINE), 0.5),
    ("emplace", re.compile(r"^\+.*\.(emplace|emplace_back|try_emplace)\(", re.MULTILINE), 0.5),
    ("string_view/span", re.compile(r"^\+.*\b(std::)?(string_view|span)\b", re.MULTILINE), 0.5),
    ("const-ref param", re.compile(r"^\+.*\(.*const\s+[\w:<>]+\s*&\s*\w+", re.MULTILINE), 0.5),
    (
        "simd intrinsics",
        re.compile(r"^\+.*\b(_mm\d*_\w+|__m\d+\w*|sv\w+_[su]?\d+|v\w+q_[suf]\d+|hn::\w+)", re.MULTILINE),
        1.0,
    ),
    (
        "branch hints",
        re.compile(r"^\+.*(\[\[(un)?likely\]\]|__builtin_expect|LIKELY\(|UNLIKELY\()", re.MULTILINE),
        1.0,
    ),
    ("unordered", re.compile(r"^\+.*\bunordered_(map|set)\b", re.MULTILINE), 0.5),
    (
        "inline/constexpr",
        re.compile(r"^\+.*\b(inline|constexpr|noexcept|__restrict\w*|restrict)\b", re.MULTILINE),
        0.3,
    ),
    (
        "static cache",
        re.compile(r"^\+.*\b(static\s+(const\s+)?[\w:<>]+\s+\w+\s*=|thread_local)\b", re.MULTILINE),
        0.3,
    ),
    ("endl", re.compile(r"^-.*std::endl", re.MULTILINE), 0.5),
    ("prefetch", re.compile(r"^\+.*__builtin_prefetch|_mm_prefetch", re.MULTILINE), 1.0),
]


@dataclass(frozen=True)
class HeuristicResult:
    label: bool
    score: float
    evidence: list[str] = field(default_factory=list)


def score_commit(message: str, issue_text: str, diff: str, *, threshold: float = 2.0) -> HeuristicResult:
    text = f"{message}\n{issue_text}"
    score = 0.0
    evidence: list[str] = []
    for name, pat, weight in MESSAGE_RULES:
        mt = pat.search(text)
        if mt:
            score += weight
            evidence.append(f"{name} ({weight:+g}): {mt.group(0)[:40]!r}")
    diff_score = 0.0
    for name, pat, weight in DIFF_RULES:
        mt = pat.search(diff)
        if mt:
            diff_score += weight
            evidence.append(f"diff {name} ({weight:+g})")
    score += min(diff_score, 2.0)  # code patterns support, never decide alone
    return HeuristicResult(label=score >= threshold, score=round(score, 2), evidence=evidence)
