"""Core-lease files are shared by every cppperf process on a host whatever its uid: the image's
builder runs as a non-root user and leases the cores that root's builders on the host (or other
replicas) created the files of."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from cppperf.shared.engine.leases import try_lease


def test_a_core_file_made_by_one_uid_is_leased_by_another() -> None:
    shared = Path(tempfile.mkdtemp(prefix="cppperf-lease-modes-", dir="/tmp"))  # walkable by every uid
    try:
        shared.chmod(0o1777)  # as lease_dir makes it
        old = os.umask(0o022)
        try:
            lease = try_lease(shared, 0)
        finally:
            os.umask(old)
        assert lease is not None
        lease.release()
        assert stat.S_IMODE((shared / "core-0.lock").stat().st_mode) == 0o666
        if os.geteuid() != 0:
            pytest.skip("the other-uid half needs root to switch users")
        pid = os.fork()
        if pid == 0:  # another uid opens it as try_lease does (read-write, to flock and write)
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                os.close(os.open(shared / "core-0.lock", os.O_RDWR))
                code = 0
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        shutil.rmtree(shared, ignore_errors=True)
