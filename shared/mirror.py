"""Local mirrors: one bare, blobless clone per repository per host, shared by workers (file lock).

Local paths are read in place (never cloned). URLs are cloned once with `--filter=blob:none`
(trees and commits only: enough for the structural walk; blobs arrive lazily for the few diffs
we need) and fetched on later visits. A bare clone has no `remote.origin.fetch`, so a plain
`git fetch` would leave its branches where they were cloned: every visit sets `MIRROR_REFSPECS`
(branches and tags onto the mirror's own, forced, pruned) before fetching, so a later crawl sees
upstream's new commits (mirrors made by older versions are fixed on their next visit). Every URL
and path given to git comes after `--`, so none is read as an option.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cppperf.shared.errors import BadInput, TransientError
from cppperf.shared.files import locked
from cppperf.shared.logging import scrub_text


def is_remote(url: str) -> bool:
    return "://" in url or url.startswith("git@")


MIRROR_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")


def _git(*args: str, timeout: float) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True, timeout=timeout)


def _set_refspecs(target: Path, timeout: float) -> None:
    git_dir = f"--git-dir={target}"
    subprocess.run(
        ["git", git_dir, "config", "--unset-all", "remote.origin.fetch"], capture_output=True, check=False
    )
    for spec in MIRROR_REFSPECS:
        _git(git_dir, "config", "--add", "remote.origin.fetch", spec, timeout=timeout)


def mirror_path(mirror_dir: Path, repo: str) -> Path:
    return mirror_dir / (repo.replace("/", "__") + ".git")


def ensure_local(url: str, repo: str, mirror_dir: Path, *, timeout: float = 1800) -> Path:
    """A local git directory holding `url`'s history (cloned or refreshed under a lock)."""
    if not is_remote(url):
        path = Path(url).expanduser().resolve()
        if not (path / ".git").exists() and not (path / "HEAD").exists():
            raise BadInput(f"{url}: not a git repository")
        return path
    target = mirror_path(mirror_dir, repo)
    with locked(target.with_suffix(".lock")):
        try:
            if not target.exists():
                _git("clone", "--bare", "--filter=blob:none", "--", url, str(target), timeout=timeout)
            _set_refspecs(target, timeout)
            _git(f"--git-dir={target}", "fetch", "--prune", "--filter=blob:none", "origin", timeout=timeout)
        except subprocess.CalledProcessError as exc:
            raise TransientError(
                scrub_text(f"git could not mirror {url}: {exc.stderr.decode(errors='replace')[-500:]}")
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise TransientError(scrub_text(f"git mirror of {url} timed out")) from exc
    return target


def rev_parse(repo: Path, rev: str = "HEAD") -> str:
    """The full sha `rev` names in `repo`; `BadInput` naming git's reason when it names none."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BadInput(f"{repo}: cannot resolve {rev!r} to a commit {proc.stderr.strip()}".rstrip())
    return proc.stdout.strip()


def commit_date(repo: Path, sha: str) -> str:
    """The committer date of `sha` (ISO 8601)."""
    return subprocess.run(
        ["git", "-C", str(repo), "log", "-1", "--format=%cI", sha],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
