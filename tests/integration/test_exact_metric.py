"""`builder.metric=cachegrind`: instructions counted by Valgrind's Cachegrind in the same jail and
limits, exact (a re-run gives the same count), decided on the count's relative change, with no
timing-core lease; the demo's perf commit is proven by it and its no-op commit is not."""

from __future__ import annotations

import json
import platform
from dataclasses import replace
from pathlib import Path

import pytest

from cppperf.demo import DemoRepo, create_demo_repo
from cppperf.shared.engine.protocol import check_metric
from cppperf.shared.engine.runner_script import cachegrind_ir, valgrind_unsupported
from cppperf.shared.engine.stats import compare_all, compare_exact
from cppperf.shared.errors import ConfigError
from cppperf.shared.settings import BuilderSettings
from tests.conftest import make_settings
from tests.integration.test_builder import prove

pytestmark = [
    pytest.mark.skipif(valgrind_unsupported() is not None, reason="valgrind not installed"),
    pytest.mark.stage2,
]


def test_cachegrind_files_are_summed_over_processes(tmp_path: Path) -> None:
    (tmp_path / "cachegrind.out.11").write_text("desc: x\ncmd: a\nevents: Ir\nfl=a.c\n1 5\nsummary: 1000\n")
    (tmp_path / "cachegrind.out.12").write_text("events: Ir I1mr ILmr\nsummary: 234 5 6\n")
    (tmp_path / "valgrind.11.log").write_text("summary: 99999\n")  # not a cachegrind file
    assert cachegrind_ir(str(tmp_path)) == 1234
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cachegrind_ir(str(empty)) is None


def test_exact_counts_are_decided_on_their_change() -> None:
    faster = compare_exact("t", [1000.0, 1000.0, 1000.0], [600.0, 600.0, 600.0], tolerance=0.001)
    assert faster is not None and faster.exact and faster.p_improve == 0.0 and faster.ci_high == 0.6
    assert compare_exact("t", [1000.0, 1100.0], [600.0, 600.0], tolerance=0.001) is None  # not exact
    decided = {
        t.name: t
        for t in compare_all(
            {
                "spin": ([1000.0] * 3, [600.0] * 3),  # 40 % fewer instructions
                "other": ([1000.0] * 3, [999.0] * 3),  # moved, but by 0.1 %: below the threshold
                "same": ([1000.0] * 3, [1000.0] * 3),
            },
            alpha=0.05,
            min_improvement=0.05,
            resamples=100,
            seed=1,
            exact=["spin", "other", "same"],
        )
    }
    assert decided["spin"].improved and decided["spin"].strict_improved and decided["spin"].paper_improved
    assert not decided["other"].improved and not decided["same"].improved
    assert not any(t.regressed for t in decided.values())


class _NoValgrind:
    def valgrind_unsupported(self) -> str:
        return "valgrind is not installed (apt-get install valgrind) in the env image x (docker backend)"

    def instructions_unsupported(self) -> str:
        return "no PMU"


def test_a_backend_without_valgrind_refuses_the_metric_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        check_metric(_NoValgrind(), BuilderSettings(metric="cachegrind"))  # type: ignore[arg-type]
    assert "\n" not in str(err.value) and "env image" in str(err.value)
    with pytest.raises(ConfigError, match="use cachegrind"):
        check_metric(_NoValgrind(), BuilderSettings(metric="instructions"))  # type: ignore[arg-type]


