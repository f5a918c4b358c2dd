"""Static checks a repository must pass before it is a candidate (read from git, no checkout):
primary language C++ (by bytes of source files, like GitHub's linguist), `CMakeLists.txt` at the
root, and tests defined in CMake: `enable_testing()`/`include(CTest)` together with `add_test`,
`gtest_discover_tests`, `gtest_add_tests`, `catch_discover_tests`, `doctest_discover_tests` (or
`ParseAndAddCatchTests`) in any CMakeLists.txt or *.cmake file. One `git ls-tree` and one
`git cat-file --batch` process per repository, so it also works on a blobless mirror cheaply.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

LANG_BY_EXT = {
    **dict.fromkeys(
        [".cpp", ".cc", ".cxx", ".c++", ".hpp", ".hh", ".hxx", ".h", ".ipp", ".inl", ".tpp", ".cppm"], "C++"
    ),
    ".c": "C",
    ".py": "Python",
    ".rs": "Rust",
    ".go": "Go",
    ".java": "Java",
    ".js": "JavaScript",
    ".ts": "TypeScript",
    ".cs": "C#",
    ".swift": "Swift",
    ".m": "Objective-C",
    ".mm": "Objective-C++",
    ".cu": "Cuda",
    ".f90": "Fortran",
    ".rb": "Ruby",
    ".php": "PHP",
    ".kt": "Kotlin",
    ".scala": "Scala",
}
_ENABLE = re.compile(r"^\s*(enable_testing\s*\(|include\s*\(\s*CTest\b)", re.IGNORECASE | re.MULTILINE)
_TESTS = re.compile(
    r"^\s*(add_test|gtest_discover_tests|gtest_add_tests|catch_discover_tests|doctest_discover_tests|"
    r"ParseAndAddCatchTests|catch_add_tests)\s*\(",
    re.IGNORECASE | re.MULTILINE,
)
_VENDOR = ("third_party/", "thirdparty/", "3rdparty/", "vendor/", "external/", "extern/", "deps/")


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    reason: str
    language: str | None


def primary_language(sizes: dict[str, int]) -> str | None:
    by_lang: Counter[str] = Counter()
    for path, size in sizes.items():
        if path.startswith(_VENDOR):
            continue
        lang = LANG_BY_EXT.get(PurePosixPath(path).suffix.lower())
        if lang:
            by_lang[lang] += size
    return by_lang.most_common(1)[0][0] if by_lang else None


def _tree(repo: Path, rev: str) -> dict[str, int]:
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "-l", "-z", rev], capture_output=True, check=False
    )
    if out.returncode != 0:
        return {}
    sizes: dict[str, int] = {}
    for entry in out.stdout.split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        parts = meta.split()
        if len(parts) == 4 and parts[1] == b"blob":
            sizes[path.decode(errors="replace")] = int(parts[3]) if parts[3].isdigit() else 0
    return sizes


def _read_blobs(repo: Path, rev: str, paths: list[str]) -> dict[str, str]:
    if not paths:
        return {}
    spec = "".join(f"{rev}:{p}\n" for p in paths).encode()
    out = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "--batch"], input=spec, capture_output=True, check=False
    )
    data = out.stdout
    texts: dict[str, str] = {}
    pos = 0
    for p in paths:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        header = data[pos:nl].split()
        pos = nl + 1
        if len(header) == 3 and header[1] == b"blob":
            size = int(header[2])
            texts[p] = data[pos : pos + size].decode(errors="replace")
            pos += size + 1
    return texts


def check_repository(repo: Path, rev: str = "HEAD") -> CheckResult:
    sizes = _tree(repo, rev)
    if not sizes:
        return CheckResult(False, "empty repository or unknown revision", None)
    lang = primary_language(sizes)
    if lang != "C++":
        return CheckResult(False, f"primary language is {lang or 'unknown'}, not C++", lang)
    if "CMakeLists.txt" not in sizes:
        return CheckResult(False, "no CMakeLists.txt at the repository root", lang)
    cmake_files = [
        p
        for p in sizes
        if (PurePosixPath(p).name == "CMakeLists.txt" or p.endswith(".cmake")) and not p.startswith(_VENDOR)
    ]
    texts = _read_blobs(repo, rev, cmake_files[:2000])
    enabled = any(_ENABLE.search(t) for t in texts.values())
    defined = any(_TESTS.search(t) for t in texts.values())
    if not enabled:
        return CheckResult(False, "CMake never calls enable_testing() or include(CTest)", lang)
    if not defined:
        return CheckResult(False, "no test is defined in CMake (add_test / *_discover_tests)", lang)
    return CheckResult(True, "", lang)
