"""The builder proves speed-ups on a real generated C++/CMake project: improved (test named),
A/A-like no-op, comment-only (identical binaries, no timing), regression, broken test, compile
error, missing dependency (package named); the record is CppPerf-DB shaped; validation of HEAD."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from cppperf.demo import DemoRepo
from cppperf.services.builder.service import build_patch, validate_latest
from cppperf.shared import messages as m
from cppperf.shared.domain import InstanceRecord
from cppperf.shared.errors import RepoRejected
from cppperf.shared.rules import Rules
from cppperf.shared.settings import Settings
from tests.conftest import Proven, as_file, commit_for, make_settings, strict
from tests.gitrepo import commit_files

pytestmark = [pytest.mark.build, pytest.mark.stage2]

__all__ = ["commit_for"]  # other test modules import it from here


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


def prove(demo: DemoRepo, kind: str, settings: Settings, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    built = build_patch(
        commit_for(demo.path, demo.shas[kind]),
        demo.path,
        settings.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    assert built.path.exists()
    record = as_file(built.record)
    assert json.loads(built.path.read_text()) == record
    strict(record, InstanceRecord)
    return record


def shared(proven: Callable[[str], Proven], kind: str, settings: Settings) -> dict:  # type: ignore[type-arg]
    """The session's proof of `kind` (see conftest `proven`), made with these very settings."""
    p = proven(kind)
    own = msgspec.structs.replace(  # all but the paths below each test's tmp_path
        settings.builder,
        work_dir=p.settings.builder.work_dir,
        submodule_cache=p.settings.builder.submodule_cache,
    )
    assert own == p.settings.builder
    assert p.path.exists()
    assert json.loads(p.path.read_text()) == p.record
    return p.record


def test_perf_commit_is_improved_and_names_the_test(
    demo_repo: DemoRepo, proven: Callable[[str], Proven], settings: Settings
) -> None:
    rec = shared(proven, "perf", settings)
    c = rec["cppperf"]
    assert c["verdict"] == "improved", c
    assert rec["tests"]["significant_improvements_tests"] == ["spin"]
    spin = next(t for t in c["tests"] if t["name"] == "spin")
    assert spin["ratio"] < 0.85 and spin["ci_high"] < 1.0
    assert c["confirmations"]["spin"]["held"] is True
    other = next(t for t in c["tests"] if t["name"] == "other")
    assert not other["improved"] and not other["regressed"]
    # published CppPerf-DB keys are all there, with raw samples both sides
    for key in (
        "metadata",
        "commit_info",
        "issues",
        "pull_requests",
        "build_info",
        "performance_analysis",
        "tests",
        "logs",
        "raw_timing_data",
    ):
        assert key in rec
    assert rec["commit_info"]["new_sha"] == demo_repo.shas["perf"]
    assert rec["commit_info"]["old_sha"] == demo_repo.shas["base"]
    assert len(c["samples"]["spin"]["old_s"]) == len(c["samples"]["spin"]["new_s"]) >= 6
    assert rec["raw_timing_data"]["warmup_runs"] == 1
    assert c["seed"] == settings.builder.seed
    assert c["environment"]["cpu_count"] >= 1
    # decided on CPU time (load-robust), every metric kept, all three rules' verdicts
    assert c["metric"] == "cpu" and c["decided_on"] == {"other": "cpu", "spin": "cpu"}
    assert len(c["samples"]["spin"]["old_cpu_s"]) == len(c["samples"]["spin"]["old_s"])
    assert (c["decision_rule"], c["verdict_paper_rule"], c["verdict_strict_rule"]) == (
        "ours",
        "improved",
        "improved",
    )
    # the facts a rerun needs: real commands, versions, the leased core, the load
    env = c["environment"]
    assert (
        env["leased_core"] in env["timing_cores"] and not set(env["timing_cores"]) & set(env["build_cores"])
    ) or (env["cpu_count"] == 1)
    assert env["compiler_version"] and env["cmake_version"].startswith("cmake version")
    assert env["cppperf_version"] and len(env["load_average_start"]) == 3
    configure = rec["build_info"]["new_build_script"][0]
    assert "-DCMAKE_BUILD_TYPE=Release" in configure and "-DBUILD_TESTING=ON" in configure
    assert "--build" in rec["build_info"]["new_build_script"][1]
    # the paper-format summary names the improved test, with medians beside means
    pa = rec["performance_analysis"]
    assert pa["test_name"] == "spin" and pa["test_relative_improvement_median"] > 0.3
    assert rec["tests"]["tests"][0]["relative_improvement_median"] is not None


def test_noop_commit_is_not_improved(proven: Callable[[str], Proven], settings: Settings) -> None:
    rec = shared(proven, "noop", settings)
    assert rec["cppperf"]["verdict"] == "not-improved"
    assert rec["tests"]["significant_improvements"] == 0