@pytest.mark.build
def test_the_demo_is_proven_on_exact_counts_without_a_lease(tmp_path: Path) -> None:
    demo = create_demo_repo(tmp_path / "demo", spin_iters=300_000, other_iters=200_000, extra_kinds=False)
    settings = make_settings(
        tmp_path, builder={"metric": "cachegrind", "lease_dir": str(tmp_path / "leases")}
    )
    records = {}
    for kind in ("perf", "noop"):
        records[kind] = prove(demo, kind, settings, tmp_path)  # the record as written to disk
    perf, noop = records["perf"]["cppperf"], records["noop"]["cppperf"]
    assert perf["verdict"] == "improved", perf["failure_detail"]
    assert noop["verdict"] == "not-improved", noop["failure_detail"]
    for rec in (perf, noop):
        assert rec["decided_on"] == {"spin": "cachegrind", "other": "cachegrind"}
        assert rec["rounds"] == 3 and rec["environment"]["leased_core"] is None
        assert rec["environment"]["lease_policy"] == "none"
        for s in rec["samples"].values():  # exact: every re-run of a side counted the same
            assert len(s["old_ir"]) == 3 and len(set(s["old_ir"])) == 1 and len(set(s["new_ir"])) == 1
            assert len(s["old_cpu_s"]) == 3  # cpu and wall recorded beside the count
        assert all(t["exact"] for t in rec["tests"])
    spin = next(t for t in perf["tests"] if t["name"] == "spin")
    assert 0.5 < spin["median_change"] < 0.75  # three passes down to one: about 2/3 fewer
    other = next(t for t in noop["tests"] if t["name"] == "other")
    assert abs(other["median_change"]) < 0.01 and not other["improved"]
    assert not (tmp_path / "leases" / "queue").exists() or not list((tmp_path / "leases" / "queue").iterdir())


def test_exact_settings_are_validated() -> None:
    from cppperf.shared.settings import load_settings

    assert load_settings(env={"CPPPERF_BUILDER_METRIC": "cachegrind"}).builder.metric == "cachegrind"
    with pytest.raises(ConfigError, match=r"builder\.exact_runs"):
        load_settings(env={"CPPPERF_BUILDER_EXACT_RUNS": "1"})
    with pytest.raises(ConfigError, match=r"builder\.lease_policy"):
        load_settings(env={"CPPPERF_BUILDER_LEASE_POLICY": "random"})


def test_the_runner_probe_says_whether_valgrind_runs(tmp_path: Path) -> None:
    """The docker backend asks the runner inside the container (`{"op": "probe"}`): without
    valgrind on PATH it says so, and that is the line the metric is refused with."""
    import subprocess
    import sys

    from cppperf.shared.engine.sandbox import RUNNER_PATH

    def probe(path: str) -> dict[str, str | None]:
        out = subprocess.run(
            [sys.executable, str(RUNNER_PATH), json.dumps({"op": "probe"})],
            capture_output=True,
            text=True,
            check=True,
            env={"PATH": path},
        ).stdout
        answer: dict[str, str | None] = json.loads(out)
        return answer

    assert probe("/usr/bin:/bin")["valgrind_unsupported"] is None
    assert "valgrind is not installed" in str(probe(str(tmp_path))["valgrind_unsupported"])


def test_counted_runs_go_on_every_core_with_a_longer_timeout() -> None:
    from cppperf.shared.engine.cmake import TestCase
    from cppperf.shared.engine.leases import core_plan, timing_core
    from cppperf.shared.engine.limits import limits_for

    s = BuilderSettings(metric="cachegrind", test_timeout=10)
    t = TestCase(name="t", command=["/bin/true"], cwd="/")
    counted = limits_for(t, s, counted=True)
    assert counted.valgrind and counted.cpu is None and counted.cpus == core_plan(s).all
    assert counted.timeout == 10 * s.valgrind_slowdown
    with timing_core(s) as cpu:  # no lease taken: an exact count needs no quiet core
        assert cpu is None


