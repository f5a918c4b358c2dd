"""References to issues and pull requests in commit messages: `#123`, `(#123)`, `fixes #12`,
`owner/name#7`, and GitHub issue/PR URLs."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cppperf.shared.messages import LinkedText

_URL = re.compile(r"https?://github\.com/([\w.-]+/[\w.-]+)/(issues|pull)/(\d+)")
_QUALIFIED = re.compile(r"(?<![\w/])([\w.-]+/[\w.-]+)#(\d+)\b")
_BARE = re.compile(r"(?:^|(?<=[\s(\[,;:]))(?:GH-|#)(\d+)\b", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Reference:
    repo: str
    number: int
    kind: str = "issue"  # "issue" | "pull" | "issue" when unknown (the issues API serves both)

    @property
    def url(self) -> str:
        path = "pull" if self.kind == "pull" else "issues"
        return f"https://github.com/{self.repo}/{path}/{self.number}"


def parse_references(message: str, repo: str, *, limit: int = 10) -> list[Reference]:
    """All distinct references in order of appearance, at most `limit`."""
    found: dict[tuple[str, int], Reference] = {}
    spans: list[tuple[int, int]] = []
    for mt in _URL.finditer(message):
        kind = "pull" if mt.group(2) == "pull" else "issue"
        found.setdefault((mt.group(1), int(mt.group(3))), Reference(mt.group(1), int(mt.group(3)), kind))
        spans.append(mt.span())
    for mt in _QUALIFIED.finditer(message):
        if any(a <= mt.start() < b for a, b in spans):
            continue
        found.setdefault((mt.group(1), int(mt.group(2))), Reference(mt.group(1), int(mt.group(2))))
        spans.append(mt.span())
    for mt in _BARE.finditer(message):
        if any(a <= mt.start() < b for a, b in spans):
            continue
        found.setdefault((repo, int(mt.group(1))), Reference(repo, int(mt.group(1))))
    return list(found.values())[:limit]


class LinkResolver:
    """Turns references into linked texts. This offline default keeps the references only."""

    fetched: bool = False

    def resolve(self, refs: list[Reference]) -> list[LinkedText]:
        return [LinkedText(kind=r.kind, number=r.number, url=r.url) for r in refs]


class GitHubLinkResolver(LinkResolver):
    """Fetches title and body of each reference through the GitHub client (from the scan thread,
    on the service's event loop), cached in the store's `cache` bucket by `issue/<repo>#<n>`."""

    fetched = True

    def __init__(self, fetch: Callable[[Reference], dict[str, Any] | None]) -> None:
        self._fetch = fetch

    def resolve(self, refs: list[Reference]) -> list[LinkedText]:
        out = []
        for r in refs:
            data = self._fetch(r) or {}
            kind = "pull" if data.get("pull_request") or r.kind == "pull" else "issue"
            out.append(
                LinkedText(
                    kind=kind,
                    number=r.number,
                    url=str(data.get("html_url") or r.url),
                    title=str(data.get("title") or ""),
                    body=str(data.get("body") or "")[:20000],
                )
            )
        return out
