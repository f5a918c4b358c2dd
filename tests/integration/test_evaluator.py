"""The evaluator on a generated instance: the expert patch is `opt`; empty, malformed, unsafe and
test-editing patches are refused before anything runs; a breaking patch names the failing test; a
slower patch is correct without speed-up; an over-long patch is `too-large` and a host without a
jail refuses (`untrusted-refused`), both before anything is fetched; hostile code (fork bomb, infinite loop, network access,
huge output) is contained with the right verdict; finished reports are not recomputed; over the
bus, two evaluator workers share a predictions file and evaluate each instance once; correctness
runs are untimed, on the build cores, before the timing core is leased."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cppperf.demo import core
from cppperf.services.evaluator.instances import EvalInstance
from cppperf.services.evaluator.pipeline import EvalRequest, evaluate, run_dir, summarize
from cppperf.shared.domain import EvalReport
from cppperf.shared.engine.leases import core_plan
from cppperf.shared.settings import Settings
from tests.conftest import Proven, make_settings, strict
from tests.fakes import write_bare_instance

pytestmark = [pytest.mark.build, pytest.mark.stage2]


def core_patch(new_text: str, path: str = "src/core.cpp", old_text: str | None = None) -> str:
    old = core(3) if old_text is None else old_text
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def hostile_core(body: str, includes: str = "") -> str:
    """The base spin() (3 passes, correct result) with `body` run first."""
    return includes + core(3).replace("unsigned long long x = 0;", "unsigned long long x = 0;\n" + body)


@pytest.fixture(scope="module")
def instance_env(
    tmp_path_factory: pytest.TempPathFactory, proven: Callable[[str], Proven]
) -> tuple[Settings, str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("eval")
    settings = make_settings(tmp, evaluator={"runs": 8, "runs_dir": str(tmp / "runs"), "test_timeout": 5.0})
    perf = proven("perf")  # the session's proof (conftest), read from this module's own OUT
    perf.copy_to(Path(settings.out_dir))
    assert perf.record["cppperf"]["verdict"] == "improved"
    return settings, perf.record["cppperf"]["instance_id"], perf.record


def run(env: tuple[Settings, str, dict[str, Any]], patch: str, model: str) -> dict[str, Any]:
    settings, iid, _ = env
    rep = evaluate(EvalRequest(run_id="t", model=model, instance_id=iid, patch=patch), settings)
    strict(rep, EvalReport)  # every report is what the domain declares
    return rep


def test_expert_patch_is_opt(instance_env: Any) -> None:
    rep = run(instance_env, instance_env[2]["commit_info"]["patch"][0], "expert")
    assert rep["verdict"] == "opt", rep.get("reason")
    assert rep["applied_with"] == "git apply" and rep["tests_pass"]
    assert rep["gm_speedup_agent"] > 1.3 and rep["fraction_of_expert"] is not None
    assert rep["per_test"]["spin"]["agent_improved"] and rep["per_test"]["spin"]["within_opt_fraction"]
    out = Path(instance_env[0].evaluator.runs_dir) / "t" / "expert" / instance_env[1]
    assert {p.name for p in out.iterdir()} >= {"report.json", "patch.diff", "build.log", "test.log"}


def test_finished_report_is_not_recomputed(instance_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import cppperf.services.evaluator.pipeline as ev

    patch = instance_env[2]["commit_info"]["patch"][0]
    first = run(instance_env, patch, "again")

    def must_not_run(*_a: Any, **_k: Any) -> dict[str, Any]:
        raise AssertionError("a finished report was recomputed")

    monkeypatch.setattr(ev, "_evaluate", must_not_run)
    assert run(instance_env, patch, "again") == first


def test_slower_patch_is_correct_without_speedup(instance_env: Any) -> None:
    rep = run(instance_env, core_patch(core(4)), "slower")
    assert rep["verdict"] == "correct" and not rep["opt"]
    assert rep["gm_speedup_agent"] < 1.0 and rep["agent_regressed"]
    assert not rep["per_test"]["spin"]["within_opt_fraction"]


def test_breaking_patch_names_the_test(instance_env: Any) -> None:
    rep = run(instance_env, core_patch(core(1, bug=" ^ 1")), "broken")
    assert rep["verdict"] == "tests-failed"
    assert [f["test"] for f in rep["failing_tests"]] == ["spin"]
    assert "wrong result" in rep["failing_tests"][0]["output_tail"]


def _spy_runs(monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[int | None]]:
    """Every test run the evaluator makes (side, test, limits, the thread's cores, the lease held
    then) and every lease it takes."""
    import cppperf.services.evaluator.pipeline as ev
    from cppperf.shared.engine.backend import LocalBackend

    runs: list[dict[str, Any]] = []
    leases: list[int | None] = []
    held: list[int | None] = []
    real_core, real_run = ev.timing_core, LocalBackend.run_test

    @contextlib.contextmanager
    def spy_core(s: Any, phase: Any = None, **kw: Any) -> Iterator[int | None]:
        with real_core(s, phase, **kw) as cpu:
            leases.append(cpu)
            held.append(cpu)
            try:
                yield cpu
            finally:
                held.pop()

    def spy_run(self: LocalBackend, side: Any, test: Any, limits: Any) -> Any:
        runs.append(
            {
                "side": side,
                "test": test.name,
                "cpu": limits.cpu,
                "cpus": limits.cpus,
                "thread_cores": os.sched_getaffinity(0),
                "leased": bool(held),
            }
        )
        return real_run(self, side, test, limits)

    monkeypatch.setattr(ev, "timing_core", spy_core)
    monkeypatch.setattr(LocalBackend, "run_test", spy_run)
    return runs, leases


def test_correctness_runs_are_untimed_on_the_build_cores(
    instance_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only timed runs hold the timing-core lease: correctness runs come before it, on the build
    cores (so a second worker can time meanwhile), and a patch failing them never takes a core."""
    settings = instance_env[0]
    plan = core_plan(settings.builder)
    runs, leases = _spy_runs(monkeypatch)
    rep = run(instance_env, instance_env[2]["commit_info"]["patch"][0], "lease-spy")
    assert rep["verdict"] == "opt", rep.get("reason")
    assert len(leases) == 1 and leases[0] in plan.timing and rep["leased_core"] == leases[0]
    untimed = [r for r in runs if not r["leased"]]
    assert sorted(r["test"] for r in untimed) == sorted(rep["tests"])  # each test checked once
    assert all(r["side"] == "agent" and r["cpu"] is None for r in untimed)
    assert all(r["cpus"] == plan.build and r["thread_cores"] == set(plan.build) for r in untimed)
    timed = [r for r in runs if r["leased"]]
    assert {r["side"] for r in timed} == {"old", "agent", "expert"}
    assert all(r["cpu"] == leases[0] for r in timed)
    assert runs.index(timed[0]) > max(runs.index(r) for r in untimed)  # checked before timing

    runs.clear()
    rep = run(instance_env, core_patch(core(1, bug=" ^ 1")), "lease-spy-broken")
    assert rep["verdict"] == "tests-failed" and len(leases) == 1  # no new lease
    assert runs and not any(r["leased"] for r in runs)


