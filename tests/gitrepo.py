"""Tiny helper for tests that need a throw-away git repository with a few commits."""

from __future__ import annotations

import subprocess
from pathlib import Path


def commit_files(repo: Path, files: dict[str, str], message: str) -> str:
    """Write `files` (relative path → text) into `repo` (created and `git init`ed on first use),
    commit everything, and return the new commit's sha."""
    git = ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b"]
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        subprocess.run([*git, "init", "-q"], check=True)
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
