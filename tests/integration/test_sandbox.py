"""The sandboxed runner: network unshared, timeouts as values, bounded output, memory limit,
process-group kill, CPU time measured; the bubblewrap jail (unprivileged, private, fresh /tmp,
whole namespace killed on timeout, timed inside)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cppperf.shared.engine import cgroups
from cppperf.shared.engine.cgroups import hierarchy
from cppperf.shared.engine.sandbox import (
    INNER_PYTHON,
    Jail,
    Limits,
    hand_over,
    jail_available,
    jail_env,
    network_prefix,
    run,
)


def test_success_and_cpu_time_measured() -> None:
    res = run([sys.executable, "-c", "s=0\nfor i in range(3_000_000): s+=i"])
    assert res.ok and res.cpu_s > 0.05 and res.wall_s >= res.cpu_s * 0.5


def test_timeout_is_a_value_and_kills_the_group() -> None:
    res = run(["sh", "-c", "sleep 30 & sleep 30; wait"], limits=Limits(timeout=0.5))
    assert res.timed_out and not res.ok
    assert res.wall_s < 5


def test_output_is_bounded_head_and_tail_kept() -> None:
    res = run(["sh", "-c", "echo FIRST; yes filler | head -c 2000000; echo; echo LAST"], output_limit=1000)
    assert res.truncated
    assert res.output.startswith("FIRST") and res.output.rstrip().endswith("LAST")
    assert len(res.output) < 1200


def test_network_is_unshared() -> None:
    assert network_prefix(True), "no network isolation available (need unshare or bwrap)"
    code = "import socket\ns=socket.socket()\ns.settimeout(2)\ns.connect(('10.255.255.1', 80))"
    res = run([sys.executable, "-c", code])
    assert not res.ok
    assert "Network is unreachable" in res.output or "unreachable" in res.output.lower()


HOG = "import time\nx = b'x' * ({} << 20)\ntime.sleep(0.3)"


def test_memory_limit_per_process_without_a_cgroup() -> None:
    """The fallback where no memory cgroup can be made: RLIMIT_AS per process."""
    limits = Limits(memory_mb=300, memory_cgroup=False)
    res = run([sys.executable, "-c", HOG.format(800)], limits=limits)
    assert not res.ok and "MemoryError" in res.output and not res.memory_exceeded


def test_memory_limit_stops_a_hog() -> None:
    res = run([sys.executable, "-c", HOG.format(800)], limits=Limits(memory_mb=300))
    assert not res.ok
    assert res.memory_exceeded or (hierarchy("memory") is None and "MemoryError" in res.output)


memory_cgroup = pytest.mark.skipif(
    hierarchy("memory") is None, reason="the host delegates no memory cgroup to us (RLIMIT_AS fallback)"
)


@memory_cgroup
def test_memory_cgroup_caps_the_whole_run_not_each_process() -> None:
    """Four processes of 150 MiB each stay under a per-process cap of 400 MiB, but not under a
    cap of 400 MiB for the run (what a `-j N` build is); the same run at 1 GiB passes."""
    script = f'for i in 1 2 3 4; do {sys.executable} -c "{HOG.format(150)}" & done; wait'
    big = run(["sh", "-c", script], limits=Limits(memory_mb=1024, timeout=60))
    assert big.ok and not big.memory_exceeded, big.output
    small = run(["sh", "-c", script + "; sleep 0.5"], limits=Limits(memory_mb=400, timeout=60))
    assert small.memory_exceeded and "memory limit of 400 MiB" in small.output


@memory_cgroup
def test_memory_cgroup_leaves_nothing_behind() -> None:
    own = hierarchy("memory")
    assert own is not None
    mine = f"cppperf-{os.getpid()}-"  # other cppperf processes on the host make theirs beside ours
    before = {p.name for p in own.own.iterdir() if p.name.startswith(mine)}
    run([sys.executable, "-c", HOG.format(50)], limits=Limits(memory_mb=200, processes=32))
    after = {p.name for p in own.own.iterdir() if p.name.startswith(mine)}
    assert after <= before


def test_cgroup_discovery_inside_a_container_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own cgroup is found through mountinfo + /proc/self/cgroup, also when the mount shows
    only a subtree (a container), for v2 only where the controller is enabled for children."""
    v1 = tmp_path / "v1mem"
    (v1 / "kids").mkdir(parents=True)
    (v1 / "kids" / "cgroup.procs").write_text("")
    v2 = tmp_path / "unified"
    (v2 / "svc").mkdir(parents=True)
    (v2 / "svc" / "cgroup.subtree_control").write_text("cpu pids\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"35 31 0:32 /box {v1} rw,relatime - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {v2} rw,relatime - cgroup2 cgroup2 rw\n"
    )
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/box/kids\n0::/svc\n")
    monkeypatch.setattr(cgroups, "MOUNTINFO", mountinfo)
    monkeypatch.setattr(cgroups, "PROC_CGROUP", proc)
    pids = cgroups.find_hierarchy("pids")
    assert pids == cgroups.Hierarchy("pids", v2 / "svc", True)
    mem = cgroups.find_hierarchy("memory")  # v2 does not delegate memory: the v1 subtree does
    assert mem == cgroups.Hierarchy("memory", v1 / "kids", False)
    proc.write_text("4:memory:/elsewhere\n0::/svc\n")  # a path the mount cannot see
    assert cgroups.find_hierarchy("memory") is None