def test_comment_only_commit_short_circuits(demo_repo: DemoRepo, settings: Settings, tmp_path: Path) -> None:
    rec = prove(demo_repo, "comment", settings, tmp_path)
    assert rec["cppperf"]["verdict"] == "unchanged-binaries"
    assert rec["cppperf"]["samples"] == {}  # no timing runs at all
    # the tests whose binaries were compared are listed
    assert rec["cppperf"]["compared_tests"] == ["other", "spin"]
    assert [t["test_name"] for t in rec["tests"]["tests"]] == ["other", "spin"]
    assert rec["tests"]["total_tests"] == 2


def test_paper_profile_builds_debug_and_decides_by_the_papers_rule(
    demo_repo: DemoRepo, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, builder={"profile": "paper", "runs": 8})
    c = prove(demo_repo, "perf", settings, tmp_path)
    assert "-DCMAKE_BUILD_TYPE=Debug" in c["build_info"]["new_build_script"][0]
    cp = c["cppperf"]
    assert cp["profile"] == "paper" and cp["environment"]["build_type"] == "Debug"
    assert cp["decision_rule"] == "paper" and cp["verdict"] == cp["verdict_paper_rule"] == "improved"


def test_slowdown_is_a_regression(proven: Callable[[str], Proven], settings: Settings) -> None:
    rec = shared(proven, "regression", settings)
    assert rec["cppperf"]["verdict"] == "regressed"
    # the slowed test is named; a ~10 ms neighbour on a busy 2-core machine may be flagged too (noise)
    assert "spin" in rec["tests"]["significant_regressions_tests"]


def test_broken_test_rejects_with_test_named(demo_repo: DemoRepo, settings: Settings, tmp_path: Path) -> None:
    c = prove(demo_repo, "broken_test", settings, tmp_path)["cppperf"]
    assert (c["verdict"], c["failure_category"]) == ("rejected", "test-failure")
    assert "test spin failed on the new side" in c["failure_detail"]
    assert "wrong result" in c["failure_detail"]


def test_compile_error_rejects_as_compile(demo_repo: DemoRepo, settings: Settings, tmp_path: Path) -> None:
    c = prove(demo_repo, "compile_error", settings, tmp_path)["cppperf"]
    assert (c["verdict"], c["failure_category"]) == ("rejected", "compile")
    assert "retrun" in c["failure_detail"]


def test_missing_dependency_is_named(tmp_path: Path, settings: Settings) -> None:
    repo = tmp_path / "needs-gsl"
    cmake = (
        "cmake_minimum_required(VERSION 3.16)\nproject(g CXX)\nfind_package(GSL REQUIRED)\nenable_testing()\n"
    )
    commit_files(repo, {"CMakeLists.txt": cmake, "a.cpp": "int main() { return 0; }\n"}, "one")
    head = commit_files(repo, {"a.cpp": "int main() { return 0; } // two\n"}, "two")
    built = build_patch(
        commit_for(repo, head, "local/needs-gsl"),
        repo,
        settings.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    c = as_file(built.record)["cppperf"]
    assert (c["verdict"], c["failure_category"]) == ("rejected", "dependency")
    assert "GSL" in c["failure_detail"]
    assert c["missing_packages"] == ["libgsl-dev"]


def test_validate_latest_builds_and_runs_head(
    demo_repo: DemoRepo, settings: Settings, tmp_path: Path
) -> None:
    cand = m.RepoCandidate(repo="local/demo", url=str(demo_repo.path), source="path")
    found = validate_latest(cand, demo_repo.path, settings.builder, work_dir=tmp_path / "work")
    assert found.validated and found.test_count == 2
    assert found.head_sha == demo_repo.shas["fixup"]


def test_validate_latest_rejects_a_broken_head(
    demo_repo: DemoRepo, settings: Settings, tmp_path: Path
) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(demo_repo.path), str(clone)], check=True)
    subprocess.run(
        ["git", "-C", str(clone), "reset", "-q", "--hard", demo_repo.shas["compile_error"]], check=True
    )
    cand = m.RepoCandidate(repo="local/clone", url=str(clone), source="path")
    with pytest.raises(RepoRejected, match="does not build"):
        validate_latest(cand, clone, settings.builder, work_dir=tmp_path / "work")


RELEASE_ONLY_FAILS = {
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\nproject(p CXX)\nenable_testing()\n"
    "add_executable(t t.cpp)\nadd_test(NAME t COMMAND t)\n",
    # a test that fails when NDEBUG is defined (Release) and passes in Debug
    "t.cpp": "int main() {\n#ifdef NDEBUG\n  return 1;\n#else\n  return 0;\n#endif\n}\n",
}


