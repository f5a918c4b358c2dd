"""Repository search past GitHub's 1,000-result cap (the SEART approach).

A query is split by star range, then by creation date, halving any slice whose `total_count`
exceeds 1,000, until every slice can be paged through whole (10 pages of 100). The root slice and
every finished slice are recorded through a `Progress` object (the store's `progress` bucket in
the service), so a restarted crawl resumes where it stopped and splits the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Protocol

from cppperf.shared.github import SEARCH_CAP, GitHubClient
from cppperf.shared.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, order=True)
class Slice:
    stars_lo: int
    stars_hi: int
    created_from: date
    created_to: date

    def query(self, base: str) -> str:
        return (
            f"{base} stars:{self.stars_lo}..{self.stars_hi} "
            f"created:{self.created_from.isoformat()}..{self.created_to.isoformat()}"
        )

    def key(self) -> str:
        return f"{self.stars_lo}-{self.stars_hi}-{self.created_from}-{self.created_to}"

    def split(self) -> tuple[Slice, Slice] | None:
        if self.stars_hi > self.stars_lo:
            mid = (self.stars_lo + self.stars_hi) // 2
            return (
                Slice(self.stars_lo, mid, self.created_from, self.created_to),
                Slice(mid + 1, self.stars_hi, self.created_from, self.created_to),
            )
        days = (self.created_to - self.created_from).days
        if days >= 1:
            mid_day = self.created_from + timedelta(days=days // 2)
            return (
                Slice(self.stars_lo, self.stars_hi, self.created_from, mid_day),
                Slice(self.stars_lo, self.stars_hi, mid_day + timedelta(days=1), self.created_to),
            )
        return None


class Progress(Protocol):
    """Where a crawl keeps its root slice and finished slices (the store's `progress` bucket)."""

    async def root(self) -> str | None: ...
    async def set_root(self, key: str) -> None: ...
    async def done_slices(self) -> set[str]: ...
    async def mark_done(self, key: str, count: int) -> None: ...


@dataclass
class MemoryProgress:
    root_key: str | None = None
    done: dict[str, int] = field(default_factory=dict)

    async def root(self) -> str | None:
        return self.root_key

    async def set_root(self, key: str) -> None:
        self.root_key = key

    async def done_slices(self) -> set[str]:
        return set(self.done)

    async def mark_done(self, key: str, count: int) -> None:
        self.done[key] = count


def parse_slice(key: str) -> Slice:
    lo, hi, rest = key.split("-", 2)
    a, b = rest[:10], rest[11:]
    return Slice(int(lo), int(hi), date.fromisoformat(a), date.fromisoformat(b))


@dataclass
class SearchStats:
    queries: int = 0
    slices: int = 0
    truncated_slices: int = 0
    repos: int = 0


async def search_repositories(
    client: GitHubClient,
    *,
    min_stars: int,
    progress: Progress,
    language: str = "C++",
    created_from: date = date(2008, 1, 1),
    created_to: date | None = None,
    stats: SearchStats | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Every non-fork, non-archived repository matching, past the 1,000-result cap."""
    stats = stats or SearchStats()
    base = f"language:{language} fork:false archived:false"
    created_to = created_to or date.today()
    per_page = min(client.settings.search_page_size, 100)
    root_key = await progress.root()
    if root_key is None:  # a new crawl: fix its root so a restart splits it the same way
        top = await client.search_page(f"{base} stars:>={min_stars}", page=1, per_page=1)
        stats.queries += 1
        if not top.get("items"):
            return
        max_stars = int(top["items"][0]["stargazers_count"])
        root_key = Slice(min_stars, max_stars, created_from, created_to).key()
        await progress.set_root(root_key)
    done = await progress.done_slices()
    stack = [parse_slice(root_key)]
    while stack:
        sl = stack.pop()
        if sl.key() in done:
            continue
        first = await client.search_page(sl.query(base), page=1, per_page=per_page)
        stats.queries += 1
        total = int(first.get("total_count", 0))
        if total > SEARCH_CAP:
            parts = sl.split()
            if parts is not None:
                stack.extend(reversed(parts))
                continue
            stats.truncated_slices += 1
            log.warning("search_slice_truncated", slice=sl.key(), total=total)
        items = list(first.get("items", []))
        page = 1
        while len(items) < min(total, SEARCH_CAP) and page * per_page < SEARCH_CAP:
            page += 1
            more = await client.search_page(sl.query(base), page=page, per_page=per_page)
            stats.queries += 1
            if not more.get("items"):
                break
            items += more["items"]
        for item in items:
            if item.get("fork") or item.get("archived"):
                continue
            stats.repos += 1
            yield item
        stats.slices += 1
        await progress.mark_done(sl.key(), len(items))