@pytest.mark.skipif(
    hierarchy("pids") is None and os.geteuid() == 0,
    reason="no writable pids cgroup and running as root: RLIMIT_NPROC would not hold a fork bomb",
)
def test_fork_bomb_is_contained() -> None:
    bomb = "bomb() { bomb | bomb & }; bomb; sleep 2"
    res = run(["bash", "-c", bomb], limits=Limits(timeout=5, processes=64))
    assert not res.ok or res.timed_out or "fork" in res.output.lower()
    # the machine still works and nothing of the bomb is left running
    import subprocess

    after = subprocess.run(["pgrep", "-fc", "bomb"], capture_output=True, text=True, check=False)
    assert int(after.stdout.strip() or 0) <= 1  # pgrep may count itself


jail_only = pytest.mark.skipif(not jail_available(), reason="bubblewrap cannot create its namespaces here")


@jail_only
def test_jail_is_unprivileged_private_and_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The jail: uid 65534, no capabilities, no_new_privs, own pid namespace, only its binds,
    a private /tmp each run, an allow-listed environment, a read-only bind stays read-only."""
    monkeypatch.setenv("CPPPERF_JAIL_SECRET", "hunter2")
    tree, other = tmp_path / "tree", tmp_path / "other"
    tree.mkdir()
    other.mkdir()
    (other / "secret").write_text("hunter2")
    hand_over(tree)
    inside = tmp_path / "seen"
    jail = Jail(rw=((tree, inside),))
    probe = (
        "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; echo pid=$$; env; ls /tmp;"
        f" touch /tmp/mine; echo x > {inside}/made; cat {other}/secret; ls /root /home 2>&1 | head -2"
    )
    first = run(["sh", "-c", probe], cwd=inside, env=jail_env(), jail=jail)
    second = run(["sh", "-c", "ls /tmp/mine"], cwd=inside, env=jail_env(), jail=jail)
    assert first.ok or "No such file" in first.output, first.output
    out = first.output
    assert out.startswith("65534\n") and "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out
    assert "pid=2" in out or "pid=1" in out or "pid=3" in out  # a fresh pid namespace
    assert "hunter2" not in out and "CPPPERF_" not in out
    assert (tree / "made").read_text() == "x\n"
    assert not second.ok and "No such file" in second.output  # /tmp is fresh for every run
    ro = run(
        ["sh", "-c", f"echo y > {inside}/made"], cwd=inside, env=jail_env(), jail=Jail(ro=((tree, inside),))
    )
    assert not ro.ok and (tree / "made").read_text() == "x\n"


@jail_only
def test_jail_timeout_kills_every_process_in_it(tmp_path: Path) -> None:
    tag = f"7{os.getpid()}.5"
    res = run(
        ["sh", "-c", f"setsid sleep {tag} & (setsid sleep {tag} &); sleep {tag}"],
        env=jail_env(),
        jail=Jail(),
        limits=Limits(timeout=1),
    )
    assert res.timed_out
    import subprocess

    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    assert [ln for ln in ps.splitlines() if tag in ln and not ln.lstrip().startswith("Z")] == []


@jail_only
def test_jail_network_is_off_unless_the_limits_allow_it() -> None:
    """Only loopback in the jail's own namespace; `Limits(network=True)` keeps the host's."""
    host = len(Path("/proc/net/dev").read_text().splitlines())
    off = run(["cat", "/proc/net/dev"], env=jail_env(), jail=Jail())
    on = run(["cat", "/proc/net/dev"], env=jail_env(), jail=Jail(), limits=Limits(network=True))
    assert off.ok and on.ok
    assert [ln.split(":")[0].strip() for ln in off.output.splitlines()[2:]] == ["lo"]
    assert len(on.output.splitlines()) == host


@jail_only
@memory_cgroup
def test_jail_tmp_writes_count_against_the_memory_cap(tmp_path: Path) -> None:
    """The private /tmp is a tmpfs: what the jailed code writes there is memory of the run."""
    fill = "dd if=/dev/zero of=/tmp/fill bs=1M count=600 2>&1; sleep 0.5"
    res = run(
        ["sh", "-c", fill], env=jail_env(), jail=Jail(tmp_mb=1024), limits=Limits(memory_mb=300, timeout=60)
    )
    assert not res.ok and res.memory_exceeded
    ok = run(
        ["sh", "-c", fill], env=jail_env(), jail=Jail(tmp_mb=1024), limits=Limits(memory_mb=900, timeout=60)
    )
    assert ok.ok, ok.output


@jail_only
@memory_cgroup
def test_jailed_timed_run_reports_the_memory_cap() -> None:
    res = run(
        [INNER_PYTHON, "-c", HOG.format(500)],
        env=jail_env(),
        jail=Jail(),
        timed=True,
        limits=Limits(memory_mb=200),
    )
    assert not res.ok and res.memory_exceeded and "memory limit of 200 MiB" in res.output


@jail_only
def test_jailed_timing_happens_inside(tmp_path: Path) -> None:
    res = run(["sleep", "0.2"], env=jail_env(), jail=Jail(), timed=True)
    assert res.ok and 0.19 < res.wall_s < 0.6  # bwrap's setup is not in the sample


def test_missing_caps_names_what_falls_back_to_rlimits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        cgroups, "_FOUND", {"memory": None, "pids": cgroups.Hierarchy("pids", tmp_path, True)}
    )
    assert cgroups.missing_caps() == ["memory"]
    limits = Limits(memory_mb=300, processes=16)
    cg = cgroups.RunCgroup(processes=limits.processes, memory_mb=limits.memory_mb)
    assert cg.memory is None  # so the run falls back to RLIMIT_AS (see _preexec)
    cg.kill_all_and_remove()


KEYRING_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
found = libc.syscall(nr[1], 10, -5, b"user", b"cppperf-jail-probe-TAG", 0)  # KEYCTL_SEARCH
print("found" if found >= 0 else "search-errno", ctypes.get_errno())
added = libc.syscall(nr[0], b"user", b"cppperf-jail-probe-TAG", b"x", 1, -5)  # user-session keyring
print("added" if added >= 0 else "add-errno", ctypes.get_errno())
"""