def test_validate_latest_falls_back_to_debug(settings: Settings, tmp_path: Path) -> None:
    repo = tmp_path / "relfail"
    commit_files(repo, RELEASE_ONLY_FAILS, "head")
    cand = m.RepoCandidate(repo="local/relfail", url=str(repo), source="path")
    found = validate_latest(cand, repo, settings.builder, work_dir=tmp_path / "work")
    assert found.validated and found.build_type == "Debug" and found.test_count == 1
    no_fallback = make_settings(tmp_path, builder={"fallback_build_type": ""})
    with pytest.raises(RepoRejected, match="test t fails"):
        validate_latest(cand, repo, no_fallback.builder, work_dir=tmp_path / "work2")


def test_rules_select_what_the_builder_can_prove(demo_repo: DemoRepo) -> None:
    """Every commit the filter selects in the demo has a parent the builder can check out."""
    from cppperf.services.filter.walk import walk

    for c in walk(demo_repo.path, Rules.from_settings(make_settings(Path("/tmp")).mining)).selected:
        assert c.parents


def _two_commit_repo(repo: Path, cmake: str) -> str:
    commit_files(repo, {"CMakeLists.txt": cmake, "a.cpp": "int main() { return 0; }\n"}, "one")
    return commit_files(repo, {"a.cpp": "int main() { return 0; } // two\n"}, "two")


def test_unknown_dependency_asks_the_model(tmp_path: Path) -> None:
    from cppperf.services.builder.service import llm_dependency_proposer
    from tests.fake_openai import FakeOpenAI

    repo = tmp_path / "needs-zorblax"
    head = _two_commit_repo(
        repo,
        "cmake_minimum_required(VERSION 3.16)\nproject(z CXX)\n"
        "find_package(Zorblax REQUIRED)\nenable_testing()\n",
    )
    with FakeOpenAI(lambda _m, p: "libzorblax-dev, libfoo-dev" if "Zorblax" in p else "none") as srv:
        settings = make_settings(
            tmp_path, builder={"llm_deps": True, "llm_deps_attempts": 1}, classifier={"base_urls": [srv.url]}
        )
        built = build_patch(
            commit_for(repo, head, "local/z"),
            repo,
            settings.builder,
            work_dir=tmp_path / "work",
            out_dir=tmp_path / "out",
            llm_propose=llm_dependency_proposer(settings),
        )
        assert len(srv.requests) == 1
    c = as_file(built.record)["cppperf"]
    assert c["failure_category"] == "dependency"
    assert c["llm_proposed_packages"] == ["libzorblax-dev", "libfoo-dev"]
    assert "Zorblax" in c["failure_detail"]
    # build logs are kept beside the records even though the workspace is gone
    assert all(Path(s["log"]).is_file() for s in c["build_steps"])


def test_ctest_pass_fail_regex_and_will_fail_rules() -> None:
    from cppperf.shared.engine.cmake import TestCase as CTest

    plain = CTest(name="t", command=["x"], cwd=".")
    assert plain.passed(0, "") and not plain.passed(1, "") and not plain.passed(0, "", timed_out=True)
    rx = CTest(name="t", command=["x"], cwd=".", pass_regex=("circular reference", "\\n.* Keys\\nc449"))
    assert rx.passed(1, "error: circular reference found") and not rx.passed(0, "all good")
    spans = CTest(name="t", command=["x"], cwd=".", pass_regex=("reduction\n.* Attack",))
    assert spans.passed(
        0, "Z reduction\n0 %\r100 %\n[12:00] Attack on 5 values"
    )  # "." spans lines, as in CMake
    fail = CTest(name="t", command=["x"], cwd=".", fail_regex=("LEAK",))
    assert not fail.passed(0, "LEAK of 3 bytes") and fail.passed(0, "clean")
    inverted = CTest(name="t", command=["x"], cwd=".", will_fail=True)
    assert inverted.passed(3, "") and not inverted.passed(0, "")
    skip = CTest(name="t", command=["x"], cwd=".", skip_return_code=77)
    assert skip.passed(77, "")


