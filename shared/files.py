"""Writing files others read: whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write `data` to `path` through a temporary sibling and `os.replace`, so a reader (or a crash)
    never sees half a file; parent directories are created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    os.replace(tmp, path)
    return path