@jail_only
def test_jail_has_no_kernel_keyrings() -> None:
    """Keyrings are per uid, shared by every jailed run: a run could leave its answer there for
    the next one. In the jail they do not exist (ENOSYS, seccomp)."""
    probe = KEYRING_PROBE.replace("TAG", str(os.getpid()))
    runs = [run([INNER_PYTHON, "-c", probe], env=jail_env(), jail=Jail(), timed=t) for t in (False, True)]
    for res in runs:
        assert res.ok, res.output
        assert "search-errno 38" in res.output and "add-errno 38" in res.output, res.output
    assert run(["true"], env=jail_env(), jail=Jail()).ok  # everything else still runs


FORGE = (
    'printf \'{"returncode": 0, "wall_s": 0.0001, "cpu_s": 0, "output": "FORGED",'
    ' "timed_out": false, "truncated": false}\' > /proc/1/fd/1; kill -9 $PPID 1; sleep 0.3'
)


@jail_only
def test_timed_answer_cannot_be_forged_through_pid_1() -> None:
    """The runner is pid 1 of its jail (no bwrap init holding the answer pipe), not dumpable and
    unkillable from inside: the command can neither write a fake answer nor stop the real one."""
    res = run(["sh", "-c", FORGE], env=jail_env(), jail=Jail(), timed=True)
    assert "FORGED" not in res.output and res.wall_s > 0.25, res
    assert res.ok and "Permission denied" in res.output


