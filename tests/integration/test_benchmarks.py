"""The project's own benchmarks as workloads (shared/engine/benchmarks.py): Google Benchmark's JSON
read into samples (aggregates skipped, errors and garbage categorized), benchmark switches turned
on at configure, executables found through CMake's file API, and — on a generated CMake project
built with the real Google Benchmark (libbenchmark-dev) — a commit that speeds up only a
benchmarked function is proven with `proven_by` = `benchmark` while no CTest test shows it, the
unchanged benchmark beside it is an A/A control that is not improved, a crashing benchmark and one
reporting an error are skipped with their reason, and the evaluator scores the expert's patch
`opt` on the benchmark (gold validation: oracle `benchmark`)."""

from __future__ import annotations

import difflib
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cppperf.services.builder.service import build_patch
from cppperf.services.evaluator.gold import validate_stored
from cppperf.shared.domain import (
    BenchmarkSkip,
    EvalReport,
    EvalVerdict,
    InstanceMeta,
    Oracle,
    PerTestScore,
    to_struct,
)
from cppperf.shared.engine.benchmarks import (
    BenchTarget,
    as_sample,
    benchmark_targets,
    broken_on,
    discover,
    edited_sources,
    executables_identical,
    probe_problem,
)
from cppperf.shared.engine.cmake import TestCase as Case
from cppperf.shared.engine.cmake import benchmark_options_from_text
from cppperf.shared.engine.fileapi import write_query
from cppperf.shared.engine.gbench import BenchOutputError, BenchSettings, ere_escape, listed, parse_run
from cppperf.shared.engine.sandbox import RunResult
from cppperf.shared.settings import BuilderSettings, Settings
from tests.conftest import as_file, commit_for, make_settings
from tests.gitrepo import commit_files

pytestmark = pytest.mark.stage2


def _gb_json(*entries: dict[str, Any]) -> str:
    return json.dumps({"context": {"date": "x", "num_cpus": 2}, "benchmarks": list(entries)}, indent=2)


def _it(name: str, real: float, cpu: float, rep: int = 0, unit: str = "ns") -> dict[str, Any]:
    return {
        "name": name,
        "run_name": name,
        "run_type": "iteration",
        "repetitions": 3,
        "repetition_index": rep,
        "iterations": 1000,
        "real_time": real,
        "cpu_time": cpu,
        "time_unit": unit,
    }


def test_the_sample_is_the_median_of_the_repetitions_aggregates_skipped() -> None:
    agg = {**_it("BM_a", 1e9, 1e9), "name": "BM_a_mean", "run_type": "aggregate", "aggregate_name": "mean"}
    out = "2026-01-01 stderr noise\n" + _gb_json(
        _it("BM_a", 100.0, 90.0, 0),
        _it("BM_a", 300.0, 290.0, 1),
        _it("BM_a", 200.0, 190.0, 2),
        agg,
        _it("BM_b", 5.0, 5.0, 0, unit="ms"),
    )
    real, cpu, n = parse_run(out, "BM_a")
    assert (real, cpu, n) == (pytest.approx(200e-9), pytest.approx(190e-9), 3)
    assert parse_run(out, "BM_b")[:2] == (pytest.approx(5e-3), pytest.approx(5e-3))
    res = as_sample("bench:t/BM_a", RunResult(0, 1.5, 1.4, out, False, False, instructions=7))
    assert res.ok and res.wall_s == pytest.approx(200e-9) and res.cpu_s == pytest.approx(190e-9)
    assert res.instructions is None  # the process's count is not the benchmark's


def test_garbage_errors_and_crashes_are_categorized_never_raised() -> None:
    with pytest.raises(BenchOutputError) as exc:
        parse_run("Segmentation fault\n{not json", "BM_a")
    assert exc.value.reason == BenchmarkSkip.MALFORMED_OUTPUT
    errored = _gb_json({**_it("BM_a", 1.0, 1.0), "error_occurred": True, "error_message": "no input"})
    with pytest.raises(BenchOutputError) as exc:
        parse_run(errored, "BM_a")
    assert exc.value.reason == BenchmarkSkip.ERROR_REPORTED and "no input" in str(exc.value)
    with pytest.raises(BenchOutputError):
        parse_run(_gb_json(_it("BM_other", 1.0, 1.0)), "BM_a")  # not this benchmark
    bad = as_sample("bench:t/BM_a", RunResult(0, 1.0, 1.0, "hello", False, False))
    assert not bad.ok and bad.output.startswith("malformed-output")
    crashed = probe_problem(RunResult(-6, 0.1, 0.1, "terminate called", False, False), "bench:t/BM_a")
    assert crashed is not None and crashed.reason == BenchmarkSkip.CRASHED and "exit -6" in crashed.detail
    assert (
        probe_problem(RunResult(0, 0.1, 0.1, _gb_json(_it("BM_a", 1, 1)), False, False), "bench:t/BM_a")
        is None
    )


