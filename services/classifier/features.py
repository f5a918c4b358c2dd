"""Sparse binary features of one commit for the trained scorer.

- `w:`/`b:` words and word pairs of the message and linked text (lower-cased; trailers such as
  `PiperOrigin-RevId:`/`Signed-off-by:`, hashes, numbers and URLs dropped). Training keeps only
  those seen in several repositories (`TrainConfig.min_repos`), so a repository's own vocabulary
  is never learned.
- `c:` message concepts: families of words that mean the same thing (speed, memory, SIMD,
  algorithm, avoided work, bug fix, docs, tests, build, feature, refactor…), in the title or the
  body, so a word never seen in training still counts through its family.
- `r:`/`d:` which of the heuristic's message and diff rules fire.
- `k:` what kinds of code lines change (loops, branches, allocations, container calls, `reserve`,
  move semantics, `const&` parameters, views, algorithm calls, intrinsics, bit operations,
  `inline`/`constexpr`, asserts/throws, logging and strings, preprocessor, comments), as the share
  of the changed code lines and as the direction (more added than removed, or fewer).
- `s:` the diff's shape (files, lines, share added, hunks, only tests/docs, build files).

Code identifiers are not features: they name a repository's own types and would not carry over.
"""

from __future__ import annotations

import itertools
import math
import re
from functools import lru_cache

from cppperf.services.classifier.heuristic import DIFF_RULES, MESSAGE_RULES

_TRAILER = re.compile(r"^\s*[\w-]+(-by|-id|-revid|revid|-Id)\s*:.*$", re.IGNORECASE | re.MULTILINE)
_URL = re.compile(r"https?://\S+")
_WORD = re.compile(r"[a-z][a-z0-9_+]*")
_HEXISH = re.compile(r"^[0-9a-f]{7,}$")
# merge headers: the structural filter never selects merges, so their words would say "source", not "label"
_MERGE = re.compile(
    r"^merge (pull request #\d+ from [^/\s]+/|(remote-tracking )?branch '[^']*'( of \S+)?( into \S+)?)",
    re.I | re.M,
)
_FILE_NAME = re.compile(r"\S+\.(cpp|cc|cxx|c|h|hpp|hh|hxx|inl|ipp)\b", re.I)
_TEST_PATH = re.compile(r"(^|/)(tests?|testing|unittests?|benchmarks?|bench|examples?)/|_test\.|test_", re.I)
_DOC_PATH = re.compile(r"\.(md|rst|txt|html|dox)$|(^|/)docs?/", re.I)
_BUILD_PATH = re.compile(r"(CMakeLists\.txt|\.cmake|\.ya?ml|\.bazel|BUILD|\.bzl|Makefile|\.in)$")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "on",
        "for",
        "and",
        "or",
        "is",
        "it",
        "this",
        "that",
        "with",
        "by",
        "as",
        "be",
        "are",
        "was",
        "from",
        "at",
        "into",
        "not",
        "we",
        "i",
        "use",
        "used",
        "using",
        "can",
        "when",
        "which",
        "also",
        "so",
        "if",
        "than",
        "then",
    ]
)


def _words(text: str) -> list[str]:
    text = _FILE_NAME.sub(" ", _MERGE.sub(" ", _URL.sub(" ", _TRAILER.sub(" ", text)))).lower()
    return [w for w in _WORD.findall(text) if not _HEXISH.match(w)]


def _bucket(n: float, edges: tuple[int, ...]) -> str:
    for e in edges:
        if n <= e:
            return f"<={e}"
    return f">{edges[-1]}"


def diff_paths(diff: str) -> list[str]:
    paths = []
    for line in diff.splitlines():
        if line.startswith(("+++ ", "--- ")):
            p = line[4:].strip()
            if p != "/dev/null":
                paths.append(p[2:] if p.startswith(("a/", "b/")) else p)
    return sorted(set(paths))


def _text_features(text: str) -> set[str]:
    feats: set[str] = set()
    words = [w for w in _words(text) if w not in _STOP]
    feats.update(f"w:{w}" for w in words)
    feats.update(f"b:{a}_{b}" for a, b in itertools.pairwise(words))
    if not words:
        feats.add("m:empty")
    feats.add(f"m:len{_bucket(len(words), (2, 4, 8, 16, 40))}")
    feats.update(f"r:{name}" for name, pat, _ in MESSAGE_RULES if pat.search(text))
    return feats


