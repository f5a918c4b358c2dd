"""Host-level core leases: the default split of cores into timing and build cores, settings
validated; two processes never time on the same core at the same time; a `kill -9`'d holder
frees its core; a lease is exclusive within one process too; timed runs are pinned to the leased
core and builds to the build cores."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
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


WAITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from cppperf.shared.engine.leases import acquire
    lease = acquire(Path(sys.argv[1]), [0], timeout=60, priority=int(sys.argv[3]))
    with open(sys.argv[2], "a") as fh:
        fh.write(sys.argv[4] + "\\n")
    time.sleep(0.05)
    lease.release()
    """
)


def _queued(directory: Path) -> int:
    queue = directory / "queue"
    return len(os.listdir(queue)) if queue.is_dir() else 0


def _wait_for(check: Any, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@contextlib.contextmanager
def _queue_behind_a_holder(
    leases: Path, log: Path, priorities: list[int]
) -> Iterator[tuple[subprocess.Popen[str], list[subprocess.Popen[str]]]]:
    """A process holding core 0, then one waiter per priority, each queued before the next starts
    (so arrival order is known); every one of them is killed on the way out."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.replace("[0, 1]", "[0]"), str(leases), "600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    waiters: list[subprocess.Popen[str]] = []
    try:
        assert holder.stdout is not None
        assert int(holder.stdout.readline()) == 0
        for i, prio in enumerate(priorities):
            waiters.append(
                subprocess.Popen(
                    [sys.executable, "-c", WAITER, str(leases), str(log), str(prio), str(i)], text=True
                )
            )
            _wait_for(lambda n=i + 1: _queued(leases) == n, f"waiter {i} never queued")
        yield holder, waiters
    finally:
        for p in [holder, *waiters]:
            p.kill()
            p.communicate()


def test_leases_are_granted_in_arrival_order_and_a_killed_waiter_frees_its_place(tmp_path: Path) -> None:
    """Six waiters queue behind a holder in a known order (one of them, the evaluation, with a
    better priority; one killed while waiting): they get the core in ticket order, the killed
    one's place is skipped, and the holder's kill -9 starts it all."""
    leases, log = tmp_path / "leases", tmp_path / "order"
    with _queue_behind_a_holder(leases, log, [1, 1, 1, 1, 0, 1]) as (holder, waiters):
        waiters[2].kill()  # kill -9 while waiting
        waiters[2].wait(timeout=10)
        os.kill(holder.pid, signal.SIGKILL)
        for i, w in enumerate(waiters):
            if i != 2:
                assert w.wait(timeout=60) == 0
        assert log.read_text().split() == ["4", "0", "1", "3", "5"]  # priority 0 first, then arrival
        assert _queued(leases) == 0  # every ticket gone, the dead one's too
        assert (leases / "core-0.lock").read_text() == ""  # a free core's file names nobody


def test_the_holder_line_says_host_pid_and_since(tmp_path: Path) -> None:
    lease = acquire(tmp_path, [2], timeout=5)
    try:
        host, pid_word, pid, since_word, since = (tmp_path / "core-2.lock").read_text().split()
        assert (pid_word, int(pid), since_word) == ("pid", os.getpid(), "since")
        assert abs(int(since) - time.time()) < 5 and host
    finally:
        lease.release()


def test_per_round_turns_let_a_waiter_in_between_rounds(tmp_path: Path) -> None:
    """`lease_policy=round`: a proof's lease is given back after each round, so a process that
    queued during a round gets the core before the proof's next round."""
    from cppperf.shared.engine.leases import timing_turns

    cores = sorted(os.sched_getaffinity(0))
    s = BuilderSettings(
        lease_dir=str(tmp_path), timing_cores=[cores[-1]], build_cores=[cores[0]] if len(cores) > 1 else []
    )
    log = tmp_path / "order"
    with timing_turns(s) as turns:
        with turns.turn() as cpu:
            assert cpu == cores[-1] and turns.cpu == cpu
            other = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WAITER.replace("[0]", f"[{cpu}]"),
                    str(tmp_path),
                    str(log),
                    "1",
                    "eval",
                ]
            )
            _wait_for(lambda: _queued(tmp_path) == 1, "the other process never queued")
        assert turns.cpu is None
        with turns.turn(), log.open("a") as fh:
            fh.write("round2\n")
        assert other.wait(timeout=30) == 0
    assert log.read_text().split() == ["eval", "round2"]
    assert turns.facts()["lease_waits"] == 2 and turns.facts()["lease_policy"] == "round"


def test_the_lease_view_names_the_holder_and_the_waiters_in_serving_order(tmp_path: Path) -> None:
    """What `status` and `mine`'s live view say a job waits for: the core's holder (pid, since),
    then the live waiters in the order they will be served (an evaluation before an earlier
    proof); a dead ticket and a free core are not listed, and looking takes nothing."""
    from cppperf.cli.waiting import describe
    from cppperf.shared.engine.leases import lease_view

    leases, log = tmp_path / "leases", tmp_path / "order"
    leases.mkdir()
    (leases / "core-1.lock").write_text("")  # a core nobody holds
    with _queue_behind_a_holder(leases, log, [1, 0]) as (holder, waiters):
        (leases / "queue" / f"001-{1:020d}-999999").write_text("ghost pid 999999 since 1\n")  # owner gone
        view = lease_view(leases)
        assert [(h.core, h.pid) for h in view.holders] == [(0, holder.pid)]
        assert [(w.pid, w.priority) for w in view.waiting] == [(waiters[1].pid, 0), (waiters[0].pid, 1)]
        assert abs(view.holders[0].since - time.time()) < 60
        lines = describe(view, [], time.time())
        assert lines[0].startswith(f"timing core 0: held by pid {holder.pid} on ")
        assert f"#1: pid {waiters[1].pid}" in lines[1] and "(evaluation)" in lines[1]
        assert f"#2: pid {waiters[0].pid}" in lines[2] and "(proof)" in lines[2]
        assert len(lines) == 3
        assert lease_view(leases) == view  # looking took no lease and removed no ticket
        os.kill(holder.pid, signal.SIGKILL)
        for w in waiters:
            assert w.wait(timeout=60) == 0
        assert log.read_text().split() == ["1", "0"]
        after = lease_view(leases)
        assert after.holders == () and after.waiting == ()
        assert describe(after, [], time.time())[0].startswith("nothing holds or waits for a timing core")


def test_a_claimed_job_is_said_with_its_holder_and_age() -> None:
    from cppperf.cli.waiting import describe
    from cppperf.shared.engine.leases import LeaseView

    now = time.time()
    claim = {"key": "instance/o__r@abc", "holder": "h-12-x", "since": now - 125, "expires_at": now + 60}
    (line,) = describe(LeaseView(Path("/nowhere"), (), ()), [claim], now)
    assert line.startswith("claimed instance/o__r@abc: by h-12-x since ") and line.endswith("(2m05s)")
