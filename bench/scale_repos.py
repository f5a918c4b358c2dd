"""Synthetic but real git repositories for the scale run (`bench/scale.py`), via `git fast-import`.

Each repository is a bare git repo with a real C++/CMake layout (root `CMakeLists.txt` with
`enable_testing()` + `add_test`, `src/*.cpp`, `include/*.h`, `tests/`, `third_party/`, docs) and a
history whose commit mix follows the paper's funnel: about 40 % of commits pass the structural
rules, a few per cent carry performance-flavoured messages, the rest break exactly one rule
(test file, non-C++ file, vendored path, out of the date window, too many files).

The generator records, per repository, how many commits it wrote and which rule each one breaks
(or that it is selected): that is the ground truth `scale.py` checks the funnel against, computed
independently of the filter's code. Deterministic for a given seed.
"""

from __future__ import annotations

import random
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

N_SOURCES = 24  # src/*.cpp files (a "big" commit touches more than max_files=20 of them)

# kind -> (weight, expected filter outcome). "selected" and "perf" pass every rule.
KINDS: dict[str, tuple[float, str]] = {
    "selected": (0.37, "selected"),
    "perf": (0.03, "selected"),
    "test": (0.18, "test-file"),
    "docs": (0.17, "non-cpp-file"),
    "vendor": (0.08, "vendored-path"),
    "old": (0.12, "out-of-window"),
    "big": (0.05, "too-many-files"),
}
PERF_MESSAGES = [
    "Speed up {f} by 2x: avoid copying the buffer in the hot loop",
    "Optimize {f}: reserve vector capacity up front, fewer allocations",
    "perf: use SIMD for the inner loop of {f} (3x faster)",
    "Reduce latency in {f} by caching the lookup table",
    "Faster {f}: move instead of copy, 40% less time",
]
PLAIN_MESSAGES = [
    "Fix off-by-one in {f}",
    "Refactor {f} for readability",
    "Handle empty input in {f}",
    "Rename helper in {f}",
    "Clean up includes in {f}",
    "Add overflow check to {f}",
]


@dataclass
class RepoTruth:
    path: str
    commits: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # reason or "selected" -> count

    @property
    def selected(self) -> int:
        return self.outcomes["selected"]


def _blob(text: str) -> bytes:
    data = text.encode()
    return b"data %d\n%s\n" % (len(data), data)


def _source(i: int, version: int) -> str:
    return (
        f'#include "mod{i}.h"\n#include <vector>\n\n'
        f"int mod{i}_work(int n) {{\n  std::vector<int> v;\n  int acc = {version};\n"
        f"  for (int k = 0; k < n; ++k) {{ v.push_back(k * {i + 1}); acc += v.back(); }}\n"
        f"  return acc;\n}}\n"
    )


def _header(i: int, version: int) -> str:
    return f"#pragma once\n// revision {version}\nint mod{i}_work(int n);\n"


CMAKE = """cmake_minimum_required(VERSION 3.16)
project(synthetic CXX)
enable_testing()
file(GLOB SOURCES src/*.cpp)
add_library(core ${SOURCES})
target_include_directories(core PUBLIC include)
add_executable(unit tests/test_main.cpp)
target_link_libraries(unit core)
add_test(NAME unit COMMAND unit)
"""


def _change(rng: random.Random, kind: str, v: int, when: datetime) -> tuple[dict[str, str], str, datetime]:
    """Files, message and date of one commit of `kind` (see KINDS) at revision `v`."""
    i = rng.randrange(N_SOURCES)
    f = f"mod{i}"
    msg = rng.choice(PLAIN_MESSAGES).format(f=f)
    if kind in ("selected", "perf", "old"):
        picks = rng.sample(range(N_SOURCES), rng.randint(1, 3))
        files = {f"src/mod{j}.cpp": _source(j, v) for j in picks}
        if rng.random() < 0.3:
            files[f"include/mod{picks[0]}.h"] = _header(picks[0], v)
        if kind == "perf":
            msg = rng.choice(PERF_MESSAGES).format(f=f)
        if kind == "old":
            when = datetime(2018, 6, 1, tzinfo=UTC) + timedelta(hours=v)
        return files, msg, when
    if kind == "test":
        return (
            {
                "tests/test_main.cpp": f"int main() {{ return {v} - {v}; }}\n",
                f"src/mod{i}.cpp": _source(i, v),
            },
            msg,
            when,
        )
    if kind == "docs":
        return {"README.md": f"# synthetic\n\nrevision {v}\n"}, "Update the README", when
    if kind == "vendor":
        return {"third_party/lib/lib.cpp": f"int lib() {{ return {v}; }}\n"}, "Bump vendored lib", when
    return {f"src/mod{j}.cpp": _source(j, v) for j in range(N_SOURCES)}, "Reformat every module", when  # big


def fast_import_stream(rng: random.Random, n_commits: int, truth: RepoTruth) -> bytes:
    """The fast-import stream for one repository; fills `truth` with each commit's outcome."""
    out: list[bytes] = []
    when = datetime(2020, 3, 1, tzinfo=UTC)
    version = 0
    kinds = list(KINDS)
    weights = [KINDS[k][0] for k in kinds]

    def commit(message: str, at: datetime, files: dict[str, str]) -> None:
        nonlocal version
        version += 1
        ts = int(at.timestamp())
        out.append(b"commit refs/heads/main\n")
        out.append(f"committer Dev {version % 7} <dev{version % 7}@example.com> {ts} +0000\n".encode())
        out.append(_blob(message))
        for path, text in files.items():
            out.append(f"M 100644 inline {path}\n".encode())
            out.append(_blob(text))
        out.append(b"\n")

    # Root commit: the whole layout (52 files: too-many-files, checked before non-cpp-file).
    files = {"CMakeLists.txt": CMAKE, "README.md": "# synthetic\n", "tests/test_main.cpp": "int main() {}\n"}
    for i in range(N_SOURCES):
        files[f"src/mod{i}.cpp"] = _source(i, 0)
        files[f"include/mod{i}.h"] = _header(i, 0)
    files["third_party/lib/lib.cpp"] = "int lib() { return 0; }\n"
    commit("Initial import", when, files)
    truth.commits += 1
    truth.outcomes["too-many-files"] += 1

    for _ in range(n_commits - 1):
        when += timedelta(hours=rng.randint(1, 48))
        kind = rng.choices(kinds, weights)[0]
        files, msg, at = _change(rng, kind, version + 1, when)
        commit(msg, at, files)
        truth.commits += 1
        truth.outcomes[KINDS[kind][1]] += 1
    # A root commit that passed the rules would count as "root-commit"; ours is rejected earlier.
    return b"".join(out)


def make_repo(path: Path, n_commits: int, seed: int) -> RepoTruth:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True)
    truth = RepoTruth(path=str(path))
    stream = fast_import_stream(random.Random(seed), n_commits, truth)
    subprocess.run(
        ["git", "-C", str(path), "fast-import", "--quiet", "--done"],
        input=stream + b"done\n",
        check=True,
    )
    return truth


def make_repos(
    root: Path, n: int, *, commits: tuple[int, int] = (20, 60), seed: int = 0, workers: int = 2
) -> list[RepoTruth]:
    """`n` repositories under `root` (`r00000`, …) with `commits` commits each (uniform range)."""
    rng = random.Random(seed)
    plan = [(root / f"r{i:05d}", rng.randint(*commits), seed * 1_000_003 + i) for i in range(n)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda p: make_repo(*p), plan))
