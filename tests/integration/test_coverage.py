"""Which tests run the change (`builder.coverage`): the diff's changed lines as new-side sites,
gcov's counts attributed per test, the deciding family and the A/A controls; on a real generated
project the test that calls the changed function decides alone, the one that does not is a
control and is not flagged; a project that does not build with --coverage falls back to every
test deciding, with the reason recorded; the evaluator times the deciding family."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from cppperf.demo import DemoRepo
from cppperf.services.builder.instance import prove
from cppperf.services.builder.service import build_patch
from cppperf.services.evaluator.instances import from_record
from cppperf.services.evaluator.pipeline import EvalRequest, evaluate
from cppperf.shared.domain import Coverage, InstanceMeta, decode_record, to_struct
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.engine.coverage import (
    Counts,
    Function,
    Hunk,
    changed_sites,
    family_from_counts,
    split_family,
)
from cppperf.shared.engine.stats import benjamini_hochberg
from tests.conftest import Proven, as_file, commit_for, make_settings, strict
from tests.e2e.test_cli import run_cli
from tests.gitrepo import commit_files

pytestmark = pytest.mark.stage2

DIFF = """\
diff --git a/src/a.cpp b/src/a.cpp
index 1111111..2222222 100644
--- a/src/a.cpp
+++ b/src/a.cpp
@@ -3 +3 @@ int f() {
-  return 1;
+  return 2;
@@ -10,2 +9,0 @@ void g() {
-  dead();
-  dead();
diff --git a/old.cpp b/old.cpp
deleted file mode 100644
index 3333333..0000000
--- a/old.cpp
+++ /dev/null
@@ -1 +0,0 @@
-int gone;
"""


def test_changed_sites_are_new_side_lines_and_deletion_anchors() -> None:
    sites = changed_sites(DIFF)
    assert list(sites) == ["src/a.cpp"]  # a deleted file has no new side
    assert sites["src/a.cpp"] == [Hunk(frozenset({3})), Hunk(frozenset(), frozenset({9, 10}))]
    assert changed_sites("not a diff at all") == {}


def _counts(lines: dict[int, int], g_runs: int = 0) -> Counts:
    c = Counts()
    c.lines = {("src/a.cpp", n): k for n, k in lines.items()}
    c.functions = {
        ("src/a.cpp", Function("f()", 1, 4)): lines.get(3, 0),
        ("src/a.cpp", Function("g()", 8, 11)): g_runs,
    }
    return c


def test_family_from_counts_attributes_lines_functions_and_failed_runs() -> None:
    hunks = changed_sites(DIFF)
    counts = {"calls_f": _counts({3: 5}), "calls_g": _counts({3: 0, 9: 1}, g_runs=1), "none": _counts({3: 0})}
    cov = family_from_counts(hunks, counts, {"crashed"}, ["calls_f", "calls_g", "crashed", "none"])
    assert cov.used and cov.reason == ""
    f, g, none = cov.tests["calls_f"], cov.tests["calls_g"], cov.tests["none"]
    assert (f.runs_change, f.lines_hit, f.lines_total, f.functions_hit) == (True, 1, 1, [])
    # the deletion's hunk has no instrumented line: the function around it (line 9 is not a
    # changed line, only its neighbour) says g() ran it
    assert g.runs_change and g.lines_hit == 0 and g.functions_hit == ["g()"]
    assert not none.runs_change
    assert cov.tests["crashed"].runs_change and not cov.tests["crashed"].ran  # kept in the family
    assert cov.deciding == ["calls_f", "calls_g", "crashed"] and cov.controls == ["none"]
    assert split_family(cov, ["calls_f", "none"]) == (["calls_f"], ["none"])
    nobody = family_from_counts(hunks, {"none": _counts({3: 0})}, set(), ["none"])
    assert not nobody.used and nobody.reason == "no test runs the change"
    assert split_family(nobody, ["none"]) == (["none"], [])  # fallback: every test decides


def test_split_cases_belong_to_their_ctest_test() -> None:
    cov = family_from_counts(
        changed_sites(DIFF), {"unit": _counts({3: 1}), "other": _counts({})}, set(), ["other", "unit"]
    )
    assert split_family(cov, ["other", "unit::A.one", "unit::B.two"]) == (
        ["unit::A.one", "unit::B.two"],
        ["other"],
    )


@pytest.mark.build
@pytest.mark.slow
def test_the_covering_test_decides_and_the_other_is_a_control(demo_repo: DemoRepo, tmp_path: Path) -> None:
    # 8 rounds: a lone test's family (2 hypotheses) can reach alpha from 4 samples a side
    s = make_settings(tmp_path, builder={"coverage": True, "runs": 8, "early_stop_min_rounds": 5})
    built = build_patch(
        commit_for(demo_repo.path, demo_repo.shas["perf"]),
        demo_repo.path,
        s.builder,
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "out",
    )
    meta = to_struct(as_file(built.record)["cppperf"], InstanceMeta)  # typed: the record's schema holds
    assert strict(as_file(built.record)["cppperf"], InstanceMeta) == meta  # every key declared (domain.py)
    cov = meta.coverage
    assert cov is not None and cov.used, cov
    assert cov.tests["spin"].runs_change and cov.tests["spin"].lines_hit >= 1
    assert not cov.tests["other"].runs_change and cov.tests["other"].lines_hit == 0
    assert cov.deciding == ["spin"] and cov.controls == ["other"]
    assert not cov.suspect and cov.moved_controls == {}  # the A/A control did not move
    assert meta.verdict == "improved" and as_file(built.record)["tests"][
        "significant_improvements_tests"
    ] == ["spin"]
    spin = next(t for t in meta.tests if t.name == "spin")
    # the correction ran over the deciding family only: spin's two one-sided hypotheses
    assert spin.p_improve_adj == pytest.approx(benjamini_hochberg([spin.p_improve, spin.p_regress])[0])
    other = next(t for t in meta.tests if t.name == "other")
    assert not (other.improved or other.regressed or other.paper_improved)  # a control never decides
    assert cov.build_log == "cov-build.log"
    assert (tmp_path / "out" / "logs" / meta.instance_id / cov.build_log).is_file()
    assert from_record(built.record).deciding_tests == ["spin"]  # what the evaluator times


NO_COVERAGE = """\
cmake_minimum_required(VERSION 3.16)
project(nocov CXX)
if(CMAKE_CXX_FLAGS MATCHES "coverage")
  message(FATAL_ERROR "this project refuses coverage builds")
endif()
enable_testing()
add_executable(t t.cpp)
add_test(NAME t COMMAND t)
"""


@pytest.mark.build
@pytest.mark.slow
def test_a_project_that_does_not_build_with_coverage_falls_back(tmp_path: Path) -> None:
    repo = tmp_path / "nocov"
    # ~60 ms a run: above builder.sample_floor, so a sample is one run (few sandboxed launches)
    src = "static volatile int sink;\nint main() {{ for (int i = 0; i < {n}; ++i) sink = i; return 0; }}\n"
    commit_files(repo, {"CMakeLists.txt": NO_COVERAGE, "t.cpp": src.format(n=60_000_000)}, "one")
    head = commit_files(repo, {"t.cpp": src.format(n=59_000_000)}, "two")
    proc = run_cli(
        "build", "--repo", str(repo), "--sha", head, "--name", "local/nocov", "--coverage", "--runs", "6",
        "--out", str(tmp_path / "out"), env={"CPPPERF_BUILDER_WORK_DIR": str(tmp_path / "work")}, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "coverage not used (every test decided): the new side does not configure" in proc.stdout
    record = json.loads(next((tmp_path / "out" / "instances").glob("local__nocov-*.json")).read_text())
    c = record["cppperf"]
    assert c["verdict"] != "rejected", c["failure_detail"]
    assert c["coverage"]["used"] is False
    assert "does not configure with --coverage" in c["coverage"]["reason"]
    assert "refuses coverage builds" in c["coverage"]["reason"]
    assert [t["name"] for t in c["tests"]] == ["t"]  # every test decided, as without coverage
    assert from_record(decode_record(record)).deciding_tests == []


def test_a_control_that_moves_makes_the_measurement_suspect() -> None:
    from cppperf.shared.domain import DecisionRule
    from cppperf.shared.engine.coverage import flag_controls
    from cppperf.shared.engine.stats import compare_all

    cov = family_from_counts(
        changed_sites(DIFF),
        {"f": _counts({3: 1}), "c1": _counts({}), "c2": _counts({})},
        set(),
        ["c1", "c2", "f"],
    )
    fast = [1.0 + 0.01 * i for i in range(10)]
    controls = compare_all(
        {"c1": (fast, [x * 0.5 for x in fast]), "c2": (fast, list(reversed(fast)))},
        alpha=0.05,
        min_improvement=0.05,
        resamples=200,
        seed=1,
    )
    flag_controls(cov, controls, rule=DecisionRule.OURS)
    assert cov.suspect and cov.moved_controls == {"c1": "improved"}


def test_the_host_follows_no_link_a_test_left_in_the_coverage_tree(tmp_path: Path) -> None:
    from cppperf.shared.engine.coverage import TreeChanged, _fresh, _place, _real

    host, outside = tmp_path / "cov", tmp_path / "outside.txt"
    outside.write_text("keep me")
    (host / "build").mkdir(parents=True)
    (host / "build" / "a.cpp.gcno").write_bytes(b"notes")
    counts = host / "g" / "0"
    counts.mkdir(parents=True)
    (counts / "a.cpp.gcno").symlink_to(outside)  # planted where the notes are copied
    assert _place(host / "build" / "a.cpp.gcno", counts / "a.cpp.gcno", host)
    assert outside.read_text() == "keep me" and (counts / "a.cpp.gcno").read_bytes() == b"notes"
    (host / "build" / "b.cpp.gcno").symlink_to(outside)  # notes that are a link: not read
    assert not _place(host / "build" / "b.cpp.gcno", counts / "b.cpp.gcno", host)
    (host / "h").symlink_to(tmp_path)  # a folder swapped for a link
    with pytest.raises(TreeChanged):
        _real(host, Path("h"))
    fresh = _fresh(host, Path("h"))
    assert fresh.is_dir() and not fresh.is_symlink() and outside.exists()


@pytest.mark.build
@pytest.mark.slow
def test_the_evaluator_times_the_tests_that_run_the_expert_change(
    proven: Callable[[str], Proven], tmp_path: Path
) -> None:
    """No improved test recorded (a `not-improved` proof, say): the deciding family is timed, not
    every test; the evaluator needs no coverage build of its own."""
    record = copy.deepcopy(proven("perf").record)
    record["tests"]["significant_improvements_tests"] = []
    record["cppperf"]["coverage"] = {"used": True, "deciding": ["spin"], "controls": ["other"]}
    s = make_settings(
        tmp_path, evaluator={"runs": 4, "runs_dir": str(tmp_path / "runs"), "test_timeout": 5.0}
    )
    iid = record["cppperf"]["instance_id"]
    dest = Path(s.out_dir) / "instances" / f"{iid}.json"
    dest.parent.mkdir(parents=True)
    dest.write_text(json.dumps(record))
    patch = record["commit_info"]["patch"][0]
    rep = evaluate(EvalRequest(run_id="t", model="expert", instance_id=iid, patch=patch), s)
    assert rep["tests"] == ["other", "spin"] and rep["timed_tests"] == ["spin"], rep.get("reason")


def test_every_instantiation_of_the_function_around_a_change_counts() -> None:
    def ran(name: str) -> Counts:
        c = Counts()
        c.functions = {("src/a.cpp", Function(n, 8, 11)): int(n == name) for n in ("g<int>()", "g<float>()")}
        return c

    cov = family_from_counts(
        {"src/a.cpp": [Hunk(frozenset(), frozenset({9}))]},
        {"i": ran("g<int>()"), "f": ran("g<float>()")},
        set(),
        ["f", "i"],
    )
    assert cov.deciding == ["f", "i"]
    assert cov.tests["f"].functions_hit == ["g<float>()"] and cov.tests["i"].functions_hit == ["g<int>()"]


def test_a_test_whose_build_inlined_the_change_away_is_not_a_control() -> None:
    """bvh@e5047b91: the changed traversal loop is `always_inline`, and gcc leaves inlined code
    no gcov line, even at -O0. The renderer tests ran the header (other lines counted) but their
    data has no line of the change; only a test that never reached the loop instruments it (count
    0). Such tests are not known not to run the change: they decide (`assumed`), the test with
    the change instrumented at 0 and a test that never ran the file are the controls."""
    hpp = "include/t.hpp"

    def counts(lines: dict[tuple[str, int], int]) -> Counts:
        c = Counts()
        c.lines = dict(lines)
        return c

    hunks = {hpp: [Hunk(frozenset({81, 82}))], "include/gone.hpp": [Hunk(frozenset({5}))]}
    data = {
        "render": counts({(hpp, 28): 1100, (hpp, 137): 1}),  # the loop inlined: no line 81/82
        "leaf": counts({(hpp, 51): 3, (hpp, 81): 0, (hpp, 82): 0}),  # instrumented, never reached
        "other": counts({("src/x.cpp", 3): 9}),  # never ran the header
        "idle": counts({(hpp, 28): 0}),  # instruments the file, runs none of it
    }
    cov = family_from_counts(hunks, data, set(), sorted(data))
    assert cov.used and cov.deciding == ["render"] and cov.controls == ["idle", "leaf", "other"]
    r = cov.tests["render"]
    assert r.runs_change and r.assumed and r.lines_hit == 0
    assert not cov.tests["leaf"].assumed and not cov.tests["other"].runs_change
    # a hunk no test instruments and no function encloses: whoever ran its file may run it
    lost = family_from_counts(
        {"include/gone.hpp": [Hunk(frozenset({5}))], hpp: [Hunk(frozenset({81}))]},
        {
            "hits": counts({(hpp, 81): 4}),
            "ran": counts({("include/gone.hpp", 9): 2, (hpp, 81): 0}),
            "not": counts({("src/x.cpp", 3): 1, (hpp, 81): 0}),
        },
        set(),
        ["hits", "not", "ran"],
    )
    assert lost.unmapped_hunks == 1
    assert lost.deciding == ["hits", "ran"] and lost.tests["ran"].assumed and lost.controls == ["not"]


@pytest.mark.build
@pytest.mark.slow
def test_a_recorded_coverage_decides_a_reproduction(demo_repo: DemoRepo, tmp_path: Path) -> None:
    """`reproduce` hands the record's coverage to `prove`: its family decides, nothing is rebuilt."""
    s = make_settings(tmp_path, builder={"runs": 6, "early_stop_min_rounds": 4, "confirm": False})
    backend = make_backend(s.builder, tmp_path / "ws")
    recorded = Coverage(used=True, deciding=["other"], controls=["spin"], suspect=True)
    sides = {"old": demo_repo.shas["base"], "new": demo_repo.shas["perf"]}
    res = prove("local__demo-x", backend, s.builder, sides=sides, repo_path=demo_repo.path, coverage=recorded)
    assert res.coverage is not None and res.coverage.deciding == ["other"]
    assert not (backend.logs / "cov-build.log").exists()  # no coverage build
    assert res.verdict == "not-improved"  # spin's 2x is a control's move, not the verdict
    assert res.coverage.suspect and res.coverage.moved_controls == {"spin": "improved"}
    assert recorded.moved_controls == {}  # the recorded struct is not changed