@pytest.mark.build
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_evaluator_grades_an_instance_proven_on_counts_by_counts(tmp_path: Path) -> None:
    """An instance proven under `builder.metric=cachegrind` is evaluated on Cachegrind's counts too
    (the evaluator's own `builder.metric` is the default, cpu): original, expert and agent counted,
    the verdict decided on the counts, no timing-core lease; the expert's patch is `opt`, the
    comment-only patch is not (gold validation), and each report says `cachegrind`."""
    from cppperf.services.evaluator.gold import validate_stored
    from cppperf.services.evaluator.instances import load_instance
    from cppperf.services.evaluator.pipeline import evaluation_metric

    demo = create_demo_repo(tmp_path / "demo", spin_iters=300_000, other_iters=200_000, extra_kinds=False)
    leases = str(tmp_path / "leases")
    proving = make_settings(tmp_path, builder={"metric": "cachegrind", "lease_dir": leases})
    record = prove(demo, "perf", proving, tmp_path)
    assert record["cppperf"]["verdict"] == "improved" and record["cppperf"]["metric"] == "cachegrind"
    iid = record["cppperf"]["instance_id"]
    grading = make_settings(
        tmp_path, builder={"lease_dir": leases}, evaluator={"runs_dir": str(tmp_path / "runs")}
    )
    assert grading.builder.metric == "cpu"
    block = validate_stored(iid, grading)
    assert block.gold.verdict == "opt" and block.gold.metric == "cachegrind", block
    assert block.null.verdict == "correct" and not block.null.opt and block.null.metric == "cachegrind", block
    assert block.oracle == "ctest" and block.can_grade
    for model in ("gold", "null"):
        report = json.loads((tmp_path / "runs" / "validate" / model / iid / "report.json").read_text())
        assert report["metric"] == "cachegrind" and report["leased_core"] is None
        assert report["rounds"] == proving.builder.exact_runs
        assert report["decided_on"] == dict.fromkeys(report["timed_tests"], "cachegrind")
        for sides in report["samples"].values():  # counts: whole, exact, far above any time in s
            for side in ("old", "agent", "expert"):
                counts = sides[side]
                assert counts and all(c == int(c) and c > 100_000 for c in counts), (side, counts)
                assert len(set(counts)) == 1, (side, counts)
            if model == "null":
                assert sides["agent"] == sides["old"]  # a comment changes no instruction
    queue = tmp_path / "leases" / "queue"
    assert not queue.exists() or not list(queue.iterdir())  # nobody waited for a timing core
    # `evaluator.metric` decides when set; unset, the instance's exact metric does
    inst = load_instance(iid, Path(grading.out_dir))
    assert evaluation_metric(grading, inst) == "cachegrind"
    told = make_settings(tmp_path, evaluator={"metric": "cpu"})
    assert evaluation_metric(told, inst) == "cpu"
    timed = make_settings(tmp_path)
    assert evaluation_metric(timed, replace(inst, metric="cpu")) == "cpu"


def test_estimated_cycles_are_the_standard_formula_over_every_process(tmp_path: Path) -> None:
    from cppperf.shared.engine.runner_script import cachegrind_counts, estimated_cycles

    events = "events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw\n"
    (tmp_path / "cachegrind.out.1").write_text(events + "summary: 1000 2 1 300 10 3 200 5 2\n")
    (tmp_path / "cachegrind.out.2").write_text(events + "summary: 500 1 1 100 4 0 50 1 0\n")
    counts = cachegrind_counts(str(tmp_path))
    assert counts is not None and counts["Ir"] == 1500 and counts["D1mr"] == 14
    # Ir + 10·(I1mr + D1mr + D1mw) + 100·(ILmr + DLmr + DLmw)
    assert estimated_cycles(counts) == 1500 + 10 * (3 + 14 + 6) + 100 * (2 + 3 + 2)
    assert estimated_cycles({"Ir": 1500}) is None  # --cache-sim=no: no misses, no estimate


def test_cache_sim_adds_estimated_cycles_beside_the_count_on_a_real_run(tmp_path: Path) -> None:
    """`builder.cachegrind_cache_sim`: Cachegrind simulates the caches (`--cache-sim=yes`) and each
    run has an estimated-cycles figure, at least its instruction count; off, there is none. The
    same through the runner the jail and the containers use."""
    import subprocess
    import sys

    from cppperf.shared.engine.cmake import TestCase
    from cppperf.shared.engine.limits import limits_for
    from cppperf.shared.engine.sandbox import RUNNER_PATH, Limits, run

    t = TestCase(name="t", command=["/bin/ls", "/"], cwd="/")
    on = limits_for(t, BuilderSettings(metric="cachegrind", cachegrind_cache_sim=True), counted=True)
    assert on.valgrind and on.cache_sim
    assert not limits_for(t, BuilderSettings(metric="cachegrind"), counted=True).cache_sim  # off by default
    simulated = run(
        ["/bin/ls", "/"], limits=Limits(timeout=120, valgrind=True, cache_sim=True), sandbox=False
    )
    assert simulated.ok and simulated.ir and simulated.est_cycles, simulated
    assert simulated.est_cycles >= simulated.ir
    counted = run(["/bin/ls", "/"], limits=Limits(timeout=120, valgrind=True), sandbox=False)
    assert counted.ok and counted.ir == simulated.ir and counted.est_cycles is None  # same count, exact
    req = {"op": "run", "argv": ["/bin/ls", "/"], "timeout": 120, "valgrind": True, "cache_sim": True}
    out = subprocess.run(
        [sys.executable, str(RUNNER_PATH), json.dumps(req)], capture_output=True, text=True, check=True
    ).stdout
    answer = json.loads(out)
    assert answer["returncode"] == 0 and answer["est_cycles"] >= answer["ir"] > 0