def test_an_answer_counts_only_from_a_runner_that_finished() -> None:
    from cppperf.shared.engine.sandbox import RunResult, _inner_result

    answer = '{"returncode": 0, "wall_s": 0.0001, "cpu_s": 0, "output": "", "timed_out": false, "truncated": false}'
    killed = RunResult(137, 1.0, 1.0, answer, False, False)
    assert _inner_result(killed, None) is killed
    finished = _inner_result(RunResult(0, 1.0, 1.0, answer, False, False), None)
    assert finished.wall_s == 0.0001


@jail_only
def test_jail_writes_only_to_capped_tmpfs_and_its_binds() -> None:
    """bwrap's tmpfs for / and /dev have no size: read-only once set up, so writes go only to
    /tmp and /dev/shm, each capped at `tmp_mb` — a bound even where no memory cgroup counts them
    (the per-process RLIMIT_AS fallback never sees tmpfs pages)."""
    fill = "for d in / /dev /dev/shm /tmp; do dd if=/dev/zero of=$d/fill bs=1M count=40 2>&1 | tail -1; done"
    res = run(
        ["sh", "-c", fill + "; echo x > /dev/null && echo null-ok; df -k /dev/shm /tmp | tail -2"],
        env=jail_env(),
        jail=Jail(tmp_mb=16),
        limits=Limits(timeout=60, memory_mb=100, memory_cgroup=False),
    )
    assert res.output.count("Read-only file system") == 2, res.output
    assert "null-ok" in res.output, res.output
    df = [ln.split()[1:4] for ln in res.output.strip().splitlines()[-2:]]
    assert df == [["16384", "16384", "0"]] * 2, res.output  # 40 MB asked, full at 16 MiB


HIDDEN_WORK = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:  # an orphan nobody waits for: its CPU time is in no wait4 rusage
        t = time.process_time()
        while time.process_time() - t < 0.5:
            pass
        os.write(w, b"done")
        os._exit(0)
    os._exit(0)
