"""What an agent's patch may change, checked before anything runs and again on the tree after.

One rule (`ChangeRule`) — the filter's rule for what an expert may change: C++ sources and headers
(`mining.source_extensions`), no test file, no vendored path, no build file (CMake, scripts), no
path outside the tree, nothing under `.git`. `allow_build_changes` (trusted mode,
`--allow-build-changes`) also lets non-test, non-C++ files change (build files, scripts).

It is applied to the patch text *as git reads it*: every name in every header (`diff --git` both
sides, `---`/`+++`, `rename`/`copy from/to`, `Index:`) after git's C-quote unquoting
(`"b/\\056git/config"` is `.git/config`) and after stripping one leading component (git apply's
`-p1`, whatever the prefix is); every file mode (`new file mode`, `new mode`, `old mode`,
`deleted file mode`, `index … <mode>`, parsed as octal: `0120000` is a symlink) must be a plain
file's (100644 or 100755). Binary hunks are refused. Then, because text can lie, `check_tree`
compares the tree listing before and after applying: no new or changed symlink or special file,
no changed mode bits beyond the exec bit, and every added, removed or changed path allowed by the
rule. Test definitions are compared by meaning later (`ctest --show-only=json-v1`, pipeline.py).

Verdicts: empty-patch | malformed-patch | too-large | unsafe-patch (escapes, `.git`, symlinks,
special modes, binary) | test-edit (a test file or a CMake test definition) | forbidden-file (a
file an agent may not change: build files, non-C++ files, vendored code).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from cppperf.shared.domain import EvalVerdict
from cppperf.shared.rules import Rules

_BINARY = re.compile(r"^(GIT binary patch|Binary files .* differ|literal \d+|delta \d+)", re.MULTILINE)
_MODE_LINE = re.compile(r"^(?:new file mode|new mode|old mode|deleted file mode) +(\S+)\s*$", re.MULTILINE)
_INDEX_MODE = re.compile(r"^index [0-9a-fA-F]+\.\.[0-9a-fA-F]+ +(\S+)\s*$", re.MULTILINE)
_NAME_LINE = re.compile(
    r"^(---|\+\+\+|rename from|rename to|copy from|copy to|Index:|rename old|rename new) (.*)$", re.MULTILINE
)
_DIFF_GIT = re.compile(r"^diff --git (.*)$", re.MULTILINE)
_CMAKE_TEST = re.compile(
    r"\b(add_test|enable_testing|include\s*\(\s*CTest|gtest_discover_tests|gtest_add_tests|catch_discover_tests|"
    r"doctest_discover_tests|set_tests_properties|set_property\s*\(\s*TEST|ParseAndAddCatchTests|"
    r"PASS_REGULAR_EXPRESSION|FAIL_REGULAR_EXPRESSION|WILL_FAIL|SKIP_RETURN_CODE)\b",
    re.IGNORECASE,
)
_PLAIN_MODES = (0o100644, 0o100755)
_GITLINK = 0o160000  # git's mode for a submodule commit
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    verdict: EvalVerdict | None = None  # a patch-check verdict when not ok
    reason: str = ""
    files: tuple[str, ...] = ()


def git_unquote(name: str) -> str:
    """A name as git reads it: `"..."` is C-quoted (octal bytes, \\n, \\t, …), else literal."""
    if len(name) < 2 or not (name.startswith('"') and name.endswith('"')):
        return name
    body, out, i = name[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8", "surrogateescape")
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif re.fullmatch(r"[0-7]{3}", body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
            i += 4
        else:
            raise ValueError(f"bad escape in quoted name {name!r}")
    return out.decode("utf-8", "surrogateescape")


def _strip_one(name: str) -> str:
    """git apply -p1: drop the first path component, whatever it is."""
    if name == "/dev/null":
        return name
    parts = name.split("/", 1)
    return parts[1] if len(parts) == 2 else ""


def _diff_git_names(rest: str) -> list[str]:
    """Both names of a `diff --git` line (quoted or not; unquoted with spaces: split where the two
    halves agree, like git)."""
    rest = rest.rstrip("\n")
    if rest.startswith('"'):
        end = re.match(r'"(?:[^"\\]|\\.)*"', rest)
        if end is None:
            raise ValueError(f"unterminated quoted name in 'diff --git {rest}'")
        first, second = end.group(0), rest[end.end() :].lstrip(" ")
        return [git_unquote(first), git_unquote(second)]
    if rest.endswith('"'):
        start = rest.find(' "')
        return [rest[:start], git_unquote(rest[start + 1 :])]
    halves = [(rest[:i], rest[i + 1 :]) for i, ch in enumerate(rest) if ch == " "]
    same = [h for h in halves if _strip_one(h[0]) == _strip_one(h[1])]
    if len(same) == 1:
        return list(same[0])
    if len(halves) == 1:
        return list(halves[0])
    raise ValueError(f"ambiguous names in 'diff --git {rest}'")


def patch_names(text: str) -> list[str]:
    """Every path the patch names, as git apply sees it (unquoted, -p1 stripped; /dev/null out)."""
    raw: list[tuple[str, bool]] = []  # (name, strip a component)
    for mt in _DIFF_GIT.finditer(text):
        raw += [(n, True) for n in _diff_git_names(mt.group(1))]
    for mt in _NAME_LINE.finditer(text):
        kind, rest = mt.group(1), mt.group(2)
        name = rest if rest.startswith('"') else rest.split("\t", 1)[0]
        strip = kind in ("---", "+++")
        if kind == "Index:":
            strip = False
        raw.append((git_unquote(name.rstrip()), strip))
    names: list[str] = []
    for name, strip in raw:
        if name.startswith("/") and name != "/dev/null":
            names.append(name)  # absolute: refused whatever stripping would make of it
        path = _strip_one(name) if strip else name
        if path != "/dev/null":
            names.append(path)
    return names


def patch_modes(text: str) -> list[int]:
    modes = [mt.group(1) for mt in _MODE_LINE.finditer(text)]
    modes += [mt.group(1) for mt in _INDEX_MODE.finditer(text)]
    out: list[int] = []
    for m in modes:
        try:
            out.append(int(m, 8))
        except ValueError:
            out.append(-1)
    return out


def unsafe_path(path: str) -> str | None:
    """Why `path` is no place a patch may write (absolute, `..`, `.git` in any spelling)."""
    p = PurePosixPath(path)
    if not path or path.startswith("/") or p.is_absolute():
        return f"absolute or empty path {path!r}"
    if ".." in p.parts or "\\" in path or "\0" in path:
        return f"path escapes the tree {path!r}"
    if any(part.lower().rstrip(". ") == ".git" or part.lower().startswith(".git~") for part in p.parts):
        return f"path into .git {path!r}"
    return None


@dataclass(frozen=True)
class ChangeRule:
    """What an agent may change (module docstring)."""

    rules: Rules
    allow_build_changes: bool = False

    def refuse(self, path: str) -> tuple[EvalVerdict, str] | None:
        """(verdict, reason) when `path` may not change, else None."""
        unsafe = unsafe_path(path)
        if unsafe is not None:
            return EvalVerdict.UNSAFE_PATCH, unsafe
        if self.rules.is_test_path(path):
            return EvalVerdict.TEST_EDIT, f"edits test file {path} (tests are the specification)"
        if self.allow_build_changes:
            return None
        if self.rules.is_vendored(path):
            return (
                EvalVerdict.FORBIDDEN_FILE,
                f"changes vendored code {path} (only the project's C++ sources may change)",
            )
        if not self.rules.is_cpp(path):
            return EvalVerdict.FORBIDDEN_FILE, (
                f"changes {path}, not a C++ source (build files and scripts only with --allow-build-changes)"
            )
        return None


def _text_checks(text: str, max_bytes: int) -> CheckResult | None:
    """Checks on the raw text (headers too: a parser may normalise what a hostile header says)."""
    problem: tuple[EvalVerdict, str] | None = None
    if not text.strip():
        problem = (EvalVerdict.EMPTY_PATCH, "the patch is empty")
    elif len(text.encode()) > max_bytes:
        problem = (EvalVerdict.TOO_LARGE, f"patch is {len(text.encode())} bytes (limit {max_bytes})")
    elif _BINARY.search(text):
        problem = (EvalVerdict.UNSAFE_PATCH, "the patch has binary hunks")
    elif "\0" in text:
        problem = (EvalVerdict.UNSAFE_PATCH, "the patch has NUL bytes")
    else:
        for mode in patch_modes(text):
            if mode not in _PLAIN_MODES:
                what = "a symlink" if mode >= 0 and stat.S_ISLNK(mode) else f"mode {mode:o}"
                if mode >= 0 and (mode & 0o170000) in (_GITLINK, stat.S_IFDIR):
                    what = f"a submodule (gitlink) or directory (mode {mode:o})"
                problem = (
                    EvalVerdict.UNSAFE_PATCH,
                    f"the patch creates or changes {what} (only plain files)",
                )
                break
    return CheckResult(False, *problem) if problem else None


def _cmake_test_edit(patch: PatchSet) -> str | None:
    for pf in patch:
        path = _strip_one(pf.target_file if pf.target_file != "/dev/null" else pf.source_file)
        name = PurePosixPath(path).name
        if name == "CMakeLists.txt" or name.endswith((".cmake", ".cmake.in")):
            changed = [ln.value for h in pf for ln in h if ln.is_added or ln.is_removed]
            if any(_CMAKE_TEST.search(v) for v in changed):
                return path
    return None


def _name_checks(
    text: str, rule: ChangeRule
) -> tuple[CheckResult | None, list[str], list[tuple[EvalVerdict, str]]]:
    """Unsafe and test names first (they win over a parse error); the other refusals for later."""
    try:
        names = patch_names(text)
    except ValueError as exc:
        return CheckResult(False, EvalVerdict.UNSAFE_PATCH, f"unreadable file name: {exc}"), [], []
    refusals = [why for why in map(rule.refuse, dict.fromkeys(names)) if why is not None]
    first = next((w for w in refusals if w[0] == EvalVerdict.UNSAFE_PATCH), None)
    first = first or next((w for w in refusals if w[0] == EvalVerdict.TEST_EDIT), None)
    return (CheckResult(False, *first) if first else None), names, refusals


def check_patch(text: str, rules: Rules, *, max_bytes: int, allow_build_changes: bool = False) -> CheckResult:
    bad = _text_checks(text, max_bytes)
    if bad is not None:
        return bad
    bad, names, refusals = _name_checks(text, ChangeRule(rules, allow_build_changes))
    if bad is not None:
        return bad
    try:
        patch = PatchSet(text)
    except UnidiffParseError as exc:
        return CheckResult(False, EvalVerdict.MALFORMED_PATCH, f"not a unified diff: {exc}")
    cmake = _cmake_test_edit(patch)
    if len(patch) == 0 or not names:
        bad = CheckResult(False, EvalVerdict.MALFORMED_PATCH, "no file changes found (not a unified diff)")
    elif cmake is not None:
        bad = CheckResult(False, EvalVerdict.TEST_EDIT, f"edits a CMake test definition in {cmake}")
    elif refusals:
        bad = CheckResult(False, *refusals[0])
    return bad or CheckResult(True, files=tuple(dict.fromkeys(names)))


# ------------------------------------------------------------------------------ the tree after
@dataclass(frozen=True)
class Entry:
    kind: str  # file | link | dir | special
    mode: int
    digest: str  # sha256 of a file's bytes, a link's target


def snapshot(root: Path) -> dict[str, Entry]:
    """Every path under `root` (relative, POSIX) with its kind, mode and content hash."""
    out: dict[str, Entry] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = Entry("link", st.st_mode, os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = Entry("dir", stat.S_IMODE(st.st_mode), "")
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(full, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                out[rel] = Entry("file", stat.S_IMODE(st.st_mode), h.hexdigest())
            else:
                out[rel] = Entry("special", st.st_mode, "")
    return out


def check_tree(
    before: dict[str, Entry], after: dict[str, Entry], rules: Rules, *, allow_build_changes: bool = False
) -> CheckResult:
    """The applied tree against the original: what changed must be allowed (module docstring)."""
    rule = ChangeRule(rules, allow_build_changes)
    changed: list[str] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        why = _tree_change(path, old, new, rule)
        if why is not None:
            return CheckResult(False, why[0], f"after applying: {why[1]}")
        if not (old is None or old.kind == "dir") or not (new is None or new.kind == "dir"):
            changed.append(path)
    if not changed:
        return CheckResult(False, EvalVerdict.EMPTY_PATCH, "applying the patch changed no file")
    return CheckResult(True, files=tuple(changed))


def _tree_change(
    path: str, old: Entry | None, new: Entry | None, rule: ChangeRule
) -> tuple[EvalVerdict, str] | None:
    """Why this one change in the tree is not allowed, or None."""
    if new is not None and new.kind in ("link", "special"):
        return EvalVerdict.UNSAFE_PATCH, f"a new {new.kind} at {path}"
    if old is not None and old.kind in ("link", "special"):
        return EvalVerdict.UNSAFE_PATCH, f"the patch replaces the {old.kind} {path}"
    if (old is None or old.kind == "dir") and (new is None or new.kind == "dir"):
        unsafe = unsafe_path(path)  # a directory comes or goes with its files, checked on their own
        return (EvalVerdict.UNSAFE_PATCH, unsafe) if unsafe is not None else None
    if new is not None and new.mode & 0o7000:
        return EvalVerdict.UNSAFE_PATCH, f"{path} gets mode {new.mode:o}"
    return rule.refuse(path)