@pytest.mark.parametrize(
    ("patch", "verdict", "reason"),
    [
        ("", "empty-patch", "empty"),
        ("make it faster please\n", "malformed-patch", "not a unified diff"),
        (
            "diff --git a/../../x b/../../x\n--- a/../../x\n+++ b/../../x\n@@ -0,0 +1 @@\n+pwned\n",
            "unsafe-patch",
            "escapes",
        ),
        ("--- /dev/null\n+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+echo pwned\n", "unsafe-patch", ".git"),
        (
            "diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+/etc/passwd\n",
            "unsafe-patch",
            "symlink",
        ),
        (
            "diff --git a/tests/test_spin.cpp b/tests/test_spin.cpp\n--- a/tests/test_spin.cpp\n"
            '+++ b/tests/test_spin.cpp\n@@ -1 +1 @@\n-#include "core.h"\n+#include "core.h" // x\n',
            "test-edit",
            "test file",
        ),
        (
            "--- a/CMakeLists.txt\n+++ b/CMakeLists.txt\n@@ -9 +9 @@\n-add_test(NAME spin COMMAND test_spin)\n"
            "+add_test(NAME spin COMMAND true)\n",
            "test-edit",
            "CMake test definition",
        ),
    ],
    ids=["empty", "malformed", "path-escape", "dot-git", "symlink", "test-file", "cmake-test"],
)
def test_bad_patches_are_refused_before_running(
    instance_env: Any, patch: str, verdict: str, reason: str
) -> None:
    rep = run(instance_env, patch, f"bad-{verdict}-{reason[:4]}")
    assert rep["verdict"] == verdict and reason in rep["reason"]
    assert not rep.get("applied") and "tests_pass" not in rep


