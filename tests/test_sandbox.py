"""The sandboxed runner: network unshared, timeouts as values, bounded output, memory limit,
process-group kill, CPU time measured; the bubblewrap jail (unprivileged, private, fresh /tmp,
whole namespace killed on timeout, timed inside)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cppperf.shared.engine.sandbox import (
    Jail,
    Limits,
    _pids_root,
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


def test_memory_limit_stops_a_hog() -> None:
    res = run([sys.executable, "-c", "x = bytearray(800 * 1024 * 1024)"], limits=Limits(memory_mb=300))
    assert not res.ok and "MemoryError" in res.output


@pytest.mark.skipif(
    _pids_root() is None and os.geteuid() == 0,
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
def test_jailed_timing_happens_inside(tmp_path: Path) -> None:
    res = run(["sleep", "0.2"], env=jail_env(), jail=Jail(), timed=True)
    assert res.ok and 0.19 < res.wall_s < 0.6  # bwrap's setup is not in the sample
