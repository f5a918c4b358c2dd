"""Host-level core leases: the default split of cores into timing and build cores, settings
validated; two processes never time on the same core at the same time; a `kill -9`'d holder
frees its core; a lease is exclusive within one process too; timed runs are pinned to the leased
core and builds to the build cores."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cppperf.shared.engine.leases import acquire, core_plan, try_lease
from cppperf.shared.engine.sandbox import Limits, run
from cppperf.shared.errors import ConfigError, InfraFailure
from cppperf.shared.settings import BuilderSettings, load_settings


def test_default_plan_splits_the_cores() -> None:
    s = BuilderSettings()
    assert core_plan(s, [0, 1]).timing == (1,) and core_plan(s, [0, 1]).build == (0,)
    assert core_plan(s, [0]).timing == (0,) and core_plan(s, [0]).build == (0,)
    eight = core_plan(s, range(8))
    assert eight.timing == (4, 5, 6, 7) and eight.build == (0, 1, 2, 3)
    assert eight.cpuset() == "0,1,2,3,4,5,6,7"


def test_plan_from_settings_and_bad_values() -> None:
    s = load_settings(env={"CPPPERF_BUILDER_TIMING_CORES": "2,3", "CPPPERF_BUILDER_LEASE_DIR": "/x"})
    assert s.builder.lease_dir == "/x"
    plan = core_plan(s.builder, range(4))
    assert plan.timing == (2, 3) and plan.build == (0, 1)
    with pytest.raises(ConfigError, match="timing_cores"):
        core_plan(BuilderSettings(timing_cores=[9]), range(4))
    with pytest.raises(ConfigError, match="overlap"):
        core_plan(BuilderSettings(timing_cores=[1], build_cores=[0, 1]), range(4))


HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from cppperf.shared.engine.leases import acquire
    lease = acquire(Path(sys.argv[1]), [0, 1], timeout=60, poll=0.01)
    start = time.time()
    print(lease.cpu, flush=True)
    time.sleep(float(sys.argv[2]))
    end = time.time()
    lease.release()
    print(json.dumps({"cpu": lease.cpu, "start": start, "end": end}))
    """
)


def test_processes_never_time_on_the_same_core(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path / "leases"), "0.4"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    spans = [json.loads(p.communicate(timeout=120)[0].splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {s["cpu"] for s in spans} == {0, 1}  # both cores were used
    for core in (0, 1):
        on = sorted((s["start"], s["end"]) for s in spans if s["cpu"] == core)
        for (_, end), (start, _) in itertools.pairwise(on):
            assert start >= end, f"two processes held core {core} at once: {on}"


def test_kill_9_frees_the_core(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), "60"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        held = int(holder.stdout.readline())
        assert try_lease(tmp_path, held) is None
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        lease = try_lease(tmp_path, held)
        assert lease is not None  # the kernel released the lock with the process
        lease.release()
    finally:
        holder.kill()
        holder.communicate()


def test_a_lease_is_exclusive_within_one_process_and_times_out(tmp_path: Path) -> None:
    first = acquire(tmp_path, [3], timeout=1)
    try:
        assert try_lease(tmp_path, 3) is None
        with pytest.raises(InfraFailure, match="no timing core free"):
            acquire(tmp_path, [3], timeout=0.3, poll=0.05)
    finally:
        first.release()
    again = acquire(tmp_path, [3], timeout=1)
    again.release()


def test_runs_are_pinned_to_the_core_asked() -> None:
    cores = sorted(os.sched_getaffinity(0))
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    timed = run(probe, limits=Limits(cpu=cores[-1]), sandbox=False)
    assert timed.output.strip() == str([cores[-1]])
    build = run(probe, limits=Limits(cpus=(cores[0],)), sandbox=False)
    assert build.output.strip() == str([cores[0]])


def test_compose_shares_one_lease_directory_between_builders_and_evaluators() -> None:
    import yaml

    compose = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml").read_text())
    mounts = []
    for name in ("builder", "evaluator"):
        svc = compose["services"][name]
        lease = svc["environment"]["CPPPERF_BUILDER_LEASE_DIR"]
        mounts += [v.rsplit(":", 1)[0] for v in svc["volumes"] if str(v).endswith(":" + lease)]
    assert len(mounts) == 2 and mounts[0] == mounts[1]
    assert mounts[0].endswith("/tmp/cppperf-leases}")  # the host default every cppperf process uses


def test_the_orchestrating_thread_stays_off_the_timing_cores(tmp_path: Path) -> None:
    from cppperf.shared.engine.leases import timing_core

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: timing and building share it")
    s = BuilderSettings(lease_dir=str(tmp_path), timing_cores=[cores[-1]], build_cores=[cores[0]])
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    with timing_core(s) as cpu:
        assert cpu == cores[-1]
        assert os.sched_getaffinity(0) == {cores[0]}
        assert run(probe, limits=Limits(cpu=cpu), sandbox=False).output.strip() == str([cpu])
    assert sorted(os.sched_getaffinity(0)) == cores


def test_a_plan_made_on_the_build_cores_still_has_its_timing_cores(tmp_path: Path) -> None:
    """`on_build_cores` narrows the thread to the build cores; plans made inside it (the lease,
    the untimed runs' limits) are still made from every core, so a lease never lands on a build
    core and nested blocks restore what they found."""
    from cppperf.shared.engine.leases import on_build_cores, timing_core

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: timing and building share it")
    s = BuilderSettings(lease_dir=str(tmp_path))
    plan = core_plan(s)
    with on_build_cores(s):
        assert os.sched_getaffinity(0) == set(plan.build)
        assert core_plan(s) == plan
        with timing_core(s) as cpu:
            assert cpu in plan.timing and core_plan(s) == plan
        assert os.sched_getaffinity(0) == set(plan.build)
    assert sorted(os.sched_getaffinity(0)) == cores
    with on_build_cores(BuilderSettings(lease_dir=str(tmp_path), pin_cpu=False)):
        assert sorted(os.sched_getaffinity(0)) == cores  # pin_cpu off: nothing narrowed
