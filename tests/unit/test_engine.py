"""The engine's interface: sides are data (commits or host trees, any names), `build_sides` stops
at the first failure, `limits_for` is the one place test limits come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cppperf.shared.engine.backend import LocalBackend, build_sides
from cppperf.shared.engine.cmake import BuildSpec, StepResult
from cppperf.shared.engine.cmake import TestCase as CTest
from cppperf.shared.engine.leases import core_plan
from cppperf.shared.engine.limits import limits_for
from cppperf.shared.engine.sandbox import RunResult
from cppperf.shared.settings import load_settings
from tests.gitrepo import commit_files


def test_sides_are_data_commits_and_host_trees(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    first = commit_files(repo, {"a.txt": "one\n"}, "one")
    second = commit_files(repo, {"a.txt": "two\n"}, "two")
    ws = tmp_path / "ws"
    patched = ws / "agent" / "src"  # a tree prepared in the workspace beforehand (the evaluator's)
    patched.mkdir(parents=True)
    (patched / "a.txt").write_text("patched\n")
    stale = ws / "stale"
    stale.mkdir()
    backend = LocalBackend(ws, BuildSpec(), {})
    backend.prepare(repo, {"old": first, "agent": patched, "expert": second})
    assert (ws / "old" / "src" / "a.txt").read_text() == "one\n"
    assert (ws / "agent" / "src" / "a.txt").read_text() == "patched\n"
    assert (ws / "expert" / "src" / "a.txt").read_text() == "two\n"
    assert not stale.exists() and (ws / "logs").is_dir()
    outside = tmp_path / "tree"
    outside.mkdir()
    (outside / "a.txt").write_text("copied\n")
    backend.prepare(repo, {"new": outside})
    assert (ws / "new" / "src" / "a.txt").read_text() == "copied\n" and not (ws / "old").exists()


class _Scripted:
    """A backend whose builds fail on the sides named in `failing`."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.built: list[str] = []

    def build(self, side: str) -> list[StepResult]:
        self.built.append(side)
        res = RunResult(1 if side in self.failing else 0, 0.1, 0.1, "boom", False, False)
        return [StepResult("configure", side not in self.failing, res)]


def test_build_sides_stops_at_the_first_failure() -> None:
    seen: list[tuple[str, int]] = []
    backend: Any = _Scripted({"agent"})
    failed = build_sides(
        backend, ["old", "agent", "expert"], on_built=lambda s, st: seen.append((s, len(st)))
    )
    assert failed is not None and failed.side == "agent" and not failed.step.ok
    assert backend.built == ["old", "agent"] and seen == [("old", 1), ("agent", 1)]
    assert build_sides(_Scripted(set()), ["old", "new"]) is None  # type: ignore[arg-type]


def test_limits_for_uses_the_ctest_timeout_first() -> None:
    s = load_settings(
        env={}, builder={"test_timeout": 100, "memory_limit_mb": 512, "max_processes": 64}
    ).builder
    own = CTest(name="t", command=["t"], cwd="/", timeout=10)
    none = CTest(name="u", command=["u"], cwd="/")
    assert limits_for(own, s).timeout == 10 and limits_for(own, s).cpu_seconds == 21
    assert limits_for(none, s).timeout == 100 and limits_for(none, s, timeout=7).timeout == 7
    lim = limits_for(none, s, cpu=0)  # a timed run: its leased core
    assert lim.memory_mb == 512 and lim.processes == 64 and (lim.cpu, lim.cpus) == (0, ())
    assert limits_for(none, s).cpus == core_plan(s).build  # untimed: the build cores
    off = load_settings(env={}, builder={"pin_cpu": False}).builder
    assert limits_for(none, off).cpus == ()


def test_a_parallel_build_over_the_memory_cap_is_a_resource_limit(tmp_path: Path) -> None:
    """Four build jobs of 150 MiB each: each under a per-process cap, together over the run's
    memory cgroup cap of 400 MiB — a `resource-limit` failure, not a compile error."""
    import pytest

    from cppperf.shared.domain import FailureCategory
    from cppperf.shared.engine.cgroups import hierarchy
    from cppperf.shared.engine.cmake import build, configure
    from cppperf.shared.engine.sandbox import INNER_PYTHON, Jail, hand_over, jail_available, jail_env

    if not jail_available() or hierarchy("memory") is None:
        pytest.skip("needs bubblewrap and a delegated memory cgroup")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "hog.py").write_text("import time\nx = b'x' * (150 << 20)\ntime.sleep(1)\n")
    targets = "\n".join(f"add_custom_target(hog{i} ALL COMMAND {INNER_PYTHON} /w/hog.py)" for i in range(4))
    (tree / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.13)\nproject(h NONE)\n{targets}\n"
    )
    hand_over(tree)
    inside = Path("/w")
    jail = Jail(rw=((tree, inside),))
    env = jail_env()

    def attempt(memory_mb: int) -> StepResult:
        spec = BuildSpec(jobs=4, memory_mb=memory_mb, processes=256)
        conf = configure(
            inside, inside / "b", spec, env=env, log=tmp_path / "c.log", mount=(tree, inside), jail=jail
        )
        assert conf.ok, conf.result.output
        return build(inside / "b", spec, env=env, log=tmp_path / "b.log", mount=(tree, inside), jail=jail)

    assert attempt(1536).ok
    over = attempt(400)
    assert not over.ok and over.category == FailureCategory.RESOURCE_LIMIT
    assert "memory limit of 400 MiB" in over.result.output