def _unbuilt(tmp_path: Path, **evaluator: object) -> tuple[Settings, EvalInstance]:
    """An instance nothing was built for: refusals decided before any tree exists."""
    settings = make_settings(tmp_path, evaluator={"runs_dir": str(tmp_path / "runs"), **evaluator})
    inst = EvalInstance(
        "o__n-0123456789ab", "o/n", "file:///nowhere", "a" * 40, "b" * 40, "", files=["src/core.cpp"]
    )
    return settings, inst


def test_an_agents_request_grades_only_a_proven_instance(tmp_path: Path) -> None:
    """`for_agent` (every agent's request over the bus): an instance that is not proven improved,
    or whose verdict is unknown, is `instance-broken` before anything is built; the CLI's request
    (no `for_agent`) and a proven instance go on to the patch checks."""
    settings, inst = _unbuilt(tmp_path, max_patch_bytes=200)
    big = core_patch(core(1) + "// " + "x" * 300 + "\n")
    for verdict in ("not-improved", "rejected", ""):
        inst = dataclasses.replace(inst, verdict=verdict)
        rep = evaluate(
            EvalRequest("t", f"a{verdict}", inst.instance_id, big, for_agent=True), settings, instance=inst
        )
        assert rep["verdict"] == "instance-broken" and "not proven improved" in rep["reason"], rep
    assert (
        evaluate(EvalRequest("t", "cli", inst.instance_id, big), settings, instance=inst)["verdict"]
        == "too-large"
    )
    inst = dataclasses.replace(inst, verdict="improved")
    rep = evaluate(EvalRequest("t", "ok", inst.instance_id, big, for_agent=True), settings, instance=inst)
    assert rep["verdict"] == "too-large"


def test_an_agent_is_told_an_instance_is_unknown_without_this_hosts_paths(tmp_path: Path) -> None:
    settings, inst = _unbuilt(tmp_path)
    bad = Path(settings.out_dir) / "instances" / "o__n-0123456789ab.json"
    bad.parent.mkdir(parents=True)
    for state in ("absent", "unreadable"):
        if state == "unreadable":
            bad.write_text("{not json")
        agent = evaluate(EvalRequest("t", "a", inst.instance_id, "p", for_agent=True), settings)
        assert agent["verdict"] == "unknown-instance" and str(tmp_path) not in agent["reason"], agent
        assert "no readable record" in agent["reason"]
        cli = evaluate(EvalRequest("t", "c", inst.instance_id, "p"), settings)  # the CLI's user: the path
        assert cli["verdict"] == "unknown-instance" and str(bad) in cli["reason"], cli


def test_an_over_long_patch_is_too_large(tmp_path: Path) -> None:
    settings, inst = _unbuilt(tmp_path, max_patch_bytes=200)
    patch = core_patch(core(1) + "// " + "x" * 300 + "\n")
    rep = evaluate(EvalRequest("t", "big", inst.instance_id, patch), settings, instance=inst)
    assert rep["verdict"] == "too-large" and "limit 200" in rep["reason"] and not rep["applied"]


def test_no_jail_is_untrusted_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cppperf.services.evaluator.pipeline as ev

    monkeypatch.setattr(ev, "jail_problem", lambda: "bwrap: not installed")  # a host without the jail
    settings, inst = _unbuilt(tmp_path)
    rep = evaluate(EvalRequest("t", "nojail", inst.instance_id, core_patch(core(1))), settings, instance=inst)
    assert rep["verdict"] == "untrusted-refused" and "bwrap: not installed" in rep["reason"]
    assert "applied" not in rep and not (tmp_path / "mirrors").exists()  # nothing fetched, nothing ran