WIDE_TEST = """\
#include <immintrin.h>
#include <cstdio>

static volatile int seed = 3;

int main() {
  alignas(64) int out[16];
  __m512i a = _mm512_set1_epi32(seed);
  _mm512_store_si512(out, _mm512_add_epi32(a, a));  // AVX-512: Valgrind 3.19 cannot run it
  std::printf("wide: %d\\n", out[0]);
  return out[15] == 2 * seed ? 0 : 1;
}
"""


def _has_avx512f() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _demo_with_test(path: Path, name: str, source: str, flags: str, spin: int, other_: int) -> DemoRepo:
    """The demo project with one more test `name` (its source, built with `flags`) and its perf
    commit (spin() three passes down to one)."""
    from cppperf.demo import CMAKELISTS, CORE_H, core, other, tests_for

    demo = DemoRepo(path)
    demo.path.mkdir()
    demo.git("init", "-q", "-b", "main")
    cmake = CMAKELISTS + (
        f"add_executable(test_{name} tests/test_{name}.cpp)\n"
        + (f"target_compile_options(test_{name} PRIVATE {flags})\n" if flags else "")
        + f"add_test(NAME {name} COMMAND test_{name})\n"
    )
    files = {"CMakeLists.txt": cmake, "include/core.h": CORE_H, "src/core.cpp": core(3)}
    files |= {"src/other.cpp": other(), f"tests/test_{name}.cpp": source, **tests_for(spin, other_)}
    demo.commit("base", "Initial import", files, date="2019-06-01T10:00:00+00:00")
    demo.commit(
        "perf",
        "Speed up spin() by dropping redundant passes\n\nThe extra passes recomputed the same value.",
        {"src/core.cpp": core(1)},
        date="2024-01-10T10:00:00+00:00",
    )
    return demo


@pytest.mark.build
@pytest.mark.timeout(600)
@pytest.mark.skipif(not _has_avx512f(), reason="the CPU has no AVX-512F")
def test_a_project_valgrind_cannot_run_is_measured_on_cpu_instead(tmp_path: Path) -> None:
    """A test executing an AVX-512 instruction (what `-march=native` emits on such a host) dies of
    SIGILL under Valgrind 3.19: under `builder.metric=cachegrind` that is the metric's limit, not
    the project's: the instance is proven once more on CPU time, the record says `cpu`, both
    attempts are kept and `tried` says why."""
    demo = _demo_with_test(tmp_path / "wide", "wide", WIDE_TEST, "-mavx512f", 8_000_000, 3_000_000)
    settings = make_settings(
        tmp_path, builder={"metric": "cachegrind", "lease_dir": str(tmp_path / "leases")}
    )
    rec = prove(demo, "perf", settings, tmp_path)["cppperf"]
    assert rec["verdict"] in ("improved", "not-improved"), (rec["failure_detail"], rec["tried"])
    assert rec["metric"] == "cpu"
    assert set(rec["decided_on"].values()) == {"cpu"} and "wide" in rec["decided_on"]
    first, second = rec["attempts"]
    assert first["verdict"] == "rejected" and first["failure_step"] == "test"
    assert any("Valgrind cannot run this program" in line for line in first["failure_lines"]), first
    assert second["profile_change"] == "metric cpu" and second["verdict"] == rec["verdict"]
    fallback = [t for t in rec["tried"] if t.startswith("Valgrind cannot run this project's binaries")]
    assert len(fallback) == 1 and "unhandled instruction bytes: 0x62" in fallback[0]
    assert "in main (in " in fallback[0]  # where: the `at` frame of Valgrind's log
    assert fallback[0].endswith("): measured on cpu instead")


