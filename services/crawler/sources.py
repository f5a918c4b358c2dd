"""Turn the user's `--repo` arguments into candidates: `owner/name` (GitHub), a git URL, or a
local path (offline mining: `local/<dirname>`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from cppperf.shared.messages import RepoCandidate

_OWNER_NAME = re.compile(r"^[\w.-]+/[\w.-]+$")
_URL_REPO = re.compile(r"[:/]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


def candidate_for(spec: str, *, github_url: str = "https://github.com") -> RepoCandidate:
    path = Path(spec).expanduser()
    if path.exists():
        resolved = path.resolve()
        return RepoCandidate(repo=f"local/{resolved.name}", url=str(resolved), source="path")
    if "://" in spec or spec.startswith("git@"):
        mt = _URL_REPO.search(spec)
        repo = (
            f"{mt.group(1)}/{mt.group(2)}" if mt else "url/" + hashlib.sha256(spec.encode()).hexdigest()[:12]
        )
        return RepoCandidate(repo=repo, url=spec, source="url")
    if _OWNER_NAME.match(spec):
        return RepoCandidate(repo=spec, url=f"{github_url}/{spec}.git", source="list")
    raise ValueError(f"{spec!r} is neither an existing path, a git URL, nor owner/name")
