"""Checks on an agent's patch before anything runs; each failure is a clear verdict.

empty; not a unified diff (parsed with unidiff); larger than the limit; absolute paths, `..`
segments or paths into `.git/`; symlinks (mode 120000) or binary hunks; edits to test files
(same rules as the filter) or to CMake test definitions (`add_test`, `enable_testing`,
`*_discover_tests`, `set_tests_properties`, …) — the tests are the specification.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from cppperf.services.filter.rules import Rules
from cppperf.shared.domain import EvalVerdict

_MODE_SYMLINK = re.compile(r"^(new file mode|new mode|old mode|deleted file mode) 120000", re.MULTILINE)
_BINARY = re.compile(r"^(GIT binary patch|Binary files .* differ)", re.MULTILINE)
_CMAKE_TEST = re.compile(
    r"\b(add_test|enable_testing|include\s*\(\s*CTest|gtest_discover_tests|gtest_add_tests|catch_discover_tests|"
    r"doctest_discover_tests|set_tests_properties|set_property\s*\(\s*TEST|ParseAndAddCatchTests)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    verdict: EvalVerdict | None = None  # a patch-check verdict when not ok
    reason: str = ""
    files: tuple[str, ...] = ()


def _strip(path: str) -> str:
    for prefix in ("a/", "b/"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def _unsafe(path: str) -> str | None:
    if path in ("/dev/null", ""):
        return None
    p = PurePosixPath(path)
    if path.startswith("/") or p.is_absolute():
        return f"absolute path {path!r}"
    if ".." in p.parts:
        return f"path escapes the tree {path!r}"
    if ".git" in p.parts:
        return f"path into .git {path!r}"
    return None


def _text_checks(text: str, max_bytes: int) -> CheckResult | None:
    """Checks on the raw text (headers too: a parser may normalise what a hostile header says)."""
    problem: tuple[EvalVerdict, str] | None = None
    if not text.strip():
        problem = (EvalVerdict.EMPTY_PATCH, "the patch is empty")
    elif len(text.encode()) > max_bytes:
        problem = (EvalVerdict.TOO_LARGE, f"patch is {len(text.encode())} bytes (limit {max_bytes})")
    elif _MODE_SYMLINK.search(text):
        problem = (EvalVerdict.UNSAFE_PATCH, "the patch creates or changes a symlink")
    elif _BINARY.search(text):
        problem = (EvalVerdict.UNSAFE_PATCH, "the patch has binary hunks")
    else:
        headers = [_strip(mt.group(1)) for mt in re.finditer(r"^(?:---|\+\+\+) (\S+)", text, re.MULTILINE)]
        for mt in re.finditer(r"^diff --git a/(\S+) b/(\S+)", text, re.MULTILINE):
            headers += list(mt.groups())
        why = next((w for w in map(_unsafe, headers) if w), None)
        if why:
            problem = (EvalVerdict.UNSAFE_PATCH, why)
    return CheckResult(False, *problem) if problem else None


def _file_checks(patch: PatchSet, rules: Rules) -> tuple[CheckResult | None, list[str]]:
    files: list[str] = []
    for pf in patch:
        why = _unsafe(_strip(pf.source_file)) or _unsafe(_strip(pf.target_file))
        if why:
            return CheckResult(False, EvalVerdict.UNSAFE_PATCH, why), files
        path = _strip(pf.target_file if pf.target_file != "/dev/null" else pf.source_file)
        files.append(path)
        if rules.is_test_path(path):
            return CheckResult(
                False, EvalVerdict.TEST_EDIT, f"edits test file {path} (tests are the specification)"
            ), files
        name = PurePosixPath(path).name
        if name == "CMakeLists.txt" or name.endswith(".cmake"):
            changed = [ln.value for h in pf for ln in h if ln.is_added or ln.is_removed]
            if any(_CMAKE_TEST.search(v) for v in changed):
                return CheckResult(
                    False, EvalVerdict.TEST_EDIT, f"edits a CMake test definition in {path}"
                ), files
    return None, files


def check_patch(text: str, rules: Rules, *, max_bytes: int) -> CheckResult:
    bad = _text_checks(text, max_bytes)
    if bad is not None:
        return bad
    try:
        patch = PatchSet(text)
    except UnidiffParseError as exc:
        return CheckResult(False, EvalVerdict.MALFORMED_PATCH, f"not a unified diff: {exc}")
    if len(patch) == 0:
        return CheckResult(False, EvalVerdict.MALFORMED_PATCH, "no file changes found (not a unified diff)")
    bad, files = _file_checks(patch, rules)
    return bad or CheckResult(True, files=tuple(files))