@pytest.mark.skipif(not _has_avx512f(), reason="the CPU has no AVX-512F")
def test_valgrind_s_unhandled_instruction_is_in_the_answer_and_the_output(tmp_path: Path) -> None:
    """The runner (the jail's and the containers') and the host's own path read Valgrind's log:
    an AVX-512 instruction is named in `valgrind_unhandled` and in one line of the output."""
    import shutil
    import subprocess
    import sys

    from cppperf.shared.engine.sandbox import RUNNER_PATH, Limits, run

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "wide.cpp").write_text(WIDE_TEST)
    wide = tmp_path / "wide"
    subprocess.run([cxx, "-O2", "-mavx512f", str(tmp_path / "wide.cpp"), "-o", str(wide)], check=True)
    subprocess.run([str(wide)], check=True, capture_output=True)  # natively it runs
    req = {"op": "run", "argv": [str(wide)], "timeout": 120, "valgrind": True}
    out = subprocess.run(
        [sys.executable, str(RUNNER_PATH), json.dumps(req)], capture_output=True, text=True, check=True
    ).stdout
    answer = json.loads(out)
    assert answer["returncode"] == -4  # SIGILL from Valgrind
    assert answer["valgrind_unhandled"].startswith("unhandled instruction bytes: 0x62 ")
    assert answer["valgrind_unhandled"].endswith(f"in main (in {wide})")
    assert answer["output"].endswith(
        f"cppperf: Valgrind cannot run this program: {answer['valgrind_unhandled']}\n"
    )
    host = run([str(wide)], limits=Limits(timeout=120, valgrind=True), sandbox=False)
    assert not host.ok and host.valgrind_unhandled == answer["valgrind_unhandled"]
    assert "Valgrind cannot run this program" in host.output
    clean = run(["/bin/true"], limits=Limits(timeout=120, valgrind=True), sandbox=False)
    assert clean.ok and clean.valgrind_unhandled is None and "Valgrind" not in clean.output


LONG_DOUBLE_TEST = """\
#include <cfloat>
#include <cstdio>

int main() {
  volatile long double one = 1.0L, eps = LDBL_EPSILON;  // x87: a 64-bit mantissa natively
  long double sum = one + eps;  // Valgrind computes x87 long double at 64 bits: sum == one there
  std::puts(sum == one ? "long double: 53-bit mantissa" : "long double: ok");
  return sum == one ? 1 : 0;
}
"""


@pytest.mark.build
@pytest.mark.timeout(600)
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x87 long double is an x86-64 matter")
def test_a_test_only_valgrind_fails_is_left_out_and_the_rest_proves(tmp_path: Path) -> None:
    """A test that fails under Valgrind on both sides and passes natively on both (long double
    arithmetic: Valgrind has no 80-bit x87) is the exact metric's limit: it is left out of the
    counted tests with why, the others decide, the instance is proven on counts, not rejected."""
    demo = _demo_with_test(tmp_path / "ld", "longdouble", LONG_DOUBLE_TEST, "", 300_000, 200_000)
    settings = make_settings(
        tmp_path, builder={"metric": "cachegrind", "lease_dir": str(tmp_path / "leases")}
    )
    rec = prove(demo, "perf", settings, tmp_path)["cppperf"]
    assert rec["verdict"] == "improved", (rec["failure_detail"], rec["tried"])
    assert rec["metric"] == "cachegrind" and len(rec["attempts"]) == 1
    assert list(rec["left_out"]) == ["longdouble"]
    assert "fails under Valgrind on both sides (exit 1)" in rec["left_out"]["longdouble"]
    assert rec["tried"] == [f"left longdouble out of the counted tests: {rec['left_out']['longdouble']}"]
    assert set(rec["decided_on"]) == {"spin", "other"} and set(rec["samples"]) == {"spin", "other"}
    assert "longdouble" in rec["compared_tests"]
    assert [t["name"] for t in rec["tests"] if t["improved"]] == ["spin"]
