"""The Python API: scan a repository, prove one commit, evaluate one patch -- the same code the
CLI runs, without a bus. `import cppperf` exposes these functions.

    import cppperf

    found = cppperf.scan("/tmp/demo")                       # structural filter over the history
    record = cppperf.prove("/tmp/demo", found.selected[-1].sha, runs=11, out_dir="cppperf-out")
    report = cppperf.evaluate(record["cppperf"]["instance_id"], patch_text, out_dir="cppperf-out")

Errors are `ValueError` for bad input (no such repository or commit, a merge commit without
`parent`) and `cppperf.shared.errors.CppPerfError` subclasses for everything else.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cppperf.services.filter.walk import WalkResult
    from cppperf.shared.messages import CommitSelected
    from cppperf.shared.settings import Settings

__all__ = ["commit_from_repo", "evaluate", "prove", "scan", "settings"]


def settings(**overrides: Any) -> Settings:
    """Defaults < ./cppperf.toml < CPPPERF_* environment < `overrides` (nested dicts per section,
    e.g. `settings(out_dir="results", builder={"runs": 11})`)."""
    from cppperf.shared.settings import load_settings

    return load_settings(None, **overrides)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)


def _repo(path: str | Path) -> Path:
    repo = Path(path).expanduser()
    if not repo.is_dir() or _git(repo, "rev-parse", "--git-dir").returncode != 0:
        raise ValueError(f"{path} is not a git repository")
    return repo.resolve()


def scan(repo: str | Path, *, explain: bool = False, s: Settings | None = None) -> WalkResult:
    """The structural filter over a local repository's history (`cppperf filter`): `.scanned`,
    `.selected` commits (sha, date, message, paths), `.rejected` counts per reason."""
    from cppperf.services.filter.walk import walk
    from cppperf.shared.rules import Rules

    s = s or settings()
    return walk(_repo(repo), Rules.from_settings(s.mining), explain=explain)


def commit_from_repo(
    repo: str | Path, sha: str, *, parent: str | None = None, name: str | None = None
) -> CommitSelected:
    """One commit of a local repository as the builder's input. A merge commit needs `parent`
    (which side to compare against). The repository id is `name`, else the GitHub `origin`
    remote's owner/name, else `local/<folder>`."""
    from cppperf.cli.repos import local_repo_id
    from cppperf.services.filter.links import LinkResolver
    from cppperf.services.filter.select import to_message
    from cppperf.services.filter.walk import CommitHeader, commit_details, iter_commits
    from cppperf.shared.errors import BadInput
    from cppperf.shared.mirror import rev_parse

    path = _repo(repo)
    try:
        full_sha = rev_parse(path, sha)
    except BadInput:
        raise ValueError(f"unknown commit {sha} in {repo}") from None
    header = next(iter_commits(path, f"{full_sha}^!" if parent is None else full_sha), None)
    if header is None or header.sha != full_sha:
        raise ValueError(f"cannot read commit {sha}")
    if parent is None and len(header.parents) > 1:
        raise ValueError(
            f"{sha} is a merge commit ({len(header.parents)} parents): give the parent to compare with (--parent)"
        )
    if parent is not None:
        try:
            parent_sha = rev_parse(path, parent)
        except BadInput:
            raise ValueError(f"unknown commit {parent} in {repo}") from None
        header = CommitHeader(
            header.sha, (parent_sha,), header.date, header.author, header.message, header.changes
        )
    if not header.parents:
        raise ValueError(f"{sha} is a root commit: give a parent to compare with")
    details = next(commit_details(path, [header]))
    return to_message(local_repo_id(path, name), str(path), header, details, LinkResolver())


def prove(
    repo: str | Path,
    sha: str,
    *,
    parent: str | None = None,
    name: str | None = None,
    runs: int | None = None,
    out_dir: str | Path | None = None,
    s: Settings | None = None,
) -> dict[str, Any]:
    """Build and time `sha` against its parent (`cppperf build`); writes and returns the instance
    record (`record["cppperf"]["verdict"]`, `["tests"]`, …)."""
    from cppperf.services.builder.service import build_patch

    overrides: dict[str, Any] = {}
    if out_dir is not None:
        overrides["out_dir"] = str(out_dir)
    if runs is not None:
        overrides["builder"] = {"runs": runs}
    s = s or settings(**overrides)
    commit = commit_from_repo(repo, sha, parent=parent, name=name)
    built = build_patch(commit, _repo(repo), s.builder, work_dir=s.work_dir(), out_dir=Path(s.out_dir))
    return built.record


def evaluate(
    instance_id: str,
    patch: str,
    *,
    model: str = "manual",
    run_id: str = "default",
    runs: int | None = None,
    out_dir: str | Path | None = None,
    force: bool = False,
    s: Settings | None = None,
) -> dict[str, Any]:
    """Score one agent patch on an instance of OUT/instances (`cppperf evaluate`): the report
    (`verdict`, `opt`, `gm_speedup_agent`, `gm_speedup_expert`, …). Finished reports are reused."""
    from cppperf.dataset.records import instance_path
    from cppperf.services.evaluator.pipeline import EvalRequest
    from cppperf.services.evaluator.pipeline import evaluate as evaluate_one

    overrides: dict[str, Any] = {}
    if out_dir is not None:
        overrides["out_dir"] = str(out_dir)
    if runs is not None:
        overrides["evaluator"] = {"runs": runs}
    s = s or settings(**overrides)
    if not instance_path(Path(s.out_dir), instance_id).is_file():
        raise ValueError(f"unknown instance {instance_id} (no {instance_path(Path(s.out_dir), instance_id)})")
    return evaluate_one(EvalRequest(run_id, model, instance_id, patch), s, force=force)
