"""The Python API: scan a repository, prove one commit, evaluate one patch -- the same code the
CLI runs (`evaluate` through the CLI's evaluator client, `cppperf.client`: here, or on a bus's
evaluator services with `nats_url=`). `import cppperf` exposes these functions.

    import cppperf

    for commit in cppperf.scan("/tmp/demo", since="2024-01-01"):   # a generator, like PyDriller's
        print(commit.sha, commit.message)
    proof = cppperf.prove("/tmp/demo", commit.sha, runs=11, out_dir="cppperf-out")
    print(proof.instance.verdict, [t.name for t in proof.instance.tests if t.improved])
    report = cppperf.evaluate(proof.instance_id, patch_text, out_dir="cppperf-out")
    print(report.verdict, report.opt, report.gm_speedup_agent)

Results are typed (`cppperf.shared.domain`'s msgspec Structs: `InstanceMeta`, `EvalReport`);
the files on disk are the same as the CLI's. Errors are `ValueError` for bad input (no such
repository or commit, a merge commit without `parent`, a bad date) and
`cppperf.shared.errors.CppPerfError` subclasses for everything else.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from cppperf.shared.domain import EvalReport, InstanceMeta, decode_record, to_json_dict

if TYPE_CHECKING:
    from cppperf.services.filter.walk import CommitHeader
    from cppperf.shared.messages import CommitSelected
    from cppperf.shared.settings import Settings

__all__ = ["Proof", "ScanProgress", "commit_from_repo", "evaluate", "prove", "scan", "settings"]

T = TypeVar("T", bound=msgspec.Struct)


def typed(kind: type[T], data: Mapping[str, Any]) -> T:
    """`data` (a record section or report as the pipeline builds it) as the Struct `kind`; keys the
    Struct does not declare are left out (the files on disk keep them)."""
    fields = set(kind.__struct_fields__)
    return msgspec.convert({k: v for k, v in data.items() if k in fields}, kind, strict=False)


class Proof(msgspec.Struct, frozen=True, kw_only=True):
    """What `prove` returns: the typed `cppperf` section of the instance record, the whole record
    (as written to `path`, the published keys included) and the expert's patch."""

    instance: InstanceMeta
    record: dict[str, Any]
    path: str

    @property
    def instance_id(self) -> str:
        return self.instance.instance_id

    @property
    def patch(self) -> str:
        """The commit's diff as a git patch (what `--predictions gold` submits)."""
        from cppperf.dataset.records import git_patch

        return git_patch(decode_record(self.record))


@dataclass(frozen=True)
class ScanProgress:
    """What `scan`'s `progress` callback gets after each commit walked."""

    scanned: int
    selected: int
    rejected: Mapping[str, int]  # per reason
    commit: CommitHeader  # the commit just judged
    reason: str | None  # why it was rejected; None: selected


DateLike = datetime | date | str


def _when(value: DateLike, *, end: bool) -> datetime:
    """A `since`/`until` bound: a datetime (naive: UTC), a date or an ISO string (a bare date
    covers the whole day, so `until="2024-03-31"` includes that day)."""
    if isinstance(value, str):
        try:
            value = date.fromisoformat(value) if len(value) == 10 else datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"bad date {value!r}: YYYY-MM-DD or an ISO datetime") from None
    if not isinstance(value, datetime):
        value = datetime.combine(value, time.max if end else time.min)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


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


def scan(
    repo: str | Path,
    *,
    since: DateLike | None = None,
    until: DateLike | None = None,
    progress: Callable[[ScanProgress], None] | None = None,
    rev: str = "HEAD",
    s: Settings | None = None,
) -> Iterator[CommitHeader]:
    """The structural filter over a local repository's history (`cppperf filter`), as a
    generator: each selected commit (`.sha`, `.date`, `.author`, `.message`, `.paths`) as the walk
    reaches it, newest first. `since`/`until` (datetime, date or ISO string; default the
    `mining.since/until` settings) bound the commit dates; `progress` is called after every commit
    walked, selected or not. Bad input raises `ValueError` here, before the walk starts."""
    from cppperf.services.filter.walk import judged_commits
    from cppperf.shared.rules import Rules, Window

    s = s or settings()
    path = _repo(repo)
    rules = Rules.from_settings(s.mining)
    window = Window(
        _when(since, end=False) if since is not None else rules.window.since,
        _when(until, end=True) if until is not None else rules.window.until,
    )
    if window.since > window.until:
        raise ValueError(f"since {window.since.isoformat()} is after until {window.until.isoformat()}")
    rules.window = window

    def walk() -> Iterator[CommitHeader]:
        selected = 0
        rejected: Counter[str] = Counter()
        for scanned, (commit, reason) in enumerate(judged_commits(path, rules, rev), start=1):
            if reason is None:
                selected += 1
            else:
                rejected[reason.value] += 1
            if progress is not None:
                progress(
                    ScanProgress(scanned, selected, dict(rejected), commit, reason.value if reason else None)
                )
            if reason is None:
                yield commit

    return walk()


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
) -> Proof:
    """Build and time `sha` against its parent (`cppperf build`); writes the instance record to
    OUT/instances and returns it typed (`.instance.verdict`, `.instance.tests`, …, `.record`)."""
    from cppperf.dataset.records import instance_path
    from cppperf.services.builder.service import build_patch

    overrides: dict[str, Any] = {}
    if out_dir is not None:
        overrides["out_dir"] = str(out_dir)
    if runs is not None:
        overrides["builder"] = {"runs": runs}
    s = s or settings(**overrides)
    commit = commit_from_repo(repo, sha, parent=parent, name=name)
    built = build_patch(commit, _repo(repo), s.builder, work_dir=s.work_dir(), out_dir=Path(s.out_dir))
    return Proof(
        instance=built.record.cppperf,
        record=to_json_dict(built.record),
        path=str(instance_path(Path(s.out_dir), built.record.cppperf.instance_id)),
    )


def evaluate(
    instance_id: str,
    patch: str,
    *,
    model: str = "manual",
    run_id: str = "default",
    runs: int | None = None,
    out_dir: str | Path | None = None,
    force: bool = False,
    nats_url: str | None = None,
    creds: str | Path | None = None,
    s: Settings | None = None,
) -> EvalReport:
    """Score one agent patch (`cppperf evaluate`): the typed report (`.verdict`, `.opt`,
    `.gm_speedup_agent`, `.gm_speedup_expert`, `.per_test`, …), as written to
    OUT/runs/<run_id>/<model>/<instance_id>/report.json. Here, on an instance of OUT/instances
    (finished reports are reused); or, with `nats_url`, by the evaluator services on that bus, as
    the agent of `creds` (`cppperf agents add`; none: the open development bus's `local`) -- the
    one client the CLI uses too (`cppperf.client.evaluate_rows`)."""
    from cppperf.client import evaluate_rows
    from cppperf.dataset.records import instance_path

    overrides: dict[str, Any] = {}
    if out_dir is not None:
        overrides["out_dir"] = str(out_dir)
    if runs is not None:
        overrides["evaluator"] = {"runs": runs}
    if nats_url is not None:
        overrides["nats_url"] = nats_url
    s = s or settings(**overrides)
    if not s.nats_url and not instance_path(Path(s.out_dir), instance_id).is_file():
        raise ValueError(f"unknown instance {instance_id} (no {instance_path(Path(s.out_dir), instance_id)})")
    row = {"instance_id": instance_id, "model_name_or_path": model, "model_patch": patch}
    [report] = evaluate_rows(s, [row], run_id, creds=str(creds) if creds else None, force=force)
    return report