def test_patch_that_does_not_apply(instance_env: Any) -> None:
    rep = run(instance_env, core_patch(core(1), old_text=core(7).replace("x = 0", "y = 0")), "stale")
    assert rep["verdict"] == "apply-failed" and "git apply --recount" in rep["apply_log"]


def test_evaluation_workspaces_are_removed_unless_keep_failed(
    instance_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """work_dir/eval/<hash> goes after each evaluation, whatever the backend's own cleanup
    removes (docker's: the container and its volume, not the host folder: a no-op here);
    `evaluator.keep_failed` keeps a failed one for debugging."""
    from cppperf.shared.engine.backend import LocalBackend

    monkeypatch.setattr(LocalBackend, "cleanup", lambda self: None)
    settings, iid, _ = instance_env
    stale = core_patch(core(1), old_text=core(7).replace("x = 0", "y = 0"))
    eval_dir = settings.work_dir() / "eval"
    rep = evaluate(EvalRequest(run_id="ws", model="stale", instance_id=iid, patch=stale), settings)
    assert rep["verdict"] == "apply-failed"
    assert eval_dir.is_dir() and not list(eval_dir.iterdir())
    debug = msgspec.structs.replace(
        settings, evaluator=msgspec.structs.replace(settings.evaluator, keep_failed=True)
    )
    rep = evaluate(EvalRequest(run_id="ws", model="stale-kept", instance_id=iid, patch=stale), debug)
    assert rep["verdict"] == "apply-failed"
    (kept,) = eval_dir.iterdir()
    assert (kept / "patch" / "agent.patch").read_text() == stale
    shutil.rmtree(kept)


def test_compile_error_patch(instance_env: Any) -> None:
    rep = run(instance_env, core_patch(core(1).replace("return x", "return y")), "typo")
    assert rep["verdict"] == "build-failed" and rep["applied_with"] == "git apply"


def test_infinite_loop_times_out(instance_env: Any) -> None:
    rep = run(instance_env, core_patch(hostile_core("for (;;) { sink = sink + 1; }")), "loop")
    assert rep["verdict"] == "timeout" and rep["failing_tests"][0]["test"] == "spin"


def test_fork_bomb_is_contained(instance_env: Any) -> None:
    from cppperf.shared.engine.cgroups import hierarchy

    if hierarchy("pids") is None and os.geteuid() == 0:
        pytest.skip("no writable pids cgroup and running as root")
    rep = run(instance_env, core_patch(hostile_core("for (;;) fork();", "#include <unistd.h>\n")), "bomb")
    assert rep["verdict"] in ("timeout", "tests-failed")
    ps = subprocess.run(["ps", "-eo", "stat=,comm="], capture_output=True, text=True, check=True).stdout
    alive = [ln for ln in ps.splitlines() if ln.split()[-1] == "test_spin" and not ln.startswith("Z")]
    assert alive == []  # killed (zombies waiting for init to reap them are dead)


def test_network_access_fails_inside(instance_env: Any) -> None:
    net = (
        "{ int fd = socket(AF_INET, SOCK_STREAM, 0); sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(80);"
        " a.sin_addr.s_addr = htonl(0x01010101); if (connect(fd, (sockaddr*)&a, sizeof a) != 0) return 0; }"
    )
    inc = "#include <sys/socket.h>\n#include <netinet/in.h>\n#include <arpa/inet.h>\n"
    rep = run(instance_env, core_patch(hostile_core(net, inc)), "net")
    assert rep["verdict"] == "tests-failed" and rep["failing_tests"][0]["test"] == "spin"


def test_huge_output_is_bounded(instance_env: Any) -> None:
    spam = 'for (int i = 0; i < 400000; ++i) std::puts("spam spam spam spam spam spam spam spam spam");'
    rep = run(instance_env, core_patch(hostile_core(spam, "#include <cstdio>\n")), "spam")
    assert rep["verdict"] in ("correct", "opt") and rep["tests_pass"]
    log = Path(instance_env[0].evaluator.runs_dir) / "t" / "spam" / instance_env[1] / "test.log"
    assert log.stat().st_size < 300_000 and "bytes dropped" in log.read_text()


def test_summary_splits_single_and_multi_file(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, evaluator={"runs_dir": str(tmp_path / "runs")})
    root = tmp_path / "runs" / "t" / "m"
    reports = {
        "a": {
            "verdict": "opt",
            "opt": True,
            "multi_file": False,
            "applied": True,
            "builds": True,
            "tests_pass": True,
        },
        "b": {
            "verdict": "correct",
            "opt": False,
            "multi_file": True,
            "applied": True,
            "builds": True,
            "tests_pass": True,
        },
        "c": {"verdict": "build-failed", "opt": False, "multi_file": True, "applied": True, "builds": False},
        "d": {"verdict": "empty-patch", "opt": False, "multi_file": False},
    }
    for iid, rep in reports.items():
        (root / iid).mkdir(parents=True)
        (root / iid / "report.json").write_text(json.dumps(rep))
    sm = msgspec.to_builtins(summarize(settings, "t", "m"))  # as the summary file holds it
    assert sm["overall"] == {
        "instances": 4,
        "verdicts": {"opt": 1, "correct": 1, "build-failed": 1, "empty-patch": 1},
        "applied": 3,
        "builds": 2,
        "tests_pass": 2,
        "opt": 1,
        "opt_rate": 0.25,
    }
    assert (sm["single_file"]["instances"], sm["single_file"]["opt"]) == (2, 1)
    assert (sm["multi_file"]["instances"], sm["multi_file"]["opt"]) == (2, 0)
    assert json.loads((tmp_path / "runs" / "t" / "m.summary.json").read_text()) == sm


@pytest.mark.nats
@pytest.mark.slow
@pytest.mark.timeout(900)  # three instances built (unless earlier tests did), then six trees per evaluation
def test_predictions_over_the_bus_with_two_workers(
    nats_server: Any, proven: Callable[[str], Proven], tmp_path: Path
) -> None:
    settings = make_settings(tmp_path)
    ids = []
    for kind in ("perf", "noop", "regression"):  # the session's proofs (conftest), in this OUT
        b = proven(kind)
        b.copy_to(Path(settings.out_dir))
        ids.append((b.record["cppperf"]["instance_id"], b.record["commit_info"]["patch"][0]))
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        "\n".join(
            json.dumps({"instance_id": i, "model_name_or_path": "agent-x", "model_patch": p}) for i, p in ids
        )
    )
    run_id = f"bus-{os.getpid()}-{time.time_ns()}"
    env = {
        **os.environ,
        "CPPPERF_NATS_URL": nats_server.url,
        "CPPPERF_OUT_DIR": settings.out_dir,
        "CPPPERF_EVALUATOR_RUNS_DIR": str(tmp_path / "worker-runs"),
        "CPPPERF_EVALUATOR_RUNS": "5",
        "CPPPERF_BUILDER_WORK_DIR": str(tmp_path / "work"),
        "CPPPERF_BUS_ACK_WAIT": "10",
        "CPPPERF_BUS_STOP_GRACE": "5",
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "cppperf", "serve", "evaluator"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "cppperf",
                "evaluate",
                "--predictions",
                str(preds),
                "--run-id",
                run_id,
                "--json",
            ],
            env={**env, "CPPPERF_EVALUATOR_RUNS_DIR": str(tmp_path / "cli-runs")},
            capture_output=True,
            text=True,
            timeout=780,
            check=False,
        )
    finally:
        for w in workers:
            w.terminate()
        logs = [w.communicate(timeout=60)[1] for w in workers]
    assert cli.returncode == 0, cli.stderr[-3000:]
    result = json.loads(cli.stdout)
    by_id = {r["instance_id"]: r for r in result["reports"]}
    assert sorted(by_id) == sorted(i for i, _ in ids)
    (perf, _), *unproven = ids
    assert by_id[perf]["tests_pass"]
    # the CLI over the bus is an agent, and an agent is graded only on proven instances: the noop
    # and regression records are answered `instance-broken`, nothing built (README: cannot grade)
    for iid, _ in unproven:
        assert by_id[iid]["verdict"] == "instance-broken" and "not proven" in by_id[iid]["reason"]
        assert "tests_pass" not in by_id[iid]
    # an open bus has one agent, `local`: its runs are keyed under it (README: agents on the bus)
    done = sorted((tmp_path / "worker-runs" / f"local.{run_id}" / "agent-x").glob("*/report.json"))
    assert len(done) == 3  # each request answered exactly once across the two workers
    handled = sum(log.decode().count('"event": "handled"') for log in logs)
    assert handled == 3  # every request handled exactly once
    assert (tmp_path / "cli-runs" / run_id / "agent-x.summary.json").is_file()


