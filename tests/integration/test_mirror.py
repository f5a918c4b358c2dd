"""Mirrors follow upstream: a second visit sees commits made since the first; URLs never options."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cppperf.shared.errors import TransientError
from cppperf.shared.mirror import ensure_local, rev_parse
from tests.gitrepo import commit_files


def _branch(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "symbolic-ref", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_second_visit_sees_a_new_upstream_commit(tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    first = commit_files(upstream, {"a.cpp": "int a;\n"}, "one")
    branch = _branch(upstream)
    url = f"file://{upstream}"
    mirror = ensure_local(url, "o/r", tmp_path / "mirrors")
    assert rev_parse(mirror, branch) == first
    second = commit_files(upstream, {"a.cpp": "int a = 1;\n"}, "two")
    subprocess.run(["git", "-C", str(upstream), "tag", "v2"], check=True)
    again = ensure_local(url, "o/r", tmp_path / "mirrors")
    assert again == mirror
    assert rev_parse(mirror, branch) == second
    assert rev_parse(mirror, "v2") == second


def test_a_mirror_cloned_without_refspecs_is_fixed_on_its_next_visit(tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    commit_files(upstream, {"a.cpp": "int a;\n"}, "one")
    branch = _branch(upstream)
    mirror = tmp_path / "mirrors" / "o__r.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--", str(upstream), str(mirror)], check=True)
    new = commit_files(upstream, {"a.cpp": "int b;\n"}, "two")
    ensure_local(f"file://{upstream}", "o/r", tmp_path / "mirrors")
    assert rev_parse(mirror, branch) == new


def test_a_url_that_looks_like_an_option_is_not_one(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(TransientError):
        ensure_local(f"--upload-pack=touch {marker};://x", "o/r", tmp_path / "mirrors")
    assert not marker.exists()