def test_benchmark_switches_are_turned_on_and_the_librarys_own_tests_off() -> None:
    text = """
    option(FOO_BUILD_BENCHMARKS "b" OFF)
    option(BAR_ENABLE_BENCHMARK "b" OFF)
    option(BENCHMARK_ENABLE_LTO "the library's own" OFF)
    option(FOO_BUILD_TESTS "t" OFF)
    """
    opts = benchmark_options_from_text([text])
    assert "-DFOO_BUILD_BENCHMARKS=ON" in opts and "-DBAR_ENABLE_BENCHMARK=ON" in opts
    assert "-DBENCHMARK_ENABLE_TESTING=OFF" in opts and "-DBENCHMARK_ENABLE_GTEST_TESTS=OFF" in opts
    assert not any("LTO" in o or "FOO_BUILD_TESTS" in o for o in opts)
    assert benchmark_options_from_text(["project(x)\nadd_executable(a a.cpp)"]) == []  # commands unchanged


def _reply(build: Path, targets: dict[str, dict[str, Any]]) -> None:
    """A CMake file-API reply with these target objects (what configure writes)."""
    reply = build / ".cmake/api/v1/reply"
    reply.mkdir(parents=True)
    refs = []
    for i, (name, body) in enumerate(targets.items()):
        (reply / f"target-{i}.json").write_text(json.dumps({"name": name, **body}))
        refs.append({"name": name, "jsonFile": f"target-{i}.json"})
    refs.append({"name": "escape", "jsonFile": "../../../../secret.json"})  # never followed
    (build / "secret.json").write_text(json.dumps({"name": "secret", "type": "EXECUTABLE"}))
    (reply / "codemodel-v2-1.json").write_text(json.dumps({"configurations": [{"targets": refs}]}))
    objects = [{"kind": "codemodel", "jsonFile": "codemodel-v2-1.json"}]
    (reply / "index-1.json").write_text(json.dumps({"objects": objects}))


def _exe(path: str, fragments: list[str], deps: list[str] = (), sources: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "type": "EXECUTABLE",
        "sources": [{"path": p} for p in sources],
        "artifacts": [{"path": path}],
        "link": {"commandFragments": [{"fragment": f, "role": "libraries"} for f in fragments]},
        "dependencies": [{"id": d} for d in deps],
    }


def test_benchmark_executables_are_told_by_what_they_link(tmp_path: Path) -> None:
    _reply(
        tmp_path,
        {
            "gb_system": _exe(
                "bench/gb_system",
                ["/usr/lib/x86_64-linux-gnu/libbenchmark.so.1.7.1"],
                sources=["bench/gb.cpp", "src/work.cpp", "/usr/include/x.h"],
            ),
            "gb_in_tree": _exe("b2", ["_deps/benchmark-build/src/libbenchmark.a"], ["benchmark::@6890"]),
            "gb_main": _exe("b3", ["-lbenchmark_main", "-lbenchmark"]),
            "nano": _exe("nano", [], ["nanobench::@123"]),
            "unit": _exe("unit", ["libwork.a", "-lmybenchmarkutils"], sources=["src/work.cpp", "unit.cpp"]),
            "lib": {"type": "STATIC_LIBRARY", "artifacts": [{"path": "libbenchmark.a"}]},
        },
    )
    found = {t.target: (t.executable, t.framework) for t in benchmark_targets(tmp_path)}
    assert found == {
        "gb_system": ("bench/gb_system", "google-benchmark"),
        "gb_in_tree": ("b2", "google-benchmark"),
        "gb_main": ("b3", "google-benchmark"),
        "nano": ("nano", "nanobench"),
    }
    assert benchmark_targets(tmp_path / "never-configured") == []
    gb = next(t for t in benchmark_targets(tmp_path) if t.target == "gb_system")
    assert gb.sources == ("bench/gb.cpp",)  # its own: not the code it measures, nothing outside the tree


