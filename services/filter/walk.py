"""One streaming pass over a repository's history, then details for the commits that pass.

Pass 1 reads `git log --name-status -z --no-renames` through one git process (gitpython's
`as_process`), parsing records as they stream: tree diffs only, so it needs no blobs and works on
a blobless mirror; memory stays bounded whatever the history length. Pass 2 runs `git log -p`
fed the selected shas on stdin (batches in parallel) for the diffs; line counts come from them.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import git

from cppperf.shared.errors import RepoRejected
from cppperf.shared.messages import FileChange
from cppperf.shared.rules import Reason, Rules

_RS = "\x1e"  # record separator: starts each commit
_US = "\x1f"  # unit separator: between header fields
_LOG_FORMAT = "%x1e%H%x1f%P%x1f%cI%x1f%an <%ae>%x1f%B%x1f"


@dataclass(frozen=True)
class CommitHeader:
    sha: str
    parents: tuple[str, ...]
    date: datetime
    author: str
    message: str
    changes: tuple[tuple[str, str], ...]  # (status letter, path)

    @property
    def paths(self) -> list[str]:
        return [p for _, p in self.changes]


@dataclass
class WalkResult:
    scanned: int = 0
    selected: list[CommitHeader] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    rejections: list[tuple[CommitHeader, Reason]] = field(default_factory=list)  # with explain only


def _parse_record(record: str) -> CommitHeader | None:
    parts = record.split(_US, 5)
    if len(parts) < 6:
        return None
    sha, parents, when, author, message, rest = parts
    tokens = rest.lstrip("\0\n").split("\0")
    changes: list[tuple[str, str]] = []
    i = 0
    while i + 1 < len(tokens):
        status = tokens[i].strip()
        if not status:
            i += 1
            continue
        changes.append((status[0], tokens[i + 1]))
        i += 2
    return CommitHeader(
        sha=sha,
        parents=tuple(parents.split()),
        date=datetime.fromisoformat(when),
        author=author,
        message=message.strip(),
        changes=tuple(changes),
    )


def _unborn(repo: git.Repo) -> bool:
    """HEAD names a branch with no commit yet (a fresh `git init`), by the ref files alone."""
    if not repo.head.is_detached:
        ref = repo.head.reference.path
        common = Path(repo.common_dir)
        packed = common / "packed-refs"
        in_packed = packed.is_file() and f" {ref}\n" in packed.read_text(errors="replace")
        return not (common / ref).is_file() and not in_packed
    return False


def iter_commits(repo_path: Path, rev: str = "HEAD", *, chunk: int = 1 << 16) -> Iterator[CommitHeader]:
    """Stream every commit reachable from `rev` with its changed paths (first-parent diffs).
    A repository git cannot read (or a `rev` it does not have) is `RepoRejected` with git's own
    words, never an empty history; a repository with no commit yet walks as empty."""
    try:
        repo = git.Repo(repo_path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise RepoRejected(f"not a git repository: {repo_path} ({type(exc).__name__})") from exc
    if rev == "HEAD" and _unborn(repo):
        return
    proc = repo.git.log(
        rev,
        f"--format={_LOG_FORMAT}",
        "--name-status",
        "-z",
        "--no-renames",
        "--no-color",
        as_process=True,
    )
    stdout = proc.proc.stdout
    assert stdout is not None
    buf = ""
    finished = False
    try:
        while True:
            data = stdout.read(chunk)
            if not data:
                break
            buf += data.decode("utf-8", errors="replace")
            records = buf.split(_RS)
            buf = records.pop()
            for rec in records:
                if rec:
                    header = _parse_record(rec)
                    if header is not None:
                        yield header
        if buf:
            header = _parse_record(buf)
            if header is not None:
                yield header
        finished = True
    finally:
        stdout.close()
        code = proc.proc.wait()
    if finished and code != 0:  # (a consumer that stopped early closed the pipe: not an error)
        err = proc.proc.stderr.read().decode(errors="replace") if proc.proc.stderr is not None else ""
        lines = [ln for ln in err.splitlines() if ln.strip()]
        raise RepoRejected(
            f"git log {rev} failed in {repo_path} (exit {code}): {lines[-1] if lines else 'no output'}"
        )


def judged_commits(
    repo_path: Path, rules: Rules, rev: str = "HEAD"
) -> Iterator[tuple[CommitHeader, Reason | None]]:
    """Every commit as it streams, with the rule that rejects it (None: selected)."""
    for c in iter_commits(repo_path, rev):
        yield c, rules.check(parents=len(c.parents), when=c.date, paths=c.paths)


def walk(repo_path: Path, rules: Rules, *, rev: str = "HEAD", explain: bool = False) -> WalkResult:
    """Apply the structural rules to every commit; keep the selected ones (and rejects if asked)."""
    result = WalkResult()
    for c, reason in judged_commits(repo_path, rules, rev):
        result.scanned += 1
        if reason is None:
            result.selected.append(c)
        else:
            result.rejected[reason.value] += 1
            if explain:
                result.rejections.append((c, reason))
    return result


@dataclass(frozen=True)
class CommitDetails:
    sha: str
    files: list[FileChange]
    diff: str


def commit_details(
    repo_path: Path, commits: Iterable[CommitHeader], *, batch: int = 128, workers: int | None = None
) -> Iterator[CommitDetails]:
    """Diff and line counts for the given commits, in order: one `git log -p` process per batch,
    batches run on all cores. Line counts are counted from the patch itself (asking git for
    `--numstat` as well would make it diff everything twice)."""
    batches: list[list[CommitHeader]] = []
    pending: list[CommitHeader] = []
    for c in commits:
        pending.append(c)
        if len(pending) >= batch:
            batches.append(pending)
            pending = []
    if pending:
        batches.append(pending)
    if not batches:
        return
    n = workers or min(len(batches), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n) as pool:
        # bounded look-ahead keeps memory flat on huge histories
        window = 2 * n
        futures = [pool.submit(_details_batch, repo_path, b) for b in batches[:window]]
        next_batch = window
        while futures:
            done = futures.pop(0).result()
            if next_batch < len(batches):
                futures.append(pool.submit(_details_batch, repo_path, batches[next_batch]))
                next_batch += 1
            yield from done


def count_lines(file_patch: str) -> tuple[int, int]:
    """Added and deleted lines of one file's patch (0, 0 for binary files)."""
    added = deleted = 0
    in_hunk = False
    for line in file_patch.split("\n"):
        if line.startswith("@@"):
            in_hunk = True
        elif not in_hunk:
            continue
        elif line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            deleted += 1
    return added, deleted


