"""The container runner's views (`runner_script.View`), the docker backend's hardened answer to
tests that write beside themselves: run in-process here as root on a root-owned tree, the way the
runner sees a side's tree in the container while it is tested. The docker tests
(tests/integration/test_docker.py) run the same through the backend in a container."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cppperf.shared.engine import runner_script

GID = 54321  # the test's uid and group (the side's uid in the container)


@pytest.fixture
def tree() -> Iterator[Path]:
    """A built tree as `_own(building=False)` leaves it: root's, group GID, no group write."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the runner's side of a view: chmod, chown)")
    top = Path(tempfile.mkdtemp(prefix="cppperf-views-"))
    top.chmod(0o755)  # the test's uid walks through it (/work is 0755 too)
    side = top / "agent"
    tests = side / "build" / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "out.bin").write_text("built\n")
    (side / "build" / "Testing" / "Temporary").mkdir(parents=True)
    (top / "elsewhere").mkdir()
    (top / "elsewhere" / "keep").write_text("keep\n")
    for path in [side, *side.rglob("*")]:
        os.chown(path, 0, GID)
        path.chmod((0o750 if path.is_dir() else 0o640) if path != side else 0o750)
    try:
        yield side
    finally:
        shutil.rmtree(top)


def sh(side: Path, cmd: str, cwd: Path, *views: Path) -> dict[str, object]:
    req = {
        "op": "run",
        "argv": ["sh", "-c", cmd],
        "cwd": str(cwd),
        "env": {"PATH": "/usr/bin:/bin"},
        "timeout": 30,
        "uid": GID,
        "tree": str(side),
        "views": [str(v) for v in views],
    }
    # the runner as the container runs it (its own process), its views' root moved here from /work
    script = (
        f"import sys; sys.path.insert(0, {str(Path(runner_script.__file__).parent)!r}); import runner_script as r; "
        f"r.VIEW_ROOT = {str(side.parent) + '/'!r}; r.main()"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", script, json.dumps(req)], capture_output=True, check=True, timeout=60
    )
    answer: dict[str, object] = json.loads(out.stdout)
    return answer


def test_a_view_takes_new_files_for_one_run_and_keeps_the_builds_read_only(tree: Path) -> None:
    tests = tree / "build" / "tests"
    mtime = tests.stat().st_mtime_ns
    logs = "mkdir test_logs && echo line > test_logs/a.txt && cat test_logs/a.txt"
    for _ in range(2):  # the second run starts without the first one's files
        ans = sh(tree, logs, tests, tests)
        assert ans["returncode"] == 0 and "line" in str(ans["output"]), ans
    for tamper in (
        "echo x >> out.bin",
        "rm -f out.bin",
        "mv out.bin moved",
        "touch sub/new",
        "chmod 777 out.bin",
    ):
        ans = sh(tree, tamper, tests, tests)
        assert ans["returncode"] != 0, (tamper, ans)
    assert (tests / "out.bin").read_text() == "built\n"
    assert sorted(p.name for p in tests.iterdir()) == ["out.bin", "sub"]
    # closed again: root's, no group write, no sticky bit, its mtime as the build left it
    st = tests.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0, 0o750, mtime)
    # not a view in this run: read-only as before
    assert sh(tree, "touch made", tests)["returncode"] != 0


def test_ctest_may_write_its_logs_into_build_testing(tree: Path) -> None:
    testing = tree / "build" / "Testing"
    ans = sh(
        tree, "echo log > Temporary/LastTest.log && mkdir -p x/y", testing, testing, testing / "Temporary"
    )
    assert ans["returncode"] == 0, ans
    assert sorted(p.name for p in testing.rglob("*")) == ["Temporary"]


def test_a_symlink_left_in_a_view_is_unlinked_never_followed(tree: Path) -> None:
    tests = tree / "build" / "tests"
    elsewhere = tree.parent / "elsewhere"
    plant = f"ln -s {elsewhere} link && ln -s {elsewhere}/keep file && mkdir -p d && ln -s {elsewhere} d/l"
    assert sh(tree, plant, tests, tests)["returncode"] == 0
    assert sorted(p.name for p in tests.iterdir()) == ["out.bin", "sub"]
    assert (elsewhere / "keep").read_text() == "keep\n"


def test_a_view_outside_the_tree_through_a_symlink_or_not_the_builds_is_never_opened(
    tree: Path,
) -> None:
    tests = tree / "build" / "tests"
    elsewhere = tree.parent / "elsewhere"
    os.chown(elsewhere, 0, GID)
    elsewhere.chmod(0o750)
    assert sh(tree, "touch made", elsewhere, elsewhere)["returncode"] != 0  # outside the tree
    assert sh(tree, "touch made", tree, tree)["returncode"] != 0  # the tree itself: never
    # a symlink inside the tree to a directory of root's: not followed, stays read-only
    tree.joinpath("build", "alias").symlink_to(tests)
    assert sh(tree, "touch made", tests, tree / "build" / "alias")["returncode"] != 0
    assert sh(tree, "touch made", tests, tree / "build" / "tests" / ".." / "tests")["returncode"] != 0
    # a directory not root's (not the build's, as `_own` left it): never made a view
    os.chown(tests / "sub", 4242, GID)
    assert sh(tree, "touch made", tests / "sub", tests / "sub")["returncode"] != 0
    assert stat.S_IMODE((tests / "sub").stat().st_mode) == 0o750
    assert not list(elsewhere.glob("made")) and not list(tests.rglob("made"))
