"""Writing files others read: whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and `os.replace`, so a
    reader (or a crash) never sees half a file; parent directories are created. The file gets
    `mode`, else what a plain `open()` would give (0666 less the umask: records, exports and
    reports are read by people and other processes), set before the rename. Secrets are not
    written here (creds files are created 0600 by their own writer).

    A symlink is written through (its target is replaced, the link stays); a target that is not a
    regular file or folder (`/dev/stdout`, a FIFO, a device) is written into, never replaced by a
    regular file; a folder is IsADirectoryError."""
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = ""
    try:  # a KeyboardInterrupt right after mkstemp must not leave the temporary file either
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            os.fchmod(fh.fileno(), 0o666 & ~_umask() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    """The process's umask, read without changing it (`os.umask` sets it, racing other threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022