# message concepts: a family of words per idea, matched on word starts
_CONCEPTS: dict[str, re.Pattern[str]] = {
    name: re.compile(pat, re.IGNORECASE)
    for name, pat in {
        "speed": r"\b(fast|faster|speed|quick|slow|perf|optimi[sz]|efficien|inefficien|latency|throughput|"
        r"overhead|bottleneck|hot ?path|cheap|expensive|costly|accelerat|boost|pessimi[sz])",
        "memory": r"\b(alloc|dealloc|realloc|malloc|memory|heap|cop(y|ies|ying)|buffer|reserve|"
        r"move[sd]?\b|temporar|footprint|cache[- ]?(line|friendly|miss))",
        "simd": r"\b(simd|sse\d|avx|neon|sve|rvv|vector(i[sz]|ized)|intrinsic|codegen|shuffle|"
        r"lanes?\b|branchless|unroll|inlin)",
        "algorithm": r"(\bo\([^)]*\)|\b(complexity|quadratic|linear|lookup|hash|memoi[sz]|precomput|"
        r"lazy|lazily|batch|binary search|bitset|table|fast path))",
        "avoid": r"\b(avoid|reduce|eliminat|skip|fewer|less|unnecessar|redundant|needless|once\b|"
        r"instead of)",
        "factor": r"(\b\d+(\.\d+)?\s?x\b|\b\d+(\.\d+)?\s?%|\btwice\b|\bhalf\b|:zap:|\u26a1|:rocket:)",
        "fix": r"\b(fix|bug|crash|leak|error|wrong|incorrect|issue|fail|broken|regression|segfault|"
        r"overflow|race|hang|correct)",
        "docs": r"\b(docs?\b|document|comment|readme|typo|spelling|license|copyright|changelog)",
        "style": r"\b(format|style|whitespace|lint|clang-tidy|tidy|warning|pedantic|cosmetic)",
        "test": r"\b(tests?\b|testing|unit ?test|ci\b|coverage|fuzz|sanitiz|gtest|ctest)",
        "build": r"\b(cmake|build|makefile|bazel|meson|compiler|msvc|gcc|clang|version|release|bump|"
        r"package|install|depend)",
        "feature": r"\b(add|new|support|option|feature|api|implement|introduc|allow|enable)",
        "refactor": r"\b(refactor|rename|clean|move .* to|split|reorgani|simplif|deprecat|remove unused)",
        "revert": r"\b(revert|undo|back ?out|roll ?back)",
    }.items()
}

# kinds of changed code lines (the diff's structure, not its identifiers)
_KINDS: dict[str, re.Pattern[str]] = {
    name: re.compile(pat)
    for name, pat in {
        "loop": r"\b(for|while)\s*\(|\bdo\s*\{",
        "branch": r"\b(if|switch)\s*\(|\?[^:]+:",
        "alloc": r"\bnew\b|\b(malloc|calloc|realloc|make_unique|make_shared|alloca)\b|\.resize\(",
        "container": r"\.(push_back|emplace\w*|insert|find|count|erase|at|size|clear|data)\(",
        "reserve": r"\.reserve\(",
        "move": r"std::(move|forward)\b|\w&&\s*\w",
        "constref": r"\bconst\s+[\w:<>, ]+&\s*\w",
        "view": r"\b(string_view|span|array_view)\b",
        "algorithm": r"std::(sort|stable_sort|lower_bound|upper_bound|equal_range|find\w*|binary_search|"
        r"partition|nth_element|accumulate|transform|copy\w*|fill|min|max|swap|fill_n)\b|\b(memcpy|memset|memmove|memcmp)\b",
        "simd": r"\b(_mm\d*_\w+|__m\d+\w*|sv\w+_[suf]?\d+|v\w+q_[suf]\d+|__builtin_\w+)",
        "bitops": r"<<|>>|\^|[^&]&[^&=]|\|=|&=|~\w",
        "qualifier": r"\b(inline|constexpr|noexcept|__restrict\w*|restrict|static|thread_local|"
        r"\[\[(un)?likely\]\]|__builtin_expect|FORCE_?INLINE\w*|ALWAYS_INLINE)\b",
        "check": r"\b(assert|static_assert|throw|abort|CHECK\w*|DCHECK\w*|ASSERT\w*|EXPECT\w*)\b",
        "string": r"\"[^\"]*\"|\b(printf|fprintf|cout|cerr|std::format|fmt::|LOG\w*|log\w*)\b",
        "preproc": r"^\s*#",
        "include": r"^\s*#\s*include",
        "comment": r"^\s*(//|/\*|\*)",
        "function": r"^[\w:<>~*& ]+\s+[\w:~]+\([^;]*\)\s*(const\s*)?(noexcept\s*)?\{?\s*$",
        "return": r"\breturn\b",
        "template": r"\btemplate\s*<|\btypename\b",
    }.items()
}
_CODE_PATH = re.compile(r"\.(c|cc|cpp|cxx|c\+\+|h|hh|hpp|hxx|inl|ipp|tcc|cu|cuh)$", re.I)