os.wait()
print(os.read(r, 4).decode())
"""


@jail_only
def test_timed_cpu_counts_children_nobody_waited_for() -> None:
    """A score cheat under the `cpu` metric: do the work in an orphan. The runner is the jail's
    pid 1, so it reaps the orphan and its CPU time is in the sample."""
    res = run([INNER_PYTHON, "-c", HIDDEN_WORK], env=jail_env(), jail=Jail(), timed=True)
    assert res.ok and "done" in res.output, res.output
    assert res.cpu_s >= 0.45, res


def test_the_runner_as_subreaper_counts_orphans_outside_a_pid_namespace() -> None:
    """In a container the runner is not pid 1 (`docker exec`): as the subreaper of its command it
    still reaps the orphan, so the hidden CPU work is in `cpu_s` — and without `reap` it is not."""
    import json
    import subprocess

    from cppperf.shared.engine.sandbox import RUNNER_PATH

    def answer(reap: bool) -> dict[str, object]:
        req = {"op": "run", "argv": [sys.executable, "-c", HIDDEN_WORK], "timeout": 60, "reap": reap}
        out = subprocess.run(
            [sys.executable, str(RUNNER_PATH), json.dumps(req)], capture_output=True, text=True, check=True
        ).stdout
        return dict(json.loads(out))

    blind, seen = answer(False), answer(True)
    assert "done" in str(blind["output"]) and "done" in str(seen["output"])
    assert float(str(blind["cpu_s"])) < 0.3, blind
    assert float(str(seen["cpu_s"])) >= 0.45, seen


def test_the_runner_reaps_a_daemon_holding_its_output_at_once() -> None:
    """A daemon the test left (its own session, our stdout still open) is killed as soon as the
    test exits: the run does not wait for the pipe's end, and nothing is left behind."""
    import json
    import subprocess
    import time

    from cppperf.shared.engine.sandbox import RUNNER_PATH

    arg = f"4243.{os.getpid()}"
    daemon = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{arg}'])\n    os._exit(0)\nos.wait()\nprint('hi')\n"
    )
    req = {"op": "run", "argv": [sys.executable, "-c", daemon], "timeout": 60, "reap": True}
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(RUNNER_PATH), json.dumps(req)], capture_output=True, text=True, check=True
    ).stdout
    took = time.monotonic() - t0
    assert json.loads(out)["output"] == "hi\n"
    left = subprocess.run(["pgrep", "-f", f"sleep {arg}"], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == ""
    assert took < 4.0, took  # the reader's 5 s wait for the pipe's end was not needed


@jail_only
def test_a_view_lets_a_test_write_beside_itself_but_change_nothing_the_build_made(tmp_path: Path) -> None:
    """`Jail.views`: the test's working directory inside a read-only tree is writable for the run
    (spdlog's tests create `test_logs/` there), every entry the build made stays read-only — not
    writable, not removable, not renamable — nothing the run writes reaches the host or the next
    run, and a symlink the tree holds stays a symlink resolved inside the jail."""
    tree = tmp_path / "tree"
    tests = tree / "build" / "tests"
    (tests / "data").mkdir(parents=True)
    (tests / "exe").write_text("built\n")
    (tests / "data" / "input").write_text("in\n")
    (tests / "passwd-link").symlink_to("/etc/passwd")  # a build could plant one: not the host's file
    hand_over(tree)
    inside = tmp_path / "seen"
    where = inside / "build" / "tests"
    jail = Jail(ro=((tree, inside),), views=(where,))
    write = "mkdir test_logs && echo log > test_logs/a && cat test_logs/a && cat exe data/input && echo ok"
    first = run(["sh", "-c", write], cwd=where, env=jail_env(), jail=jail)
    assert first.ok, first.output
    assert "log\nbuilt\nin\nok" in first.output
    again = run(["sh", "-c", "ls test_logs"], cwd=where, env=jail_env(), jail=jail)
    assert not again.ok  # fresh per run
    assert not (tests / "test_logs").exists()  # never on the host
    for attack in ("echo x >> exe", "rm -f exe", "mv exe moved", "echo x > data/input", "touch data/new"):
        res = run(["sh", "-c", attack], cwd=where, env=jail_env(), jail=jail)
        assert not res.ok, attack
    assert (tests / "exe").read_text() == "built\n" and sorted(
        p.name for p in (tests / "data").iterdir()
    ) == ["input"]
    link = run(["sh", "-c", "readlink passwd-link; cat passwd-link"], cwd=where, env=jail_env(), jail=jail)
    assert link.output.startswith("/etc/passwd\n") and "root:" not in link.output  # /etc/passwd is not bound
    timed = run(["sh", "-c", "echo t > made && cat made"], cwd=where, env=jail_env(), jail=jail, timed=True)
    assert timed.ok and "t" in timed.output, timed.output  # the timing runner's jail keeps the view


@jail_only
def test_a_view_reached_through_a_symlink_stays_read_only(tmp_path: Path) -> None:
    """A view whose directory the tree's own build replaced by a symlink (to anywhere on the host)
    is not made: the host directory behind it is never listed or bound, the tree stays read-only."""
    tree, host_dir = tmp_path / "tree", tmp_path / "elsewhere"
    (tree / "build").mkdir(parents=True)
    host_dir.mkdir()
    (host_dir / "private").write_text("host file\n")
    (tree / "build" / "tests").symlink_to(host_dir)
    hand_over(tree)
    inside = tmp_path / "seen"
    jail = Jail(ro=((tree, inside),), views=(inside / "build" / "tests",))
    res = run(["sh", "-c", "cat tests/private"], cwd=inside / "build", env=jail_env(), jail=jail)
    assert not res.ok and "host file" not in res.output
    assert sorted(p.name for p in host_dir.iterdir()) == ["private"]
