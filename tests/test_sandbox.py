"""The sandboxed runner: network unshared, timeouts as values, bounded output, memory limit,
process-group kill, CPU time measured."""

from __future__ import annotations

import os
import sys

import pytest

from cppperf.shared.engine.sandbox import Limits, _pids_root, network_prefix, run


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