class _Trees:
    """Host source trees per side (what `edited_sources` compares)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def host_build_dir(self, side: str) -> Path:
        return self.root / side / "build"

    def host_source_dir(self, side: str) -> Path:
        return self.root / side / "src"


def test_a_benchmark_whose_own_source_changed_is_told(tmp_path: Path) -> None:
    for side, text in (("old", "a"), ("new", "a"), ("agent", "b")):
        (tmp_path / side / "src" / "bench").mkdir(parents=True)
        (tmp_path / side / "src" / "bench" / "gb.cpp").write_text(text)
    t = BenchTarget("gb", "gb", "google-benchmark", ("bench/gb.cpp", "bench/gone.cpp"))
    trees = _Trees(tmp_path)
    assert edited_sources(trees, replace(t, sources=("bench/gb.cpp",)), "old", "new") == []
    assert edited_sources(trees, t, "old", "agent") == ["bench/gb.cpp", "bench/gone.cpp"]  # missing counts


def test_nanobench_is_recorded_as_unsupported_not_run() -> None:
    ran: list[list[str]] = []

    def run(t: Case) -> RunResult:
        ran.append(t.command)
        return RunResult(0, 0.1, 0.1, "", False, False)

    found = discover(
        [BenchTarget("nano", "nano", "nanobench")],
        {"old": "/b/old", "new": "/b/new"},
        {"old": run, "new": run},
        BenchSettings(repetitions=3, min_time=0.01, timeout=10),
        limit=5,
    )
    assert ran == [] and found.common == []
    assert [(s.name, s.reason) for s in found.skipped] == [
        ("bench:nano/*", BenchmarkSkip.UNSUPPORTED_FRAMEWORK)
    ]


def test_unchanged_binaries_need_the_benchmark_executables_identical(tmp_path: Path) -> None:
    _reply(tmp_path / "old" / "build", {"gb": _exe("bench/gb", ["-lbenchmark"])})
    for side in ("old", "new"):
        (tmp_path / side / "build" / "bench").mkdir(parents=True, exist_ok=True)
        (tmp_path / side / "build" / "bench" / "gb").write_bytes(f"ELF built in {tmp_path / side}".encode())
    trees, on = _Trees(tmp_path), BuilderSettings()
    assert executables_identical(trees, on)  # type: ignore[arg-type]  # the same once paths are mapped
    (tmp_path / "new" / "build" / "bench" / "gb").write_bytes(b"ELF other code")
    assert not executables_identical(trees, on)  # type: ignore[arg-type]
    assert executables_identical(trees, BuilderSettings(benchmarks=False))  # type: ignore[arg-type]
    assert executables_identical(object(), on)  # type: ignore[arg-type]  # no trees on this host: nothing to time


def test_a_listing_is_names_only() -> None:
    # spdlog's formatter-bench has its own main: it echoes the flag and prints a usage error
    out = "--benchmark_list_tests=true\n[error] Usage: formatter-bench <pattern>\n"
    assert listed(out) == []
    assert listed(
        "***WARNING*** CPU scaling\nBM_a\nnull_sink_st (500_bytes c_str)\n/dev/null_st/real_time\n"
    ) == [
        "BM_a",
        "null_sink_st (500_bytes c_str)",
        "/dev/null_st/real_time",
    ]


def test_sub_nanosecond_samples_keep_their_ratio() -> None:
    """A per-iteration time can be far below a nanosecond: the statistics do not floor it away."""
    from cppperf.shared.engine.stats import compare_test

    t = compare_test("bench:x/BM_tiny", [4e-10, 4.1e-10, 3.9e-10, 4e-10], [2e-10, 2.1e-10, 1.9e-10, 2e-10])
    assert t.median_change == pytest.approx(0.5) and t.ratio == pytest.approx(0.5, rel=0.05)


def test_the_filter_matches_the_name_literally() -> None:
    assert ere_escape("BM_x<int>/8/real_time") == "BM_x<int>/8/real_time"
    assert ere_escape("BM_a.b*(c)") == "BM_a\\.b\\*\\(c\\)"
    assert ere_escape("null_sink_st (500_bytes c_str)") == "null_sink_st \\(500_bytes c_str\\)"


HAS_GBENCH = Path("/usr/include/benchmark/benchmark.h").is_file()
needs_gbench = pytest.mark.skipif(not HAS_GBENCH, reason="libbenchmark-dev not installed")

CMAKELISTS = """cmake_minimum_required(VERSION 3.16)
project(benchdemo CXX)
option(BENCHDEMO_BUILD_BENCHMARKS "build the benchmarks" OFF)
add_library(work STATIC work.cpp)
add_executable(unit unit.cpp)
target_link_libraries(unit work)
enable_testing()
add_test(NAME unit COMMAND unit)
if(BENCHDEMO_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
  add_executable(bench_work bench.cpp)
  target_link_libraries(bench_work work benchmark::benchmark)
endif()
"""
UNIT = """int checksum(int n);
int main() { return checksum(10) == 45 ? 0 : 1; }
"""
WORK_SLOW = """#include <cstdlib>
int checksum(int n) { int s = 0; for (int i = 0; i < n; ++i) s += i; return s; }
void boom() {}
long spin(int n) {
  volatile long acc = 0;
  for (int k = 0; k < 40; ++k)
    for (int i = 0; i < n; ++i) acc = acc + i;
  return acc / 40;
}
"""
# the speed-up: only the benchmarked function; BM_boom (through `boom`) starts crashing
WORK_FAST = (
    WORK_SLOW.replace("k < 40", "k < 1")
    .replace("acc / 40", "acc")
    .replace("boom() {}", "boom() { std::abort(); }")
)
BENCH = """#include <benchmark/benchmark.h>
long spin(int n);
void boom();
static void BM_spin(benchmark::State& st) { for (auto _ : st) benchmark::DoNotOptimize(spin(2000)); }
BENCHMARK(BM_spin);
static void BM_flat(benchmark::State& st) {
  for (auto _ : st) { long x = 0; for (int i = 0; i < 2000; ++i) benchmark::DoNotOptimize(x += i); }
}
BENCHMARK(BM_flat);
static void BM_boom(benchmark::State& st) { for (auto _ : st) boom(); }
BENCHMARK(BM_boom);
static void BM_needs_input(benchmark::State& st) { st.SkipWithError("no input file"); for (auto _ : st) {} }
BENCHMARK(BM_needs_input);
BENCHMARK_MAIN();
"""


def _bench_repo(root: Path) -> tuple[Path, str, str]:
    repo = root / "benchdemo"
    files = {"CMakeLists.txt": CMAKELISTS, "unit.cpp": UNIT, "work.cpp": WORK_SLOW}
    base = commit_files(repo, {**files, "bench.cpp": BENCH}, "base")
    fast = commit_files(repo, {"work.cpp": WORK_FAST}, "faster spin")  # the benchmark's source unchanged
    return repo, base, fast


def _settings(tmp_path: Path, **builder: object) -> Settings:
    return make_settings(
        tmp_path,
        builder={
            "benchmark_repetitions": 3,
            "benchmark_min_time": 0.01,
            "bootstrap_resamples": 400,
            "sample_floor": 0.0,
            "lease_dir": str(tmp_path / "leases"),
            **builder,
        },
    )


@needs_gbench
@pytest.mark.build
def test_the_file_api_finds_the_benchmark_executable(tmp_path: Path) -> None:
    repo, _base, _fast = _bench_repo(tmp_path)
    build = tmp_path / "build"
    write_query(build)
    subprocess.run(
        ["cmake", "-S", str(repo), "-B", str(build), "-DBENCHDEMO_BUILD_BENCHMARKS=ON"],
        check=True,
        capture_output=True,
    )
    found = benchmark_targets(build)
    assert [(t.target, t.executable, t.framework) for t in found] == [
        ("bench_work", "bench_work", "google-benchmark")
    ]  # `unit` links only `work`: not a benchmark


def _prove(repo: Path, sha: str, settings: Settings, tmp_path: Path) -> dict[str, Any]:
    built = build_patch(
        commit_for(repo, sha, "local/benchdemo"),
        repo,
        settings.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    return as_file(built.record)


@needs_gbench
@pytest.mark.build
@pytest.mark.slow
def test_a_speed_up_only_a_benchmark_shows_is_proven_by_the_benchmark(tmp_path: Path) -> None:
    repo, _base, fast = _bench_repo(tmp_path)
    settings = _settings(tmp_path)
    record = _prove(repo, fast, settings, tmp_path)
    ours = record["cppperf"]
    meta = to_struct(ours, InstanceMeta)  # the typed section reads it
    assert ours["verdict"] == "improved", ours.get("failure_detail")
    assert meta.proven_by == Oracle.BENCHMARK
    assert ours["improved_benchmarks"] == ["bench:bench_work/BM_spin"]
    assert record["tests"]["significant_improvements_tests"] == []  # no CTest test shows it
    assert [t["name"] for t in ours["tests"]] == ["unit"]
    stats = {b.name: b for b in meta.benchmarks}
    assert stats["bench:bench_work/BM_spin"].improved
    assert stats["bench:bench_work/BM_spin"].median_change > 0.5
    assert not stats["bench:bench_work/BM_flat"].improved  # the A/A control beside it
    assert not stats["bench:bench_work/BM_flat"].regressed
    assert [w.name for w in meta.benchmark_workloads] == [
        "bench:bench_work/BM_flat",
        "bench:bench_work/BM_spin",
    ]
    assert meta.repeats["bench:bench_work/BM_spin"] == 1  # its own timing: never repeated by the floor
    skipped = {s.name: s.reason for s in meta.benchmarks_skipped}
    assert skipped == {
        "bench:bench_work/BM_boom": BenchmarkSkip.CRASHED,
        "bench:bench_work/BM_needs_input": BenchmarkSkip.ERROR_REPORTED,
    }
    assert "-DBENCHDEMO_BUILD_BENCHMARKS=ON" in ours["build_steps"][0]["command"]
    samples = ours["samples"]["bench:bench_work/BM_spin"]
    assert len(samples["old_s"]) == len(samples["new_s"]) >= 5 and max(samples["new_s"]) < 1e-3

    # the evaluator scores a patch on the instance's benchmark: the expert's is opt, a comment is not
    settings = msgspec.structs.replace(
        settings,
        evaluator=msgspec.structs.replace(settings.evaluator, runs=8, runs_dir=str(tmp_path / "runs")),
    )
    block = validate_stored(ours["instance_id"], settings)
    assert block.gold.verdict == "opt", block
    assert block.gold.timed_benchmarks == ["bench:bench_work/BM_spin"]
    assert block.null.verdict == "correct", block
    assert block.oracle == Oracle.BENCHMARK and block.can_grade
    # an agent may not change the benchmark itself (its own sources, from the file API)
    from cppperf.services.evaluator.gold import null_patch
    from cppperf.services.evaluator.pipeline import EvalRequest, evaluate

    gamed = null_patch(BENCH, "bench.cpp").replace("+// cppperf validate", "+// faster")
    req = EvalRequest(run_id="gamed", model="m", instance_id=ours["instance_id"], patch=gamed)
    report = evaluate(req, settings)
    assert report["verdict"] == "test-edit" and "bench.cpp" in report["reason"], report
    # a patch that passes the tests but crashes the benchmark fails, it is not merely not faster
    crashing = WORK_SLOW.replace("volatile long acc = 0;", "volatile long acc = 0;\n  std::abort();")
    diff = difflib.unified_diff(
        WORK_SLOW.splitlines(keepends=True),
        crashing.splitlines(keepends=True),
        fromfile="a/work.cpp",
        tofile="b/work.cpp",
    )
    req = EvalRequest(run_id="crash", model="m", instance_id=ours["instance_id"], patch="".join(diff))
    report = evaluate(req, settings)
    assert report["verdict"] == "tests-failed", report
    assert "bench:bench_work/BM_spin" in report["reason"] and "crashed" in report["reason"]


@needs_gbench
@pytest.mark.build
@pytest.mark.slow
def test_an_unchanged_benchmark_is_not_improved(tmp_path: Path) -> None:
    """A/A: both sides the same commit, timed anyway: no benchmark (and no test) moves."""
    from cppperf.services.builder.instance import prove
    from cppperf.shared.engine.backends import make_backend

    repo, base, _fast = _bench_repo(tmp_path)
    settings = _settings(tmp_path, confirm=False)
    backend = make_backend(settings.builder, tmp_path / "work" / "aa", source=(repo, base, ""))
    try:
        res = prove(
            "local__benchdemo-aaaaaaaaaaaa",
            backend,
            settings.builder,
            sides={"old": base, "new": base},
            repo_path=repo,
            time_identical=True,
        )
    finally:
        backend.cleanup()
    assert res.verdict == "not-improved", res.failure_detail
    benches = [t for t in res.tests if t.name.startswith("bench:")]
    names = {"bench:bench_work/BM_flat", "bench:bench_work/BM_spin", "bench:bench_work/BM_boom"}
    assert {t.name for t in benches} == names  # BM_boom crashes only after the speed-up commit
    assert not any(t.improved or t.regressed for t in benches)
    assert res.improved_benchmarks == [] and res.regressed_benchmarks == []


GARBLING = """#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
static const bool garbled = [] {  // a benchmark's JSON breaks once timed (the probe: 1 repetition)
  std::ifstream in("/proc/self/cmdline");
  std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (cmd.find("--benchmark_repetitions=3") != std::string::npos) { std::puts("{ not json"); _exit(0); }
  return false;
}();
"""


@needs_gbench
@pytest.mark.build
@pytest.mark.slow
def test_a_benchmark_whose_output_breaks_while_timed_is_a_categorized_rejection(tmp_path: Path) -> None:
    repo = tmp_path / "garbled"
    files = {"CMakeLists.txt": CMAKELISTS, "unit.cpp": UNIT, "work.cpp": WORK_SLOW, "bench.cpp": BENCH}
    commit_files(repo, files, "base")
    sha = commit_files(repo, {"work.cpp": GARBLING + WORK_FAST}, "faster, but the JSON breaks")
    ours = _prove(repo, sha, _settings(tmp_path, confirm=False), tmp_path)["cppperf"]
    assert ours["verdict"] == "rejected"
    assert ours["failure_category"] == "test-failure"  # the new side only: the commit broke it
    assert "bench:bench_work/BM_" in ours["failure_detail"] and "malformed-output" in ours["failure_detail"]
    assert "Traceback" not in ours["failure_detail"]
    assert ours["proven_by"] is None


@pytest.mark.build
def test_benchmarks_that_cannot_build_are_left_off_not_the_instance(tmp_path: Path) -> None:
    """A benchmark switch needing what the host lacks: configured once more with it off, so the
    tests still build (before benchmarks, the tree built with the switch at its default)."""
    from cppperf.shared.engine.backends import make_backend

    cmake = CMAKELISTS.replace("find_package(benchmark REQUIRED)", "find_package(NoSuchBenchLib REQUIRED)")
    repo = tmp_path / "needs"
    sha = commit_files(repo, {"CMakeLists.txt": cmake, "unit.cpp": UNIT, "work.cpp": WORK_SLOW}, "base")
    settings = _settings(tmp_path)
    backend = make_backend(settings.builder, tmp_path / "work" / "needs", source=(repo, sha, ""))
    try:
        backend.prepare(repo, {"old": sha})
        steps = backend.build("old")
    finally:
        backend.cleanup()
    assert [(s.step, s.ok) for s in steps] == [("configure", False), ("configure", True), ("build", True)]
    assert "-DBENCHDEMO_BUILD_BENCHMARKS=ON" in steps[0].argv
    assert "-DBENCHDEMO_BUILD_BENCHMARKS=OFF" in steps[1].argv
    assert steps[1].log_path is not None and steps[1].log_path.name == "old-configure-no-benchmarks.log"


def test_the_oracle_names_the_kinds_of_workload_the_gold_patch_improved() -> None:
    from cppperf.services.evaluator.gold import oracle_of

    def score(improved: bool) -> PerTestScore:
        return PerTestScore(
            agent_speedup=1.5 if improved else 1.0,
            agent_ci=None,
            agent_improved=improved,
            agent_regressed=False,
            expert_speedup=1.5,
            expert_ci=None,
            expert_improved=True,
            median_ms={},
            agent_vs_expert_time_ratio=1.0,
            agent_vs_expert_ci=[1.0, 1.0],
            within_opt_fraction=True,
        )

    def gold(*improved: str) -> EvalReport:
        names = ["unit", "bench:b/BM_a", *improved]
        return EvalReport(
            verdict=EvalVerdict.OPT, opt=True, per_test={n: score(n in improved) for n in names}
        )

    null = EvalReport(verdict=EvalVerdict.CORRECT)
    assert oracle_of(gold("bench:b/BM_a"), null) == Oracle.BENCHMARK
    assert oracle_of(gold("unit"), null) == Oracle.CTEST
    assert oracle_of(gold("unit", "bench:b/BM_a"), null) == Oracle.BOTH
    opt = EvalReport(verdict=EvalVerdict.OPT, opt=True)
    assert oracle_of(opt, null) == Oracle.CTEST  # a report from before benchmarks
    assert oracle_of(gold("bench:b/BM_a"), opt) == Oracle.NONE
    assert Oracle.of(ctest=False, benchmark=False) == Oracle.NONE


def test_a_benchmark_broken_on_every_side_is_not_the_agents_tree() -> None:
    """The evaluator times only the expert's improved benchmarks: a target holding none of them
    is not listed; a target whose listing fails on every side (spdlog's `formatter-bench`, whose
    own `main` lists nothing) is the project's, so it does not fail the agent's tree — it did
    (`tests-failed: benchmark bench:formatter-bench/* on the agent's tree: list-failed`), while
    one that lists on the others and not on the agent's still does."""
    ran: list[str] = []

    def run_for(side: str, broken: set[str]) -> Any:
        def run(t: Case) -> RunResult:
            ran.append(f"{side}:{t.name}")
            if t.name in broken:
                return RunResult(0, 0.1, 0.1, "--benchmark_list_tests=true\n", False, False)  # its own main
            if "--benchmark_list_tests=true" in t.command:
                return RunResult(0, 0.1, 0.1, "BM_a\n", False, False)
            return RunResult(0, 0.1, 0.1, _gb_json(_it("BM_a", 10.0, 10.0)), False, False)

        return run

    sides = {"old": "/b/old", "expert": "/b/expert", "agent": "/b/agent"}
    targets = [BenchTarget(n, n, "google-benchmark") for n in ("lat", "fmt", "other")]
    s = BenchSettings(repetitions=3, min_time=0.01, timeout=10)
    everywhere = discover(
        targets,
        sides,
        {side: run_for(side, {"fmt"}) for side in sides},
        s,
        limit=5,
        only=["bench:lat/BM_a", "bench:fmt/BM_a"],
    )
    assert not any(r.endswith(":other") for r in ran)  # not wanted: never listed
    assert everywhere.common == ["bench:lat/BM_a"]
    assert {x.side for x in everywhere.skipped if x.reason == BenchmarkSkip.LIST_FAILED} == set(sides)
    assert broken_on(everywhere, "agent") == []
    agent_only = discover(
        targets,
        sides,
        {side: run_for(side, {"fmt"} if side == "agent" else set()) for side in sides},
        s,
        limit=5,
        only=["bench:lat/BM_a", "bench:fmt/BM_a"],
    )
    assert [(x.name, x.reason) for x in broken_on(agent_only, "agent")] == [
        ("bench:fmt/*", BenchmarkSkip.LIST_FAILED),
        ("bench:fmt/BM_a", BenchmarkSkip.ONE_SIDE_ONLY),
    ]


def test_a_limit_spreads_over_the_functions_and_data_readers_run_where_the_tests_do() -> None:
    """snappy: 12 inputs per benchmark function, more than `builder.max_benchmarks` in all, and
    each reads `testdata/<file>` relative to the source tree, where its CTest test runs. By name
    alone the limit kept only the first functions (all decompression) and every one of them
    crashed in the build tree ("testdata/html: No such file or directory"): none was timed.
    Now the limit takes some inputs of every function, and a benchmark that crashes in the build
    tree is probed once more in the tests' working directory and timed there; one that crashes
    there too is still skipped as crashed."""
    funcs = {"BM_UFlat": 12, "BM_ZFlat": 12, "BM_UValidate": 12, "BM_ZFlatAll": 1}
    names = [f"{f}/{i}" if n > 1 else f for f, n in funcs.items() for i in range(n)]

    def run_for(side: str) -> Any:
        def run(t: Case) -> RunResult:
            if "--benchmark_list_tests=true" in t.command:
                return RunResult(0, 0.1, 0.1, "\n".join(names) + "\n", False, False)
            bench = next(n for n in names if f"--benchmark_filter=^{ere_escape(n)}$" in t.command)
            if bench == "BM_UValidate/1" or (bench != "BM_ZFlatAll" and t.cwd != f"/src/{side}"):
                return RunResult(1, 0.1, 0.1, "testdata/html: No such file or directory\n", False, False)
            return RunResult(0, 0.1, 0.1, _gb_json(_it(bench, 10.0, 10.0)), False, False)

        return run

    sides = {"old": "/src/old/build", "new": "/src/new/build"}
    found = discover(
        [BenchTarget("snappy_benchmark", "snappy_benchmark", "google-benchmark")],
        sides,
        {side: run_for(side) for side in sides},
        BenchSettings(repetitions=3, min_time=0.01, timeout=10),
        limit=10,
        data_dirs={"old": "/src/old", "new": "/src/new"},
    )
    kept = {x.name for x in found.skipped if x.reason != BenchmarkSkip.OVER_LIMIT} | set(found.common)
    assert len(kept) == 10 and sum(x.reason == BenchmarkSkip.OVER_LIMIT for x in found.skipped) == 27
    assert {n.split("/")[1] for n in kept} == set(funcs)  # every function, not the first ones whole
    assert "bench:snappy_benchmark/BM_ZFlatAll" in found.common
    crashed = [x.name for x in found.skipped if x.reason == BenchmarkSkip.CRASHED]
    assert crashed == ["bench:snappy_benchmark/BM_UValidate/1"]
    assert len(found.common) == 9
    for side, root in sides.items():
        cwds = {n: t.cwd for n, t in found.by_side[side].items()}
        assert cwds.pop("bench:snappy_benchmark/BM_ZFlatAll") == root  # runs where it always did
        assert set(cwds.values()) == {f"/src/{side}"}  # the data readers: where the tests run


def _glued(name: str) -> str:
    """Google Benchmark 1.9's output, stdout and stderr in one stream, when `--benchmark_min_time`
    has no unit: its warning lands inside the JSON, with no newline after it (scnlib's 50
    benchmarks: none could be read)."""
    doc = _gb_json(_it(name, 10.0, 9.0))
    head, sep, rest = doc.partition('"benchmarks": [\n')
    warning = (
        "-- LOG(0): Value passed to --benchmark_min_time should have a suffix. Eg., `30s` for 30-seconds."
    )
    return head + sep + warning + rest


def test_the_librarys_own_warning_inside_the_json_is_read_past() -> None:
    real, cpu, n = parse_run(_glued("BM_a"), "BM_a")
    assert (real, cpu, n) == (pytest.approx(10.0e-9), pytest.approx(9.0e-9), 1)
    with pytest.raises(BenchOutputError) as err:  # anything else in the JSON is still no JSON
        parse_run(_glued("BM_a").replace("-- LOG(0): ", "garbage: "), "BM_a")
    assert err.value.reason == BenchmarkSkip.MALFORMED_OUTPUT and "ends: " in str(err.value)


@pytest.mark.parametrize("version", ["1.7", "1.9"])
def test_min_time_is_written_as_the_linked_library_takes_it(version: str) -> None:
    """1.8 and later want a unit in `--benchmark_min_time` and warn on stderr (inside the JSON)
    without one; 1.7 refuses the unit ("unrecognized command-line flag"). The listing tells them
    apart; every probe and timed run then writes the minimum time that library's way."""
    runs: list[list[str]] = []

    def run(t: Case) -> RunResult:
        runs.append(t.command)
        min_time = next((a.split("=", 1)[1] for a in t.command if a.startswith("--benchmark_min_time=")), "")
        if version == "1.7" and min_time.endswith("s"):
            return RunResult(
                1, 0.1, 0.1, "error: unrecognized command-line flag: --benchmark_min_time\n", False, False
            )
        if "--benchmark_list_tests=true" in t.command:
            return RunResult(0, 0.1, 0.1, "BM_a\n", False, False)
        out = _glued("BM_a") if min_time and not min_time.endswith("s") else _gb_json(_it("BM_a", 10.0, 9.0))
        return RunResult(0, 0.1, 0.1, out, False, False)

    found = discover(
        [BenchTarget("b", "b", "google-benchmark")],
        {"old": "/b/old"},
        {"old": run},
        BenchSettings(repetitions=3, min_time=0.25, timeout=10),
        limit=5,
    )
    assert found.common == ["bench:b/BM_a"] and found.skipped == []
    timed = found.by_side["old"]["bench:b/BM_a"].command
    assert ("--benchmark_min_time=0.25s" in timed) == (version == "1.9")
    assert ("--benchmark_min_time=0.25" in timed) == (version == "1.7")
    probes = [c for c in runs if "--benchmark_repetitions=1" in c]
    assert probes and all(("--benchmark_min_time=0.001s" in c) == (version == "1.9") for c in probes)
    assert as_sample("bench:b/BM_a", run(found.by_side["old"]["bench:b/BM_a"])).cpu_s == pytest.approx(9.0e-9)
