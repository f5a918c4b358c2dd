"""A small real C++/CMake project as a git repo, with commits of every kind the pipeline meets.

Used by the tests and by `cppperf demo init DIR` (so a new user can try `cppperf mine` offline).
The library's `spin()` runs a xorshift loop `REPS` times; the perf commit drops two redundant
repetitions (same result; the spin test gets ~2× faster), the regression adds them back. Commit dates are inside the
default mining window (2020–2025) so the defaults select them.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.16)
project(demo CXX)
set(CMAKE_CXX_STANDARD 17)
enable_testing()
add_library(core src/core.cpp src/other.cpp)
target_include_directories(core PUBLIC include)
add_executable(test_spin tests/test_spin.cpp)
target_link_libraries(test_spin core)
add_test(NAME spin COMMAND test_spin)
add_executable(test_other tests/test_other.cpp)
target_link_libraries(test_other core)
add_test(NAME other COMMAND test_other)
"""

CORE_H = """\
#pragma once
unsigned long long spin(unsigned long long iters);
unsigned long long other_work(unsigned long long iters);
const char* banner();
"""

CORE_CPP = """\
#include "core.h"

static volatile unsigned long long sink;

unsigned long long spin(unsigned long long iters) {{
  unsigned long long x = 0;
  for (int rep = 0; rep < {reps}; ++rep) {{
    x = 88172645463325252ull;
    for (unsigned long long i = 0; i < iters; ++i) {{
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      sink = x;
    }}
  }}
  return x{bug};
}}
"""

OTHER_CPP = """\
#include "core.h"

static volatile unsigned long long other_sink;

unsigned long long other_work(unsigned long long iters) {{
  unsigned long long x = 2463534242ull;
  for (unsigned long long i = 0; i < iters; ++i) {{
    x ^= x << 7; x ^= x >> 9;
    other_sink = x;
  }}
  return x;
}}

const char* banner() {{ return "{banner}"; }}
"""

TEST_SPIN = """\
#include "core.h"
#include <cstdio>

static unsigned long long reference(unsigned long long iters) {
  unsigned long long x = 88172645463325252ull;
  for (unsigned long long i = 0; i < iters; ++i) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; }
  return x;
}

int main() {
  const unsigned long long n = SPIN_ITERS;
  if (spin(n) != reference(n)) { std::puts("spin: wrong result"); return 1; }
  std::puts("spin: ok");
  return 0;
}
"""

TEST_OTHER = """\
#include "core.h"
#include <cstdio>

int main() {
  if (other_work(OTHER_ITERS) == 0) { std::puts("other: zero"); return 1; }
  std::puts(banner());
  return 0;
}
"""


@dataclass
class DemoRepo:
    path: Path
    shas: dict[str, str] = field(default_factory=dict)  # commit kind -> sha

    def git(self, *args: str, date: str = "2024-03-01T12:00:00+00:00") -> str:
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "Demo Dev",
            "GIT_AUTHOR_EMAIL": "dev@example.com",
            "GIT_COMMITTER_NAME": "Demo Dev",
            "GIT_COMMITTER_EMAIL": "dev@example.com",
            "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_DATE": date,
        }
        out = subprocess.run(
            ["git", "-C", str(self.path), *args], check=True, capture_output=True, env=env, text=True
        )
        return out.stdout.strip()

    def write(self, rel: str, text: str) -> None:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def commit(self, kind: str, message: str, files: dict[str, str], *, date: str) -> str:
        for rel, text in files.items():
            self.write(rel, text)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message, date=date)
        sha = self.git("rev-parse", "HEAD")
        self.shas[kind] = sha
        return sha


def core(reps: int, bug: str = "") -> str:
    return CORE_CPP.format(reps=reps, bug=bug)


def other(banner: str = "other: ok") -> str:
    return OTHER_CPP.format(banner=banner)


def tests_for(spin_iters: int, other_iters: int) -> dict[str, str]:
    return {
        "tests/test_spin.cpp": TEST_SPIN.replace("SPIN_ITERS", f"{spin_iters}ull"),
        "tests/test_other.cpp": TEST_OTHER.replace("OTHER_ITERS", f"{other_iters}ull"),
    }