def test_tests_that_find_data_through_file_macro_still_pass(tmp_path: Path) -> None:
    """CCACHE_BASEDIR would make __FILE__ relative and break this kind of test (seen on bkcrack),
    so the default keeps absolute paths."""
    import shutil as sh

    repo = tmp_path / "filemacro"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "data.txt").write_text("42\n")
    (repo / "tests" / "t.cpp").write_text(
        "#include <filesystem>\n#include <fstream>\nint main() {\n"
        '  std::ifstream in{std::filesystem::path{__FILE__}.replace_filename("data.txt")};\n'
        "  int v = 0; in >> v; return v == 42 ? 0 : 1; }\n"
    )
    (repo / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(f CXX)\nset(CMAKE_CXX_STANDARD 17)\nenable_testing()\n"
        "add_executable(t tests/t.cpp)\nfile(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/sub)\n"
        "add_test(NAME data COMMAND t WORKING_DIRECTORY ${CMAKE_BINARY_DIR}/sub)\n"
    )
    commit_files(repo, {}, "one")
    cand = m.RepoCandidate(repo="local/filemacro", url=str(repo), source="path")
    found = validate_latest(cand, repo, make_settings(tmp_path).builder, work_dir=tmp_path / "work")
    assert found.validated and found.test_count == 1
    if sh.which("ccache"):  # the reason for the default, shown
        s = make_settings(tmp_path, builder={"ccache_basedir": True})
        with pytest.raises(RepoRejected, match="test data fails"):
            validate_latest(cand, repo, s.builder, work_dir=tmp_path / "work-basedir")


FAKE_GTEST = r"""
#include <cstdio>
#include <cstring>
#include <string>
#include "reps.h"
static volatile unsigned long long sink;
static void work(unsigned long long n) {
  unsigned long long x = 1;
  for (unsigned long long i = 0; i < n; ++i) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; sink = x; }
}
int main(int argc, char** argv) {  // speaks gtest's command line: --gtest_list_tests, --gtest_filter
  std::string filter = "*";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--gtest_list_tests")) { std::puts("Fast.\n  one\nSlow.\n  two"); return 0; }
    if (!std::strncmp(argv[i], "--gtest_filter=", 15)) filter = argv[i] + 15;
  }
  if (filter == "*" || filter == "Fast.one") work(6000000ull);
  if (filter == "*" || filter == "Slow.two") work(REPS * 6000000ull);
  return 0;
}
"""


def test_split_cases_times_each_gtest_case(tmp_path: Path) -> None:
    repo = tmp_path / "gt"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "unit.cpp").write_text(FAKE_GTEST)
    (repo / "src" / "reps.h").write_text("#define REPS 4ull\n")
    (repo / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(gt CXX)\nenable_testing()\n"
        "add_executable(unit src/unit.cpp)\ntarget_include_directories(unit PRIVATE src)\n"
        "add_test(NAME unit COMMAND unit)\n"
    )
    commit_files(repo, {}, "one")
    head = commit_files(repo, {"src/reps.h": "#define REPS 1ull\n"}, "Faster Slow.two")
    s = make_settings(tmp_path, builder={"split_cases": True})
    built = build_patch(
        commit_for(repo, head, "local/gt"),
        repo,
        s.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    c = as_file(built.record)["cppperf"]
    assert {t["name"] for t in c["tests"]} == {"unit::Fast.one", "unit::Slow.two"}
    assert c["verdict"] == "improved" and as_file(built.record)["tests"][
        "significant_improvements_tests"
    ] == ["unit::Slow.two"]


def test_parse_gtest_listing() -> None:
    from cppperf.shared.engine.cases import parse_gtest

    listing = "Suite.\n  a\n  DISABLED_b\nParam/Typed.  # TypeParam = int\n  c  # GetParam() = 3\n"
    assert parse_gtest(listing) == ["Suite.a", "Param/Typed.c"]
    assert parse_gtest("Running 3 tests...\n[ OK ] x") == []


def test_same_path_trees_share_compiled_objects(demo_repo: DemoRepo, tmp_path: Path) -> None:
    """Both trees are built at one path in a mount namespace, so the second build reuses the
    first one's objects from ccache (without CCACHE_BASEDIR and its relative __FILE__)."""
    import shutil as sh

    from cppperf.shared.engine.sandbox import mount_namespace_available

    if not sh.which("ccache") or not mount_namespace_available():
        pytest.skip("needs ccache and a private mount namespace")
    # the fewest timed rounds: only the builds are looked at here, not the verdict
    s = make_settings(tmp_path, builder={"keep": True, "runs": 4, "confirm": False})
    built = build_patch(
        commit_for(demo_repo.path, demo_repo.shas["noop"]),
        demo_repo.path,
        s.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    ws = tmp_path / "work" / as_file(built.record)["cppperf"]["instance_id"]
    stats = subprocess.run(
        ["ccache", "--print-stats"],
        env={**os.environ, "CCACHE_DIR": str(ws / "ccache")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts = dict(line.split("\t", 1) for line in stats.splitlines() if "\t" in line)
    hits = int(counts.get("direct_cache_hit", 0)) + int(counts.get("preprocessed_cache_hit", 0))
    assert hits >= 3  # core.cpp and both test programs come from old's build; only other.cpp changed
