"""The filter stage's plain logic: scan one repository and build `CommitSelected` messages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cppperf.services.filter.links import LinkResolver, parse_references
from cppperf.services.filter.walk import CommitDetails, CommitHeader, commit_details, walk
from cppperf.shared.messages import CommitSelected
from cppperf.shared.rules import Rules


@dataclass
class ScanSummary:
    repo: str
    scanned: int = 0
    selected: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"scanned": self.scanned, "selected": self.selected, "rejected": dict(self.rejected)}


def to_message(
    repo: str, url: str, header: CommitHeader, details: CommitDetails, resolver: LinkResolver
) -> CommitSelected:
    refs = parse_references(header.message, repo)
    return CommitSelected(
        repo=repo,
        url=url,
        sha=header.sha,
        parent=header.parents[0] if header.parents else "",
        date=header.date.isoformat(),
        author=header.author,
        message=header.message,
        files=details.files,
        linked=resolver.resolve(refs) if refs else [],
        links_fetched=resolver.fetched,
        diff=details.diff,
    )


def scan_repository(
    path: Path,
    *,
    repo: str,
    url: str,
    rules: Rules,
    resolver: LinkResolver | None = None,
    emit: Callable[[CommitSelected], None],
    rev: str = "HEAD",
) -> ScanSummary:
    """Walk `path`, call `emit` for each selected commit (oldest first), return the counts.

    A root commit (no parent) cannot be compared with anything and is not emitted.
    """
    resolver = resolver or LinkResolver()
    result = walk(path, rules, rev=rev)
    summary = ScanSummary(repo=repo, scanned=result.scanned, rejected=dict(result.rejected))
    candidates = [c for c in reversed(result.selected) if c.parents]
    if len(candidates) < len(result.selected):
        summary.rejected["root-commit"] = len(result.selected) - len(candidates)
    headers = {c.sha: c for c in candidates}
    for details in commit_details(path, candidates):
        emit(to_message(repo, url, headers[details.sha], details, resolver))
        summary.selected += 1
    return summary