def test_run_report_is_swebench_shaped_with_id_lists_and_opt(tmp_path: Path) -> None:
    from cppperf.services.evaluator.runreport import SCHEMA_VERSION, RunReport, build_run_report, report_path

    settings = make_settings(tmp_path)
    root = settings.runs_path() / "t" / "m"
    assert root == tmp_path / "out" / "runs" / "t" / "m"  # under --out, not the current folder
    reports = {
        "a": {"verdict": "opt", "opt": True, "gm_speedup_agent": 2.0, "gm_speedup_expert": 2.0},
        "b": {"verdict": "correct", "multi_file": True, "gm_speedup_agent": 1.0, "gm_speedup_expert": 2.0},
        "c": {"verdict": "build-failed"},
        "d": {"verdict": "empty-patch"},
        "e": {"verdict": "instance-broken"},
    }
    for iid, rep in reports.items():
        (root / iid).mkdir(parents=True)
        (root / iid / "report.json").write_text(json.dumps(rep))
    rr = build_run_report(settings, "t", "m", submitted=[*reports, "f"], unknown=["g"])
    assert rr.schema_version == SCHEMA_VERSION
    assert (rr.submitted_instances, rr.completed_instances, rr.resolved_instances) == (7, 3, 1)
    assert (rr.unresolved_instances, rr.empty_patch_instances, rr.error_instances) == (2, 1, 2)
    assert rr.resolved_ids == ["a"] and rr.unresolved_ids == ["b", "c"] and rr.empty_patch_ids == ["d"]
    assert rr.error_ids == ["e", "g"] and rr.incomplete_ids == ["f"]  # an unknown id is counted
    assert (rr.opt.opt, rr.opt.instances, rr.opt_multi_file.instances) == (1, 3, 1)
    assert rr.speedups.instances == 2 and rr.speedups.gm_speedup_agent == pytest.approx(1.4142, abs=1e-3)
    path = report_path(settings, "t", "m")
    assert path == tmp_path / "out" / "runs" / "t" / "m.t.json"
    assert msgspec.json.decode(path.read_bytes(), type=RunReport) == rr  # the file matches its schema


