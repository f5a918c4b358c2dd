"""Whose fault a rejection is, and what the user can do about it, on real generated CMake projects:
a test the commit breaks (`test-failure`, the parent passes); a test failing on both sides in
Release that passes in Debug (measured in Debug, both attempts recorded); one failing everywhere
(`test-failure-both-sides`, "fails on both sides in Release"); one the commit fixes
(`test-failure-parent-only`); a hanging test (`timeout`, no re-runs); no test at all (`no-tests`);
a configure error (`configure`); a project whose code is in a submodule (built) and one whose
submodule nobody has (`dependency`, named, at the checkout step)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cppperf.services.builder.service import build_patch
from cppperf.shared.domain import InstanceRecord
from tests.conftest import as_file, make_settings, strict
from tests.gitrepo import commit_files
from tests.integration.test_builder import commit_for

pytestmark = [pytest.mark.build, pytest.mark.stage2]

CMAKE = """cmake_minimum_required(VERSION 3.16)
project(f CXX)
enable_testing()
add_executable(t t.cpp)
add_test(NAME t COMMAND t)
"""


def program(k: int, release_fails: bool, always_fails: bool = False) -> str:
    body = "return 1;" if always_fails else ("return k > 0 ? 0 : 1;")
    guard = "#ifdef NDEBUG\n    return 1;\n#endif\n" if release_fails else ""
    return f"volatile int k = {k};\nint main() {{\n{guard}    {body}\n}}\n"


def prove(tmp_path: Path, repo: Path, sha: str, **builder: Any) -> dict[str, Any]:
    # a private lease directory: other cppperf processes on the host never hold this test's core
    builder = {"runs": 4, "confirm": False, "lease_dir": str(tmp_path / "leases"), **builder}
    settings = make_settings(tmp_path, builder=builder)
    built = build_patch(
        commit_for(repo, sha), repo, settings.builder, work_dir=tmp_path / "work", out_dir=tmp_path / "out"
    )
    record = as_file(built.record)
    strict(record, InstanceRecord)  # every rejection's record is what the domain declares
    c: dict[str, Any] = record["cppperf"]
    return c


def test_the_commit_broke_it(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": CMAKE, "t.cpp": program(1, False)}, "one")
    head = commit_files(repo, {"t.cpp": program(0, False)}, "two")  # k = 0: the test fails
    c = prove(tmp_path, repo, head)
    assert (c["verdict"], c["failure_category"], c["failure_step"]) == ("rejected", "test-failure", "test")
    assert "new side only (the commit broke it)" in c["failure_detail"]
    assert any("on the old side: passed" in t for t in c["tried"]), c["tried"]
    assert [a["build_type"] for a in c["attempts"]] == ["Release"]  # not the profile's fault: no retry


def test_fails_in_release_on_both_sides_then_measured_in_debug(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": CMAKE, "t.cpp": program(1, True)}, "one")
    head = commit_files(repo, {"t.cpp": program(2, True)}, "two")
    c = prove(tmp_path, repo, head)
    assert c["verdict"] != "rejected", c["failure_detail"]
    assert [a["build_type"] for a in c["attempts"]] == ["Release", "Debug"]
    assert c["attempts"][0]["failure_category"] == "test-failure-both-sides"
    assert c["environment"]["build_type"] == "Debug"
    assert any("rebuilt both sides in Debug" in t for t in c["tried"])
    # both attempts' logs kept, each step's record pointing at its own copy
    first = [Path(st["log"]) for st in c["attempts"][0]["build_steps"] if st.get("log")]
    second = [Path(st["log"]) for st in c["attempts"][1]["build_steps"] if st.get("log")]
    assert first and second and not set(first) & set(second)
    assert all(p.is_file() and p.stat().st_size > 0 and p.parent.name == "attempt-1-Release" for p in first)
    assert all(p.is_file() and p.stat().st_size > 0 for p in second)


def test_fails_everywhere_is_not_the_commits_fault(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": CMAKE, "t.cpp": program(1, False, always_fails=True)}, "one")
    head = commit_files(repo, {"t.cpp": program(2, False, always_fails=True)}, "two")
    c = prove(tmp_path, repo, head)
    assert (c["verdict"], c["failure_category"]) == ("rejected", "test-failure-both-sides")
    assert "fails on both sides in Release" in c["failure_detail"]
    assert [a["build_type"] for a in c["attempts"]] == ["Release", "Debug"]
    # without a fallback build type: one attempt
    c = prove(tmp_path, repo, head, fallback_build_type="")
    assert [a["build_type"] for a in c["attempts"]] == ["Release"]


def test_the_commit_fixed_it_is_parent_only(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": CMAKE, "t.cpp": program(0, False)}, "one")  # k = 0: fails
    head = commit_files(repo, {"t.cpp": program(1, False)}, "two")
    c = prove(tmp_path, repo, head, fallback_build_type="")
    assert (c["verdict"], c["failure_category"], c["failure_step"]) == (
        "rejected",
        "test-failure-parent-only",
        "test",
    )
    assert "old side (the parent) only" in c["failure_detail"]
    assert any("on the new side: passed" in t for t in c["tried"]), c["tried"]


def test_a_hanging_test_is_a_timeout(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": CMAKE, "t.cpp": program(1, False)}, "one")
    hang = "volatile int k = 1;\nint main() {\n    while (k) {}\n    return 0;\n}\n"
    head = commit_files(repo, {"t.cpp": hang}, "two")
    c = prove(tmp_path, repo, head, test_timeout=2.0)
    assert (c["verdict"], c["failure_category"]) == ("rejected", "timeout")
    assert "on the new side" in c["failure_detail"] and "(timed out)" in c["failure_detail"]
    assert not any("again" in t for t in c["tried"])  # a wall decides at once: no re-runs


def test_no_common_test_is_no_tests(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    cmake = CMAKE.replace("add_test(NAME t COMMAND t)\n", "")
    commit_files(repo, {"CMakeLists.txt": cmake, "t.cpp": program(1, False)}, "one")
    head = commit_files(repo, {"t.cpp": program(2, False)}, "two")
    c = prove(tmp_path, repo, head)
    assert (c["verdict"], c["failure_category"], c["failure_step"]) == ("rejected", "no-tests", "tests")


def test_a_configure_error_is_configure(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    cmake = CMAKE.replace("enable_testing()", 'message(FATAL_ERROR "needs a flux capacitor")')
    commit_files(repo, {"CMakeLists.txt": cmake, "t.cpp": program(1, False)}, "one")
    head = commit_files(repo, {"t.cpp": program(2, False)}, "two")
    c = prove(tmp_path, repo, head)
    assert (c["verdict"], c["failure_category"], c["failure_step"]) == ("rejected", "configure", "configure")
    assert "flux capacitor" in c["failure_detail"]


def _with_submodule(tmp_path: Path) -> tuple[Path, Path, str]:
    lib = tmp_path / "lib"
    commit_files(
        lib,
        {"CMakeLists.txt": "add_library(lib STATIC lib.cpp)\n", "lib.cpp": "int lib() { return 0; }\n"},
        "lib",
    )
    repo = tmp_path / "r"
    cmake = CMAKE.replace(
        "add_executable(t t.cpp)", "add_subdirectory(third_party/lib)\nadd_executable(t t.cpp)"
    )
    cmake += "target_link_libraries(t lib)\n"
    main = "int lib();\nvolatile int k = {k};\nint main() {{ return lib() + (k > 0 ? 0 : 1); }}\n"
    commit_files(repo, {"CMakeLists.txt": cmake, "t.cpp": main.format(k=1)}, "one")
    git = [
        "git",
        "-c",
        "protocol.file.allow=always",
        "-c",
        "user.name=a",
        "-c",
        "user.email=a@b",
        "-C",
        str(repo),
    ]
    subprocess.run([*git, "submodule", "add", "-q", f"file://{lib}", "third_party/lib"], check=True)
    subprocess.run([*git, "commit", "-qm", "submodule"], check=True)
    head = commit_files(repo, {"t.cpp": main.format(k=2)}, "two")
    return lib, repo, head


def test_a_project_in_a_submodule_builds(tmp_path: Path) -> None:
    _, repo, head = _with_submodule(tmp_path)
    c = prove(tmp_path, repo, head)
    assert c["verdict"] != "rejected", c["failure_detail"]


def test_a_submodule_nobody_has_is_a_named_dependency(tmp_path: Path) -> None:
    lib, repo, head = _with_submodule(tmp_path)
    bare = tmp_path / "bare.git"  # a mirror: no .git/modules; the submodule's origin is gone
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)
    subprocess.run(["rm", "-rf", str(lib)], check=True)
    c = prove(tmp_path, bare, head)
    assert (c["verdict"], c["failure_category"], c["failure_step"]) == ("rejected", "dependency", "checkout")
    assert "third_party/lib" in c["failure_detail"]
    assert c["tried"], c


WERROR_CMAKE = CMAKE.replace("add_test(", "target_compile_options(t PRIVATE -Wall -Werror)\nadd_test(")


def test_warnings_made_errors_are_retried_with_wno_error(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    unused = "static int unused_fn() { return 0; }\n"  # -Wunused-function: an error under -Werror
    commit_files(repo, {"CMakeLists.txt": WERROR_CMAKE, "t.cpp": unused + program(1, False)}, "one")
    head = commit_files(repo, {"t.cpp": unused + program(2, False)}, "two")
    c = prove(tmp_path, repo, head)
    assert c["verdict"] != "rejected", c["failure_detail"]
    assert [(a["build_type"], a["profile_change"]) for a in c["attempts"]] == [
        ("Release", ""),
        ("Release", "-Wno-error"),
    ]
    assert c["attempts"][0]["failure_category"] == "compile"
    assert any("-Wno-error" in t for t in c["tried"])
    assert "-Wno-error" in " ".join(c["build_steps"][0]["command"])
    # off: rejected as compile, one attempt
    c = prove(tmp_path, repo, head, werror_fallback=False)
    assert (c["failure_category"], len(c["attempts"])) == ("compile", 1)


def test_a_real_compile_error_is_not_retried(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": WERROR_CMAKE, "t.cpp": program(1, False)}, "one")
    head = commit_files(repo, {"t.cpp": "int main() { return undeclared; }\n"}, "two")
    c = prove(tmp_path, repo, head)
    assert (c["verdict"], c["failure_category"], len(c["attempts"])) == ("rejected", "compile", 1)


def test_werror_only() -> None:
    from cppperf.shared.engine.cmake import werror_only

    werr = "t.cpp:1:12: error: 'int f()' defined but not used [-Werror=unused-function]\n"
    real = "t.cpp:2:21: error: 'undeclared' was not declared in this scope\n"
    assert werror_only(werr + "cc1plus: all warnings being treated as errors\n")
    assert not werror_only(werr + real) and not werror_only("ninja: build stopped\n")


# fails on its third run in a build dir (a counter file in the test's working directory, the
# build dir), passes on every other: the old side's third run is a timed one
FLAKY = """#include <cstdio>
volatile int k = 1;
int main() {
    int n = 0;
    if (FILE* f = std::fopen("runs.txt", "r")) { if (std::fscanf(f, "%d", &n) != 1) n = 0; std::fclose(f); }
    if (FILE* f = std::fopen("runs.txt", "w")) { std::fprintf(f, "%d", n + 1); std::fclose(f); }
    if (n == 2) { std::puts("third run fails"); return 3; }
    return k > 0 ? 0 : 1;
}
"""


def test_a_test_that_passes_when_run_again_is_flaky(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": CMAKE, "t.cpp": FLAKY}, "one")
    steady = "volatile int k = 2;\nint main() { return k > 0 ? 0 : 1; }\n"
    head = commit_files(repo, {"t.cpp": steady}, "two")  # the new side never fails
    c = prove(tmp_path, repo, head, fallback_build_type="")
    assert (c["verdict"], c["failure_category"], c["failure_step"]) == ("rejected", "test-flaky", "test")
    assert "on the old side" in c["failure_detail"] and "passed when re-run there" in c["failure_detail"]
    assert "ran t again on the old side: passed" in c["tried"], c["tried"]


@contextlib.contextmanager
def killing_the_build(marker: str) -> Iterator[None]:
    """While the block runs: SIGKILL the `cmake --build` above a process whose command line holds
    `marker` (its parent chain read from /proc; a container's processes are the host's too), as
    the host's OOM killer or an operator would."""
    stop = threading.Event()

    def kill() -> None:
        while not stop.wait(0.2):
            for proc in Path("/proc").iterdir():
                try:
                    if marker.encode() not in (proc / "cmdline").read_bytes():
                        continue
                    pid = int(proc.name)
                    while pid > 1:
                        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
                        if len(argv) > 1 and argv[0].endswith(b"cmake") and argv[1] == b"--build":
                            os.kill(pid, signal.SIGKILL)
                            return
                        stat = (Path("/proc") / str(pid) / "stat").read_text()
                        pid = int(stat.rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        yield
    finally:
        stop.set()
        killer.join()


def slow_build_repo(repo: Path, marker: str) -> str:
    """Two commits whose build runs a minute-long step with `marker` in its command line."""
    cmake = CMAKE + f'add_custom_target(slow ALL COMMAND sh -c "sleep 60 # {marker}")\n'
    commit_files(repo, {"CMakeLists.txt": cmake, "t.cpp": program(1, False)}, "one")
    return commit_files(repo, {"t.cpp": program(2, False)}, "two")


def test_a_build_killed_from_outside_is_infra(tmp_path: Path) -> None:
    """The build's `cmake --build` killed by SIGKILL from outside: no verdict about the project,
    `infra` (under bubblewrap the kill arrives as exit code 137)."""
    marker = f"cppperf-slow-{tmp_path.name}"
    head = slow_build_repo(tmp_path / "r", marker)
    with killing_the_build(marker):
        c = prove(tmp_path, tmp_path / "r", head)
    assert (c["verdict"], c["failure_category"], c["failure_step"]) == ("rejected", "infra", "build"), c[
        "failure_detail"
    ]
    assert c["failure_detail"].startswith("old build failed"), c["failure_detail"]
