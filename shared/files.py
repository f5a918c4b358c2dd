"""Writing files others read: whole or not at all; taking turns on a file between processes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(path: Path, *, remove: bool = False) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created, with its folders) until the block ends: the
    processes sharing the file system that lock it take turns; the kernel releases it when a
    holder dies. The file stays (removing it would let a waiter and a newcomer both hold one),
    unless `remove`: a marker only one holder ever locks (an evaluation's workspace), removed
    before the lock is released — a file left with nobody holding it is a holder that died."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # a lock: nobody else's to read
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if remove:
                path.unlink(missing_ok=True)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and `os.replace`, so a
    reader (or a crash) never sees half a file; parent directories are created. The file gets
    `mode`, else what a plain `open()` would give (0666 less the umask: records, exports and
    reports are read by people and other processes), set before the rename. Secrets are not
    written here (creds files are created 0600 by their own writer).

    A symlink is written through (its target is replaced, the link stays); a target that is not a
    regular file or folder (`/dev/stdout`, a FIFO, a device) is written into, never replaced by a
    regular file; a folder is IsADirectoryError.

    Durable once it returns: the temporary file is fsynced before the rename and the folder after
    it (and every folder this call created, up to the first that existed), so a crash or power loss
    leaves the old file or the new one, never an empty or half one (ext4/xfs may otherwise commit
    the rename before the data). A filesystem that cannot fsync a folder (EINVAL) is not an error."""
    try:
        st = os.stat(path)  # follows symlinks
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as stream:
            stream.write(data.encode() if isinstance(data, str) else data)
        return path
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    created = _missing_folders(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = ""
    try:  # a KeyboardInterrupt right after mkstemp must not leave the temporary file either
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            os.fchmod(fh.fileno(), 0o666 & ~_umask() if mode is None else mode)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for folder in [path.parent, *(p.parent for p in created)]:  # the new entry, then new folders'
        _fsync_folder(folder)
    return path


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and its ancestors that do not exist yet, deepest first (what `mkdir(parents=True)`
    is about to create: each one's entry in its own parent must reach the disk too)."""
    missing: list[Path] = []
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing


def _fsync_folder(folder: Path) -> None:
    """fsync a folder so a rename or a creation in it is on disk; a filesystem that cannot
    (EINVAL, ENOTSUP on some network and FUSE mounts) is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):  # a folder we may write into but not read
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it (`os.umask` sets it, racing other threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022
