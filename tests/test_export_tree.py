"""Exporting a commit's tree on a Python without tarfile's extraction filters (before 3.11.4:
Debian bookworm's 3.11.2, which the shipped image runs): the same trees come out, and an
archive member that would leave the tree is refused as the `data` filter refuses it."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from cppperf.shared.engine import backend
from cppperf.shared.engine.backend import export_tree
from tests.gitrepo import commit_files


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_text())
        for p in sorted(root.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


def test_without_extraction_filters_the_same_tree_comes_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    commit_files(repo, {"src/a.cpp": "int a;\n", "run.sh": "#!/bin/sh\n"}, "v1")
    (repo / "run.sh").chmod(0o755)
    os.symlink("src/a.cpp", repo / "link.cpp")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "v2"],
        check=True,
    )
    sha = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    export_tree(repo, sha, tmp_path / "with")
    monkeypatch.delattr(tarfile, "data_filter")
    export_tree(repo, sha, tmp_path / "without")
    assert _tree(tmp_path / "without") == _tree(tmp_path / "with")
    assert _tree(tmp_path / "without")["link.cpp"] == "-> src/a.cpp"
    assert os.access(tmp_path / "without" / "run.sh", os.X_OK)


def _archive(*members: tarfile.TarInfo) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size) if m.isreg() else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf)


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname, m.mode, m.size = kind, link, mode, 1 if kind == tarfile.REGTYPE else 0
    return m


@pytest.mark.parametrize(
    "member",
    [
        _member("/etc/evil"),
        _member("../evil"),
        _member("a/../../evil"),
        _member("up", tarfile.SYMTYPE, "../../etc"),
        _member("abs", tarfile.SYMTYPE, "/etc/passwd"),
        _member("hard", tarfile.LNKTYPE, "../outside"),
        _member("dev", tarfile.CHRTYPE),
        _member("fifo", tarfile.FIFOTYPE),
    ],
    ids=[
        "absolute",
        "dotdot",
        "nested-dotdot",
        "symlink-out",
        "symlink-absolute",
        "hardlink-out",
        "device",
        "fifo",
    ],
)
def test_a_member_that_leaves_the_tree_is_refused(member: tarfile.TarInfo, tmp_path: Path) -> None:
    with (
        _archive(_member("ok.cpp"), member) as tar,
        pytest.raises(tarfile.TarError, match="refused archive member"),
    ):
        backend._data_members(tar, tmp_path)


def test_set_id_bits_and_owners_are_dropped(tmp_path: Path) -> None:
    with _archive(
        _member("tool", mode=0o4755), _member("plain", mode=0o666), _member("inside", tarfile.SYMTYPE, "tool")
    ) as tar:
        modes = {m.name: (m.mode, m.uid) for m in backend._data_members(tar, tmp_path)}
    assert modes["tool"] == (0o755, 0) and modes["plain"] == (0o644, 0)
