"""Sparse binary features of one commit for the trained scorer.

Words and word pairs of the message and linked text (lower-cased; trailers such as
`PiperOrigin-RevId:`/`Signed-off-by:`, hashes, numbers and URLs dropped, so the model learns
vocabulary, not repositories), which of the heuristic's rules fire, and the diff's shape (how many
files, how many lines, whether only tests/docs/build files change). Code identifiers of the diff
are not features: they name a repository's own types and would not carry over to another one.
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
    return frozenset(_text_features(f"{message}\n{issue_text}") | _diff_features(diff[:MAX_DIFF_CHARS]))
