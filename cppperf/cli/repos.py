"""Checking `--repo`/`--name` at parse time and naming local clones `owner/name` so their
instance ids (`owner__name-<sha12>`) join CppPerf-DB's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import typer

OWNER_NAME = re.compile(r"^[\w.-]+/[\w.-]+$")
_GITHUB_REMOTE = re.compile(r"github\.com[:/]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


def looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", ".", "~")) or Path(spec).expanduser().exists()


def git_repo(spec: str | Path, option: str = "--repo") -> Path:
    """An existing local git repository (work tree or bare), else a usage error naming it."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise typer.BadParameter(f"{spec}: no such directory", param_hint=option)
    if not path.is_dir():
        raise typer.BadParameter(f"{spec} is not a directory", param_hint=option)
    res = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--git-dir"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise typer.BadParameter(f"{spec} is not a git repository", param_hint=option)
    return path


def check_name(name: str | None) -> str | None:
    if name is not None and not OWNER_NAME.match(name):
        raise typer.BadParameter(f"{name!r} is not owner/name", param_hint="--name")
    return name


def github_origin(path: Path) -> str | None:
    """`owner/name` when the clone's `origin` remote names a GitHub repository."""
    res = subprocess.run(
        ["git", "-C", str(path), "remote", "get-url", "origin"], capture_output=True, text=True, check=False
    )
    m = _GITHUB_REMOTE.search(res.stdout.strip()) if res.returncode == 0 else None
    return f"{m.group(1)}/{m.group(2)}" if m else None


def local_repo_id(path: Path, name: str | None = None) -> str:
    """`--name`, else the GitHub `origin`, else `local/<folder>`."""
    return name or github_origin(path) or f"local/{path.resolve().name}"
