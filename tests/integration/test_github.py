"""GitHub through githubkit against a local server speaking the REST shapes: enumeration past the
1,000-result cap by slicing, resume after a restart, rate-limit waits on a short clock, token
rotation, issue texts, and tokens kept out of logs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from cppperf.services.crawler.search import MemoryProgress, SearchStats, search_repositories
from cppperf.shared.github import GitHubClient
from cppperf.shared.settings import load_settings
from tests.fake_github import FakeGitHub, make_repos


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def client(srv: FakeGitHub, clock: FakeClock, tokens: list[str] | None = None) -> GitHubClient:
    s = load_settings(env={}, github={"api_url": srv.url, "tokens": tokens or []}).github
    return GitHubClient(s, sleep=clock.sleep, clock=clock)


async def collect(
    gh: GitHubClient, progress: MemoryProgress, limit: int | None = None, stats: SearchStats | None = None
) -> list[str]:
    out: list[str] = []
    async for item in search_repositories(gh, min_stars=300, progress=progress, stats=stats):
        out.append(item["full_name"])
        if limit is not None and len(out) >= limit:
            break
    return out


async def test_enumerates_every_repository_past_the_cap() -> None:
    repos = make_repos(2600)
    with FakeGitHub(repos) as srv:
        stats = SearchStats()
        names = await collect(client(srv, FakeClock()), MemoryProgress(), stats=stats)
    assert len(names) == len(set(names)) == 2600  # none missed, none twice
    assert stats.slices > 3 and stats.truncated_slices == 0
    assert all(name.startswith("org") for name in names)


async def test_resumes_after_a_restart() -> None:
    repos = make_repos(2600)
    progress = MemoryProgress()
    with FakeGitHub(repos) as srv:
        first = await collect(client(srv, FakeClock()), progress, limit=1500)  # the crawler dies here
        done_before = set(progress.done)
        n_requests = len(srv.requests)
        second = await collect(client(srv, FakeClock()), progress)
        resumed_queries = len(srv.requests) - n_requests
    assert done_before and progress.root_key is not None
    assert set(first) | set(second) == {r["full_name"] for r in repos}
    assert len(second) < 2600  # finished slices were not fetched again
    assert resumed_queries < n_requests


async def test_primary_rate_limit_waits_until_reset() -> None:
    with FakeGitHub(make_repos(10)) as srv:
        reset = int(time.time()) + 30
        srv.scripted = [
            (
                403,
                {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)},
                {"message": "API rate limit exceeded"},
            )
        ]
        clock = FakeClock()
        gh = client(srv, clock)
        page = await gh.search_page("language:C++", page=1, per_page=5)
    assert len(page["items"]) == 5
    assert len(clock.slept) == 1 and 25 <= clock.slept[0] <= 31


async def test_secondary_limit_honours_retry_after() -> None:
    with FakeGitHub(make_repos(10)) as srv:
        srv.scripted = [(429, {"retry-after": "7"}, {"message": "You have exceeded a secondary rate limit"})]
        clock = FakeClock()
        gh = client(srv, clock)
        await gh.search_page("language:C++", page=1, per_page=5)
    assert clock.slept == [7.0]


async def test_token_rotation_avoids_waiting() -> None:
    with FakeGitHub(make_repos(10)) as srv:
        srv.scripted = [
            (
                403,
                {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + 60)},
                {"message": "API rate limit exceeded"},
            )
        ]
        clock = FakeClock()
        gh = client(srv, clock, tokens=["ghp_" + "a" * 36, "ghp_" + "b" * 36])
        with capture_logs() as logs:
            await gh.search_page("language:C++", page=1, per_page=5)
        auths = [a for _, a in srv.requests]
    assert clock.slept == []
    assert auths[0] != auths[1] and all(a and a.startswith(("token ", "Bearer ")) for a in auths)
    assert "ghp_" not in repr(logs)


async def test_remaining_zero_rests_the_token_before_the_next_call() -> None:
    with FakeGitHub(make_repos(10)) as srv:
        srv.remaining_zero_once = True
        clock = FakeClock()
        gh = client(srv, clock)
        await gh.search_page("language:C++", page=1, per_page=5)
        await gh.search_page("language:C++", page=2, per_page=5)
    assert len(clock.slept) == 1 and clock.slept[0] > 10


async def test_issue_texts() -> None:
    with FakeGitHub([]) as srv:
        srv.issues[("o/r", 12)] = {
            "number": 12,
            "title": "Parser is slow",
            "body": "takes 3 s",
            "html_url": "https://github.com/o/r/issues/12",
            "pull_request": None,
        }
        gh = client(srv, FakeClock())
        found: dict[str, Any] | None = await gh.issue("o/r", 12)
        missing = await gh.issue("o/r", 13)
    assert found is not None and found["title"] == "Parser is slow"
    assert missing is None


def test_secrets_are_scrubbed_from_log_lines() -> None:
    from cppperf.shared.logging import redact_secrets, register_secret

    register_secret("sekrit-token-value")
    event = redact_secrets(
        None,
        "info",
        {"event": "x", "url": "https://u?t=sekrit-token-value", "token": "abc", "note": "ghp_" + "z" * 36},
    )
    assert "sekrit" not in event["url"] and event["token"] == "***" and "ghp_" not in event["note"]


@pytest.mark.parametrize("n", [0])
async def test_empty_search(n: int) -> None:
    with FakeGitHub(make_repos(n)) as srv:
        assert await collect(client(srv, FakeClock()), MemoryProgress()) == []


@pytest.mark.nats
async def test_crawl_search_publishes_checked_candidates(ctx: Any, demo_repo: Any, tmp_path: Any) -> None:
    from cppperf.services.crawler.handlers import crawl_search

    repos = make_repos(3)
    repos[0]["clone_url"] = str(demo_repo.path)  # "cloned" from the local demo repository
    with FakeGitHub(repos) as srv:
        srv.trees[repos[0]["full_name"]] = ["CMakeLists.txt", "src/core.cpp"]
        srv.trees[repos[1]["full_name"]] = ["Makefile", "src/a.cpp"]
        srv.trees[repos[2]["full_name"]] = ["CMakeLists.txt", "a.cpp"]  # clone will fail: unreachable
        ctx.settings.github = load_settings(env={}, github={"api_url": srv.url}).github
        gh = GitHubClient(ctx.settings.github, sleep=FakeClock().sleep)
        report = await crawl_search(ctx, gh, validate=True)
        again = await crawl_search(ctx, gh, validate=True)  # resumable: all slices done, nothing new
    assert report.published == [repos[0]["full_name"]]
    assert "no CMakeLists.txt" in report.rejected[repos[1]["full_name"]]
    assert "could not mirror" in report.rejected[repos[2]["full_name"]]
    assert again.published == [] and again.rejected == {}
    assert (await ctx.bus.js.stream_info("REPO_CANDIDATE")).state.messages == 1
    rec = await ctx.store.get("repos", repos[1]["full_name"])
    assert rec is not None and rec["stage"] == "rejected"


@pytest.mark.nats
async def test_filter_attaches_linked_issue_texts(ctx: Any, demo_repo: Any) -> None:
    import asyncio

    from faststream.nats import NatsBroker

    from cppperf.services.filter import app as filter_app
    from cppperf.shared import messages as m

    with FakeGitHub([]) as srv:
        srv.issues[("local/demo", 7)] = {
            "number": 7,
            "title": "spin() is twice as slow as needed",
            "body": "profiling shows a redundant pass",
            "html_url": "u7",
        }
        gh = GitHubClient(load_settings(env={}, github={"api_url": srv.url}).github)
        broker = NatsBroker(ctx.settings.nats_url, logger=None)
        filter_app.register(broker, ctx, github=gh)
        await broker.start()
        try:
            await ctx.bus.publish(m.REPO_FOUND, m.RepoFound(repo="local/demo", url=str(demo_repo.path)))
            for _ in range(300):
                if (await ctx.store.get("repos", "local/demo") or {}).get("stage") == "filtered":
                    break
                await asyncio.sleep(0.1)
        finally:
            await broker.stop()
    perf_id = f"local/demo@{demo_repo.shas['perf']}"
    found = None
    async for msg in _read_all(ctx, "COMMIT_SELECTED"):
        sel = m.decode(msg, m.CommitSelected)
        if sel.id == perf_id:
            found = sel
    assert found is not None and found.links_fetched
    assert found.linked[0].title == "spin() is twice as slow as needed"
    assert (await ctx.store.get("cache", "issue/local/demo#7")) is not None


async def _read_all(ctx: Any, stream: str) -> Any:
    sub = await ctx.bus.js.pull_subscribe("commit.selected", durable="classifier", stream=stream)
    msgs = await sub.fetch(50, timeout=2)
    for msg in msgs:
        yield msg.data