def _details_batch(repo_path: Path, commits: list[CommitHeader]) -> list[CommitDetails]:
    by_sha = {c.sha: c for c in commits}
    proc = subprocess.run(
        [
            "git",
            "-C",
            str(repo_path),
            "log",
            "--no-walk=unsorted",
            "--stdin",
            "--format=%x1e%H",
            "-p",
            "--no-renames",
            "--no-color",
            "--no-ext-diff",
        ],
        input="\n".join(by_sha).encode(),
        capture_output=True,
        check=True,
    )
    out: list[CommitDetails] = []
    for rec in proc.stdout.decode("utf-8", errors="replace").split(_RS):
        if not rec.strip():
            continue
        sha, _, body = rec.partition("\n")
        header = by_sha.get(sha.strip())
        if header is None:
            continue
        diff = body.strip("\n") + "\n"
        counts = [count_lines(p) for p in ("\n" + diff).split("\ndiff --git ")[1:]]
        files = [
            FileChange(
                path=path,
                status=status,
                added=counts[i][0] if i < len(counts) else 0,
                deleted=counts[i][1] if i < len(counts) else 0,
            )
            for i, (status, path) in enumerate(header.changes)
        ]
        out.append(CommitDetails(sha=header.sha, files=files, diff=diff))
    return out
