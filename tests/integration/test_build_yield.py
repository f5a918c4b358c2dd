"""bench/build_yield.py without building: an index entry that is a merge commit is proved against
the parent the index names, and an entry whose commit cannot be had is a row of the table, not
the end of the run."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gitrepo import commit_files

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import build_yield


def _merge_repo(repo: Path) -> tuple[str, str, str]:
    """main: base → a; side: base → b; merge of side into main. (first parent, second, merge)."""
    git = ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b"]
    commit_files(repo, {"CMakeLists.txt": "project(x)\n"}, "base")
    subprocess.run([*git, "branch", "-q", "side"], check=True)
    first = commit_files(repo, {"a.txt": "a\n"}, "a")
    subprocess.run([*git, "checkout", "-q", "side"], check=True)
    second = commit_files(repo, {"b.txt": "b\n"}, "b")
    subprocess.run([*git, "checkout", "-q", "-"], check=True)
    subprocess.run([*git, "merge", "-q", "--no-edit", "side"], check=True)
    merge = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    return first, second, merge.strip()


def _args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(
        out=tmp_path / "out",
        runs=3,
        warmup=0,
        jobs=1,
        build_timeout=60.0,
        test_timeout=60.0,
        cpuset="0",
    )


def test_a_merge_commit_is_proved_against_the_index_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "r"
    _first, second, merge = _merge_repo(repo)
    seen: list[Any] = []

    def fake_build(commit: Any, *_a: Any, **_kw: Any) -> Any:
        seen.append(commit)
        raise RuntimeError("not building in this test")

    monkeypatch.setattr(build_yield, "build_patch", fake_build)
    entry = {"repo": "o/r", "new_sha": merge, "old_sha": second, "date": "2024-01-01T00:00:00+00:00"}
    row = build_yield.prove_one(entry, repo, "local", _args(tmp_path), {})
    assert row["verdict"] == "error" and row["category"] == "RuntimeError"
    assert len(seen) == 1
    assert (seen[0].sha, seen[0].parent, seen[0].repo) == (merge, second, "o/r")


def test_a_commit_that_cannot_be_had_is_a_row(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": "project(x)\n"}, "base")
    entry = {"repo": "o/r", "new_sha": "f" * 40, "old_sha": "e" * 40, "date": "2024-01-01T00:00:00+00:00"}
    row = build_yield.prove_one(entry, repo, "local", _args(tmp_path), {})
    assert row["verdict"] == "error" and row["line"]


def test_docker_asked_for_and_no_engine_is_an_error_not_a_local_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unset DOCKER_HOST once turned a docker run into local builds beside another build."""
    repo = tmp_path / "r"
    commit_files(repo, {"CMakeLists.txt": "project(x)\n"}, "base")
    index = tmp_path / "index.jsonl"
    index.write_text("")
    ran: list[str] = []
    monkeypatch.setattr(build_yield, "engine_reachable", lambda: False)
    monkeypatch.setattr(build_yield, "prove_one", lambda *a, **_k: ran.append(a[2]) or {})
    argv = ["build_yield.py", "--clone", f"o/r={repo}", "--index", str(index), "--out", str(tmp_path / "o")]
    monkeypatch.setattr(sys, "argv", [*argv, "--backend", "docker"])
    with pytest.raises(SystemExit) as exc:
        build_yield.main()
    assert "no container engine reachable" in str(exc.value.code)
    assert ran == []
    monkeypatch.setattr(sys, "argv", [*argv, "--backend", "both"])  # both: local only, said on stderr
    with pytest.raises(SystemExit) as exc:
        build_yield.main()
    assert "no index entry" in str(exc.value.code)  # got past the engine check (the index is empty)
    assert "local backend only" in capsys.readouterr().err
