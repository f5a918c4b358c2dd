"""The test run's own timing-core lease directory (`tests/conftest.py` `session_lease_dir`): one per
pytest session, never the host-wide /tmp/cppperf-leases a benchmark beside the suite holds (tests
queued behind it for tens of minutes); every test, every Settings a test builds and every process
a test starts use the same one, and a CPPPERF_BUILDER_LEASE_DIR the user set wins."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from cppperf.shared.engine.leases import lease_dir
from cppperf.shared.settings import BuilderSettings, load_settings
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parents[2]
HOST_WIDE = Path("/tmp/cppperf-leases")  # the host default these tests must not use


def _in_a_process() -> Path:
    """The lease directory a cppperf process started by a test resolves (from its environment)."""
    code = (
        "from cppperf.shared.engine.leases import lease_dir; from cppperf.shared.settings import "
        "load_settings; print(lease_dir(load_settings().builder))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return Path(res.stdout.strip())


def test_every_settings_and_process_of_the_run_share_its_own_lease_dir(
    session_lease_dir: Path, tmp_path: Path
) -> None:
    assert session_lease_dir != HOST_WIDE and session_lease_dir.is_dir()
    assert lease_dir(make_settings(tmp_path).builder) == session_lease_dir
    assert lease_dir(BuilderSettings()) == session_lease_dir  # settings built without make_settings
    assert lease_dir(load_settings(env={}).builder) == session_lease_dir
    assert _in_a_process() == session_lease_dir  # so leases between processes still meet


INNER = textwrap.dedent(
    """
    import os
    from pathlib import Path

    from cppperf.shared.engine.leases import lease_dir
    from cppperf.shared.settings import BuilderSettings


    def test_where(session_lease_dir: Path) -> None:
        Path(os.environ["REPORT_TO"]).write_text(
            f"{session_lease_dir}\\n{lease_dir(BuilderSettings())}\\n{os.environ['CPPPERF_BUILDER_LEASE_DIR']}"
        )
    """
)


def _inner_run(tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run a one-test pytest session with this suite's fixtures; what it saw as its lease dir."""
    (tmp_path / "inner").mkdir(exist_ok=True)
    (tmp_path / "inner" / "test_inner.py").write_text(INNER)
    report = tmp_path / "report.txt"
    base = {k: v for k, v in os.environ.items() if k != "CPPPERF_BUILDER_LEASE_DIR"}
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--basetemp", str(tmp_path / "basetemp"), str(tmp_path / "inner")],
        cwd=ROOT, env={**base, "REPORT_TO": str(report), **env},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return report.read_text().splitlines()


def test_a_session_gets_a_lease_dir_of_its_own(tmp_path: Path) -> None:
    own = str(tmp_path / "basetemp" / "leases")
    assert _inner_run(tmp_path, {}) == [own, own, own]


def test_the_lease_dir_the_user_set_wins(tmp_path: Path) -> None:
    mine = str(tmp_path / "my-leases")
    assert _inner_run(tmp_path, {"CPPPERF_BUILDER_LEASE_DIR": mine}) == [mine, mine, mine]
