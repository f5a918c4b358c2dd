"""CMake's file API (cmake-file-api(7)): a stateless codemodel-v2 query written into a build tree
before configure, and the targets of the reply configure writes (type, artifacts, link command
fragments, dependencies). Read on this host; anything unreadable reads as no targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QUERY = Path(".cmake/api/v1/query/codemodel-v2")
REPLY = Path(".cmake/api/v1/reply")


def write_query(build_dir: Path) -> None:
    """Ask CMake's file API for the codemodel (before configure; `build_dir` on this host)."""
    query = build_dir / QUERY
    query.parent.mkdir(parents=True, exist_ok=True)
    query.touch()


def _read_json(path: Path, inside: Path) -> Any:
    """The JSON at `path` when it is a file inside `inside` (the tree was written by jailed code:
    a name or symlink leading out of the reply is never followed)."""
    try:
        if inside.resolve() not in path.resolve().parents:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def codemodel_targets(build_dir: Path) -> list[dict[str, Any]]:
    """The target objects of the file API's codemodel reply (the first configuration); [] when
    there is none or it is unreadable (a tree that never configured, an old CMake)."""
    reply = build_dir / REPLY
    indexes = sorted(reply.glob("index-*.json")) if reply.is_dir() else []
    index = _read_json(indexes[-1], reply) if indexes else None
    if not isinstance(index, dict):
        return []
    files = [
        o.get("jsonFile")
        for o in index.get("objects", [])
        if isinstance(o, dict) and o.get("kind") == "codemodel"
    ]
    model = _read_json(reply / str(files[0]), reply) if files and files[0] else None
    configs = model.get("configurations") if isinstance(model, dict) else None
    if not configs or not isinstance(configs[0], dict):
        return []
    out = []
    for ref in configs[0].get("targets", []):
        target = _read_json(reply / str(ref.get("jsonFile", "")), reply) if isinstance(ref, dict) else None
        if isinstance(target, dict):
            out.append(target)
    return out