def test_untrusted_backends_are_hardened_or_refused(tmp_path: Path) -> None:
    """`make_backend(untrusted=True)` hands back a hardened backend; a backend `harden` does not
    know raises instead of running agents' code unhardened."""
    from cppperf.shared.engine.backends import harden, make_backend
    from cppperf.shared.errors import InfraFailure
    from cppperf.shared.settings import BuilderSettings

    local = make_backend(BuilderSettings(backend="local"), tmp_path / "ws", untrusted=True)
    assert isinstance(local, LocalBackend)
    assert local.readonly_tests and local.readonly_ccache == frozenset({"agent"})
    plain = make_backend(BuilderSettings(backend="local"), tmp_path / "ws2")
    assert isinstance(plain, LocalBackend) and not plain.readonly_tests

    class Unknown:  # satisfies nothing harden knows about
        pass

    with pytest.raises(InfraFailure, match="cannot harden"):
        harden(Unknown())  # type: ignore[arg-type]


def test_a_read_only_tree_lists_the_tests_of_a_project_that_includes_ctest(tmp_path: Path) -> None:
    """`include(CTest)` (bvh, and many CppPerf-DB projects) makes `ctest --show-only` write
    `Testing/Temporary/LastTest.log`; in the evaluator's read-only test jail that failed and the
    tree listed no tests (every gold patch `instance-broken`: "no test exists on all three
    sides"). A fresh tmpfs over `build/Testing` per run lets it list them, and nothing it writes
    there stays in the tree."""
    from cppperf.shared.engine.backends import make_backend
    from cppperf.shared.engine.sandbox import jail_available
    from cppperf.shared.settings import BuilderSettings

    if not jail_available():
        pytest.skip("needs bubblewrap")
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(p NONE)\ninclude(CTest)\n"
        "add_test(NAME listed COMMAND true)\n"
    )
    backend = make_backend(
        BuilderSettings(backend="local", benchmarks=False), tmp_path / "ws", untrusted=True
    )
    assert isinstance(backend, LocalBackend) and backend.readonly_tests and backend.jailed
    backend.prepare(tmp_path, {"old": src})
    steps = backend.build("old")
    assert steps[-1].ok, steps[-1].result.output
    testing = backend.side_dir("old") / "build" / "Testing"
    assert testing.is_dir()  # include(CTest) made it at configure: the mount point
    assert [t.name for t in backend.tests("old")] == ["listed"]
    assert backend.tests_json("old")
    assert not list(testing.rglob("LastTest*"))  # written into the run's tmpfs, not the tree


def test_a_read_only_tree_lets_a_test_write_into_its_own_working_directory(tmp_path: Path) -> None:
    """spdlog's tests create `test_logs/` in their working directory (the build tree's `tests/`);
    the evaluator's read-only test jail failed them, so spdlog's gold patch could never score.
    Each run now gets a writable view of the test's working directory: it may create files
    there, the build's own files stay read-only, and nothing it writes stays in the tree."""
    from cppperf.shared.engine.backends import make_backend
    from cppperf.shared.engine.sandbox import Limits, jail_available
    from cppperf.shared.settings import BuilderSettings

    if not jail_available():
        pytest.skip("needs bubblewrap")
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(p NONE)\nenable_testing()\nadd_subdirectory(tests)\n"
    )
    (src / "tests" / "CMakeLists.txt").write_text(
        'add_test(NAME logs COMMAND sh -c "mkdir test_logs && echo line > test_logs/a.txt && cat test_logs/a.txt")\n'
        'add_test(NAME tamper COMMAND sh -c "echo x >> CTestTestfile.cmake")\n'
    )
    backend = make_backend(
        BuilderSettings(backend="local", benchmarks=False), tmp_path / "ws", untrusted=True
    )
    assert isinstance(backend, LocalBackend) and backend.readonly_tests
    backend.prepare(tmp_path, {"old": src})
    assert backend.build("old")[-1].ok
    by_name = {t.name: t for t in backend.tests("old")}
    tests_dir = backend.side_dir("old") / "build" / "tests"
    before = (tests_dir / "CTestTestfile.cmake").read_text()
    limits = Limits(timeout=60, memory_mb=None)
    for _ in range(2):  # the second run starts without the first one's files
        res = backend.run_test("old", by_name["logs"], limits)
        assert res.ok and "line" in res.output, res.output
    assert not backend.run_test("old", by_name["tamper"], limits).ok
    assert not (tests_dir / "test_logs").exists()
    assert (tests_dir / "CTestTestfile.cmake").read_text() == before
