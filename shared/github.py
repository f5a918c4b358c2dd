"""GitHub through githubkit: rate-limit aware requests with a rotating token pool; search pages,
trees and issue/PR texts. Used by the crawler (search, static checks) and the filter (linked texts).

Rate limits: githubkit raises `PrimaryRateLimitExceeded`/`SecondaryRateLimitExceeded` with the
wait GitHub asked for (`retry-after`, or `x-ratelimit-reset`); we then move to the next token that
is not resting, or sleep until the first one is ready. A response reporting
`x-ratelimit-remaining: 0` rests its token until the reset before the next call. A 403/429
without rate-limit headers backs off exponentially. Waits longer than `github.max_wait` raise
`ServiceUnavailable`. Tokens are registered with the log scrubber and never logged.

"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from githubkit import GitHub
from githubkit.exception import RateLimitExceeded, RequestFailed

from cppperf.shared.errors import ServiceUnavailable
from cppperf.shared.logging import get_logger, register_secret
from cppperf.shared.settings import GitHubSettings

log = get_logger(__name__)
SEARCH_CAP = 1000
Sleep = Callable[[float], Awaitable[None]]


@dataclass
class _Token:
    value: str | None
    ready_at: float = 0.0
    client: GitHub[Any] | None = None


class GitHubClient:
    def __init__(
        self,
        settings: GitHubSettings,
        *,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        self._clock = clock
        tokens = settings.tokens or [None]  # type: ignore[list-item]
        self._tokens = [_Token(t) for t in tokens]
        for t in settings.tokens:
            register_secret(t)
        self._current = 0
        self._transport = transport
        self.requests = 0
        self.waited = 0.0

    def _client(self, tok: _Token) -> GitHub[Any]:
        if tok.client is None:
            tok.client = GitHub(
                tok.value,
                base_url=self.settings.api_url,
                auto_retry=False,
                timeout=30.0,
                async_transport=self._transport,
            )
        return tok.client

    def _pick(self) -> _Token:
        """The current token if ready, else the next ready one (rotation), else the soonest."""
        now = self._clock()
        n = len(self._tokens)
        for i in range(n):
            tok = self._tokens[(self._current + i) % n]
            if tok.ready_at <= now:
                self._current = (self._current + i) % n
                return tok
        return min(self._tokens, key=lambda t: t.ready_at)

    async def get(self, path: str, params: dict[str, Any] | None = None) -> tuple[Any, httpx.Headers]:
        backoff = 1.0
        while True:
            tok = self._pick()
            wait = tok.ready_at - self._clock()
            if wait > 0:
                if wait > self.settings.max_wait:
                    raise ServiceUnavailable(f"GitHub rate limit: next token ready in {wait:.0f}s")
                log.info("github_rate_limit_wait", seconds=round(wait, 1))
                self.waited += wait
                await self._sleep(wait)
            self.requests += 1
            try:
                resp = await self._client(tok).arequest("GET", path, params=params)
            except RateLimitExceeded as exc:
                tok.ready_at = self._clock() + max(exc.retry_after.total_seconds(), 1.0)
                self._current = (self._tokens.index(tok) + 1) % len(self._tokens)
                continue
            except RequestFailed as exc:
                status = exc.response.status_code
                if status in (403, 429):  # abuse detection without rate-limit headers
                    tok.ready_at = self._clock() + backoff
                    backoff = min(backoff * 2, 300.0)
                    continue
                raise
            except httpx.HTTPError as exc:
                raise ServiceUnavailable(f"GitHub unreachable: {exc}") from exc
            headers = resp.headers
            if headers.get("x-ratelimit-remaining") == "0" and "x-ratelimit-reset" in headers:
                tok.ready_at = float(headers["x-ratelimit-reset"])
            return resp.json(), headers

    # ------------------------------------------------------------------ endpoints
    async def search_page(self, q: str, *, page: int, per_page: int) -> dict[str, Any]:
        data, _ = await self.get(
            "/search/repositories",
            {"q": q, "sort": "stars", "order": "desc", "per_page": per_page, "page": page},
        )
        result: dict[str, Any] = data
        return result

    async def tree_paths(self, repo: str, ref: str) -> list[str]:
        data, _ = await self.get(f"/repos/{repo}/git/trees/{ref}", {"recursive": "1"})
        return [e["path"] for e in data.get("tree", []) if e.get("type") == "blob"]

    async def issue(self, repo: str, number: int) -> dict[str, Any] | None:
        try:
            data, _ = await self.get(f"/repos/{repo}/issues/{number}")
        except RequestFailed as exc:
            if exc.response.status_code in (404, 410):
                return None
            raise
        result: dict[str, Any] = data
        return result