def test_gold_and_empty_predictions_cover_every_proven_instance(tmp_path: Path) -> None:
    from cppperf.cli.predictions import pseudo_predictions

    out = tmp_path / "out"
    write_bare_instance(out)
    write_bare_instance(out, "o__r-bbbbbbbbbbbb", verdict="rejected")  # no instance to grade
    write_bare_instance(out, "o__r-cccccccccccc", verdict="not-improved")
    [gold] = pseudo_predictions(out, "gold", None)
    assert gold == {
        "instance_id": "o__r-aaaaaaaaaaaa",
        "model_name_or_path": "gold",
        "model_patch": "diff --git a/x b/x\n",
    }
    empty = pseudo_predictions(out, "empty", {"o__r-aaaaaaaaaaaa", "o__r-bbbbbbbbbbbb", "x__y-000000000000"})
    assert [(r["instance_id"], r["model_patch"]) for r in empty] == [  # named: kept, proven or not
        ("o__r-aaaaaaaaaaaa", ""),
        ("o__r-bbbbbbbbbbbb", ""),
        ("x__y-000000000000", ""),
    ]


def test_an_original_that_no_longer_builds_is_instance_broken(tmp_path: Path) -> None:
    """A real instance (a generated repository proven by the builder) whose original side does not
    build when the evaluator runs it (here: its build needs longer than this evaluator's
    `builder.build_timeout`) is `instance-broken`, never the agent's `build-failed`; so is one
    whose expert side does not build, without its compiler's output in the reason."""
    from cppperf.services.builder.service import build_patch
    from tests.conftest import commit_for
    from tests.gitrepo import commit_files

    repo = tmp_path / "slowbuild"
    cmake = (
        "cmake_minimum_required(VERSION 3.16)\nproject(s CXX)\nenable_testing()\n"
        "add_executable(t t.cpp)\nadd_test(NAME t COMMAND t)\n"
        'add_custom_target(generate ALL COMMAND sh -c "sleep 4")\n'  # a slow generator step
    )
    commit_files(repo, {"CMakeLists.txt": cmake, "t.cpp": "int main() { return 0; }\n"}, "one")
    head = commit_files(repo, {"t.cpp": "int main() { return 0; } // faster\n"}, "two")
    proving = make_settings(tmp_path / "prove", builder={"runs": 4})
    built = build_patch(
        commit_for(repo, head, "local/slowbuild"),
        repo,
        proving.builder,
        work_dir=tmp_path / "prove-work",
        out_dir=Path(proving.out_dir),
    )
    assert built.record.cppperf.verdict != "rejected", built.record.cppperf.failure_detail
    iid = built.record.cppperf.instance_id
    here = make_settings(
        tmp_path, builder={"build_timeout": 2.0}, evaluator={"runs_dir": str(tmp_path / "runs")}
    )
    (Path(here.out_dir) / "instances").mkdir(parents=True)
    shutil.copy(built.path, Path(here.out_dir) / "instances" / f"{iid}.json")
    assert built.record.commit_info.patch
    patch = built.record.commit_info.patch[0]  # the expert's own patch: nothing wrong with it
    rep = evaluate(EvalRequest(run_id="t", model="broken-original", instance_id=iid, patch=patch), here)
    strict(rep, EvalReport)
    assert rep["verdict"] == "instance-broken", rep.get("reason")
    assert rep["reason"].startswith("the old side does not build"), rep["reason"]
    # an expert side that does not build is instance-broken too, and its compiler's output (which
    # can quote the expert's change) is not in the reason an agent reads: only in build.log
    secret = commit_files(repo, {"t.cpp": "int main() { return EXPERT_ONLY_42; }\n"}, "three")
    record = json.loads(built.path.read_text())
    record["commit_info"]["new_sha"] = secret
    there = make_settings(tmp_path / "there", evaluator={"runs_dir": str(tmp_path / "runs-there")})
    (Path(there.out_dir) / "instances").mkdir(parents=True)
    (Path(there.out_dir) / "instances" / f"{iid}.json").write_text(json.dumps(record))
    req = EvalRequest(run_id="t", model="broken-expert", instance_id=iid, patch=patch)
    rep = evaluate(req, there)
    assert rep["verdict"] == "instance-broken", rep.get("reason")
    assert rep["reason"].startswith("the expert side does not build (build failed"), rep["reason"]
    assert "EXPERT_ONLY_42" not in json.dumps(rep)
    assert "EXPERT_ONLY_42" in (run_dir(there, req) / "build.log").read_text()  # the operator's


