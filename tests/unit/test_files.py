"""`write_atomic` on the targets a user names: a symlink is written through (the link stays), a
FIFO is written into (never replaced by a regular file), a folder is IsADirectoryError, and a
regular file is replaced whole."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from cppperf.shared.files import write_atomic


def test_a_regular_file_is_replaced_whole_and_no_temporary_is_left(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    target.write_text("old")
    write_atomic(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_symlink_is_written_through(tmp_path: Path) -> None:
    real = tmp_path / "sub" / "real.txt"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "later.txt")
    write_atomic(link, "x")
    assert link.is_symlink() and (tmp_path / "later.txt").read_text() == "x"


def test_a_fifo_is_written_into_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_atomic(fifo, "streamed")
    reader.join(timeout=10)
    assert got == [b"streamed"] and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_folder_is_is_a_directory_error_and_stays(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    (folder / "inside").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        write_atomic(folder, "x")
    assert (folder / "inside").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["d"]