def _concept_features(text: str) -> set[str]:
    title, _, body = text.strip().partition("\n")
    feats: set[str] = set()
    for name, pat in _CONCEPTS.items():
        in_title, in_body = bool(pat.search(title)), bool(pat.search(body))
        if in_title:
            feats.add(f"c:{name}:title")
        if in_title or in_body:
            feats.add(f"c:{name}")
    return feats


def _share_bucket(n: int, total: int) -> str:
    if not n:
        return "0"
    share = n / total
    return "<10%" if share < 0.1 else "<30%" if share < 0.3 else ">=30%"


def _kind_features(diff: str) -> set[str]:
    """What kinds of code lines change: per kind, its share of the changed code lines (added and
    removed separately) and whether the change adds more of it than it removes, or fewer."""
    added: list[str] = []
    removed: list[str] = []
    hunks = 0
    code = False
    for line in diff.splitlines():
        if line.startswith("+++ "):
            code = bool(_CODE_PATH.search(line.strip())) and not _TEST_PATH.search(line)
        elif line.startswith("--- "):
            continue
        elif line.startswith("@@"):
            hunks += code
        elif code and line[:1] in "+-" and line[1:].strip():
            (added if line[0] == "+" else removed).append(line[1:])
    feats = {f"s:hunks{_bucket(hunks, (1, 2, 4, 8, 16))}"}
    if not added and not removed:
        feats.add("k:no-code")
        return feats
    for name, pat in _KINDS.items():
        a = sum(1 for ln in added if pat.search(ln))
        r = sum(1 for ln in removed if pat.search(ln))
        feats.add(f"k:{name}+{_share_bucket(a, len(added) or 1)}")
        feats.add(f"k:{name}-{_share_bucket(r, len(removed) or 1)}")
        if a > r:
            feats.add(f"k:{name}:more")
        elif r > a:
            feats.add(f"k:{name}:fewer")
    return feats


def _diff_features(diff: str) -> set[str]:
    feats = {f"d:{name}" for name, pat, _ in DIFF_RULES if pat.search(diff)}
    changed = [
        ln[0] for ln in diff.splitlines() if ln[:1] in ("+", "-") and not ln.startswith(("+++", "---"))
    ]
    added, removed = changed.count("+"), changed.count("-")
    paths = diff_paths(diff)
    feats.add(f"s:files{_bucket(len(paths), (1, 2, 4, 8))}")
    feats.add(f"s:lines{_bucket(math.log2(1 + added + removed), (2, 4, 6, 8, 10))}")
    if added + removed:
        feats.add(f"s:added{_bucket(round(10 * added / (added + removed)), (2, 4, 6, 8))}")
    if not paths:
        return feats
    tests = [bool(_TEST_PATH.search(p)) for p in paths]
    if all(tests):
        feats.add("s:only-tests")
    elif any(tests):
        feats.add("s:some-tests")
    if all(_DOC_PATH.search(p) for p in paths):
        feats.add("s:only-docs")
    if any(_BUILD_PATH.search(p) for p in paths):
        feats.add("s:build-files")
    return feats


MAX_DIFF_CHARS = 24_000  # a diff's shape shows in its first files; huge diffs cost time, not signal


@lru_cache(maxsize=8192)
def commit_features(message: str, issue_text: str, diff: str) -> frozenset[str]:
    """The set of features present (all binary); cached, as training sees each commit per fold."""
    text = f"{message}\n{issue_text}"
    d = diff[:MAX_DIFF_CHARS]
    return frozenset(_text_features(text) | _concept_features(text) | _diff_features(d) | _kind_features(d))