def test_a_finished_report_is_read_back_as_its_struct_and_reused_for_its_patch(tmp_path: Path) -> None:
    """The cache goes through `EvalReport`: the same patch gets the stored report back (nothing is
    built: the instance does not even exist); a report.json that is not a report is evaluated
    again (here: `unknown-instance`), never returned as it stands."""
    from cppperf.services.evaluator.pipeline import evaluate_report, patch_sha256, read_report

    settings = make_settings(tmp_path)
    req = EvalRequest(run_id="c", model="m", instance_id="o__r-aaaaaaaaaaaa", patch="p")
    path = run_dir(settings, req) / "report.json"
    assert read_report(path) is None  # none yet
    path.parent.mkdir(parents=True)
    stored = EvalReport(
        verdict="opt", opt=True, patch_sha256=patch_sha256("p"), per_test={}, gm_speedup_agent=2.0
    )
    path.write_text(json.dumps(msgspec.to_builtins(stored)))
    assert read_report(path) == stored
    assert evaluate_report(req, settings) == stored
    path.write_text(
        json.dumps({"verdict": "opt", "opt": True, "patch_sha256": patch_sha256("p"), "extra": 1})
    )
    assert read_report(path) is None
    again = evaluate_report(req, settings)
    assert again.verdict == "unknown-instance" and again.patch_sha256 == patch_sha256("p")
