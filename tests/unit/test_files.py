"""`write_atomic` on the targets a user names: a symlink is written through (the link stays), a
FIFO is written into (never replaced by a regular file), a folder is IsADirectoryError, and a
regular file is replaced whole and durably (the data fsynced before the rename, the folder after)."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path
from typing import Any

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


def _record_disk_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record, in order, each fsync (by the path its descriptor names) and each rename."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_the_data_is_fsynced_before_the_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.json"
    target.write_text("old")
    events = _record_disk_calls(monkeypatch)
    write_atomic(target, "new")
    at = events.index(("replace", str(target)))
    before, after = events[:at], events[at + 1 :]
    assert [kind for kind, _ in before] == ["fsync"]
    assert Path(before[0][1]).name.startswith(".a.json.")  # the temporary file, with the data in
    assert after == [("fsync", str(tmp_path))]
    assert target.read_text() == "new"


def test_folders_it_creates_are_made_durable_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "x" / "y" / "a.json"
    events = _record_disk_calls(monkeypatch)
    write_atomic(target, "new")
    synced = [p for kind, p in events[events.index(("replace", str(target))) + 1 :]]
    assert synced == [str(tmp_path / "x" / "y"), str(tmp_path / "x"), str(tmp_path)]


def test_a_failed_fsync_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.json"
    target.write_text("old")

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomic(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_folder_that_cannot_be_fsynced_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # as on a mount whose folders refuse fsync
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "a.json", "new")
    assert (tmp_path / "a.json").read_text() == "new"