def create_demo_repo(
    path: Path,
    *,
    spin_iters: int = 8_000_000,
    other_iters: int = 3_000_000,
    extra_kinds: bool = True,
) -> DemoRepo:
    """Create the demo repository. Kinds (DemoRepo.shas keys), oldest first:

    base, perf (2× faster spin), docs (README only), noop (string change in other.cpp),
    comment (comment-only in core.cpp), regression (slower spin), and with `extra_kinds`:
    test_touch, vendored, too_many, out_of_window, side, merge, broken_test, compile_error, fixup
    (HEAD builds and passes, so the repository validates).
    The perf/noop/comment/regression commits pass the structural filter.
    """
    path.mkdir(parents=True, exist_ok=True)
    repo = DemoRepo(path)
    repo.git("init", "-q", "-b", "main")
    repo.commit(
        "base",
        "Initial import of the demo library",
        {
            "CMakeLists.txt": CMAKELISTS,
            "include/core.h": CORE_H,
            "src/core.cpp": core(3),
            "src/other.cpp": other(),
            **tests_for(spin_iters, other_iters),
        },
        date="2019-06-01T10:00:00+00:00",
    )
    repo.commit(
        "perf",
        "Speed up spin() by dropping redundant passes\n\nThe extra passes recomputed the same "
        "value; removing them halves the spin test's run time (fixes #7).",
        {"src/core.cpp": core(1)},
        date="2024-01-10T10:00:00+00:00",
    )
    repo.commit(
        "docs",
        "Document the build",
        {"README.md": "# demo\n\ncmake -B build && cmake --build build\n"},
        date="2024-01-11T10:00:00+00:00",
    )
    repo.commit(
        "noop", "Reword the banner", {"src/other.cpp": other("other: fine")}, date="2024-01-12T10:00:00+00:00"
    )
    repo.commit(
        "comment",
        "Explain the xorshift constants",
        {"src/core.cpp": core(1) + "// xorshift64 (Marsaglia 2003): shifts 13, 7, 17.\n"},
        date="2024-01-13T10:00:00+00:00",
    )
    repo.commit(
        "regression",
        "Run spin twice for robustness",
        {"src/core.cpp": core(3) + "// xorshift64 (Marsaglia 2003): shifts 13, 7, 17.\n"},
        date="2024-01-14T10:00:00+00:00",
    )
    if not extra_kinds:
        return repo
    repo.commit(
        "test_touch",
        "Speed up the spin test",
        tests_for(spin_iters, other_iters // 2) | {"src/other.cpp": other("other: fine!")},
        date="2024-02-01T10:00:00+00:00",
    )
    repo.commit(
        "vendored",
        "Update vendored helper",
        {"third_party/helper/helper.cpp": "int helper() { return 1; }\n"},
        date="2024-02-02T10:00:00+00:00",
    )
    repo.commit(
        "too_many",
        "Touch many files",
        {f"src/gen/file{i}.cpp": f"int gen{i}() {{ return {i}; }}\n" for i in range(21)},
        date="2024-02-03T10:00:00+00:00",
    )
    repo.commit(
        "out_of_window",
        "Late optimisation of other_work",
        {"src/other.cpp": other("other: late")},
        date="2026-02-04T10:00:00+00:00",
    )
    # a side branch merged back: the merge commit itself is rejected
    repo.git("checkout", "-q", "-b", "side", repo.shas["too_many"])
    repo.commit(
        "side",
        "Add side helper",
        {"src/side.cpp": "int side() { return 2; }\n"},
        date="2024-02-05T10:00:00+00:00",
    )
    repo.git("checkout", "-q", "main")
    repo.git("merge", "-q", "--no-ff", "-m", "Merge branch side", "side", date="2024-02-06T10:00:00+00:00")
    repo.shas["merge"] = repo.git("rev-parse", "HEAD")
    repo.commit(
        "broken_test",
        "Faster spin (wrong)",
        {"src/core.cpp": core(1, bug=" + 1")},
        date="2024-02-07T10:00:00+00:00",
    )
    repo.commit(
        "compile_error",
        "Faster spin (typo)",
        {"src/core.cpp": core(1).replace("return x", "retrun x")},
        date="2024-02-08T10:00:00+00:00",
    )
    repo.commit("fixup", "Fix the typo in spin", {"src/core.cpp": core(1)}, date="2024-02-09T10:00:00+00:00")
    return repo
