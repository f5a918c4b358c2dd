"""The filter stage: which commits the structural rules select and why the rest are rejected,
reference parsing, the `cppperf filter` command, and the stage on real NATS (no duplicates)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from faststream.nats import NatsBroker
from typer.testing import CliRunner

from cppperf.cli import app
from cppperf.demo import DemoRepo
from cppperf.services.filter import app as filter_app
from cppperf.services.filter.links import Reference, parse_references
from cppperf.services.filter.select import scan_repository
from cppperf.services.filter.walk import walk
from cppperf.shared import messages as m
from cppperf.shared.rules import Reason, Rules
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import load_settings


def rules(**mining: object) -> Rules:
    return Rules.from_settings(load_settings(env={}, mining=mining).mining)


WHEN = datetime(2024, 5, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        (["src/a.cpp", "include/a.hpp"], None),
        (["src/a.cpp", "README.md"], Reason.NON_CPP),
        (["tests/a.cpp"], Reason.TEST_FILE),
        (["src/foo_test.cc"], Reason.TEST_FILE),
        (["src/test_foo.cpp"], Reason.TEST_FILE),
        (["src/FooTest.cpp"], Reason.TEST_FILE),
        (["lib/Testing/x.h"], Reason.TEST_FILE),
        (["src/bar_unittest.cc"], Reason.TEST_FILE),
        (["third_party/x/y.cpp"], Reason.VENDORED),
        (["src/latest.cpp", "src/contest.h"], None),  # 'test' inside a word is not a test file
        ([], Reason.EMPTY),
        ([f"src/f{i}.cpp" for i in range(21)], Reason.TOO_MANY_FILES),
        ([f"src/f{i}.cpp" for i in range(20)], None),
    ],
)
def test_path_rules(paths: list[str], expected: Reason | None) -> None:
    assert rules().check(parents=1, when=WHEN, paths=paths) == expected


def test_window_and_merge_rules() -> None:
    r = rules(since="2021-01-01", until="2021-12-31")
    assert r.check(parents=1, when=datetime(2021, 12, 31, 23, 0, tzinfo=UTC), paths=["a.cpp"]) is None
    assert (
        r.check(parents=1, when=datetime(2022, 1, 1, 0, 1, tzinfo=UTC), paths=["a.cpp"])
        == Reason.OUT_OF_WINDOW
    )
    assert r.check(parents=2, when=datetime(2021, 5, 1, tzinfo=UTC), paths=["a.cpp"]) == Reason.MERGE


def test_extensions_are_configurable() -> None:
    assert rules(source_extensions=[".cu"]).check(parents=1, when=WHEN, paths=["k.cu"]) is None
    assert rules().check(parents=1, when=WHEN, paths=["k.cu"]) == Reason.NON_CPP


def test_parse_references() -> None:
    msg = "Speed up parser (#123)\n\nFixes #45, see other/lib#7 and https://github.com/a/b/pull/9 (not #9abc)"
    refs = parse_references(msg, "me/repo")
    assert refs == [
        Reference("a/b", 9, "pull"),
        Reference("other/lib", 7),
        Reference("me/repo", 123),
        Reference("me/repo", 45),
    ]
    assert parse_references("C# support, issue#3 and x#4", "me/repo") == []


def test_demo_history_selects_exactly_the_expected_commits(demo_repo: DemoRepo) -> None:
    result = walk(demo_repo.path, rules(), explain=True)
    kinds = {sha: kind for kind, sha in demo_repo.shas.items()}
    selected = {kinds[c.sha] for c in result.selected}
    assert selected == {
        "perf",
        "noop",
        "comment",
        "regression",
        "side",
        "broken_test",
        "compile_error",
        "fixup",
    }
    why = {kinds.get(c.sha, c.sha): reason for c, reason in result.rejections}
    assert why == {
        "base": Reason.OUT_OF_WINDOW,
        "docs": Reason.NON_CPP,
        "test_touch": Reason.TEST_FILE,
        "vendored": Reason.VENDORED,
        "too_many": Reason.TOO_MANY_FILES,
        "out_of_window": Reason.OUT_OF_WINDOW,
        "merge": Reason.MERGE,
    }
    assert result.scanned == len(demo_repo.shas)
    assert dict(result.rejected) == {
        "out-of-window": 2,
        "non-cpp-file": 1,
        "test-file": 1,
        "vendored-path": 1,
        "too-many-files": 1,
        "merge": 1,
    }


def test_selected_commits_carry_what_the_next_stages_need(demo_repo: DemoRepo) -> None:
    out: list[m.CommitSelected] = []
    summary = scan_repository(
        demo_repo.path, repo="local/demo", url=str(demo_repo.path), rules=rules(), emit=out.append
    )
    assert summary.selected == len(out) == 8
    perf = next(c for c in out if c.sha == demo_repo.shas["perf"])
    assert perf.parent == demo_repo.shas["base"]
    assert perf.files == [m.FileChange(path="src/core.cpp", status="M", added=1, deleted=1)]
    assert "-  for (int rep = 0; rep < 3; ++rep) {" in perf.diff
    assert perf.linked == [m.LinkedText(kind="issue", number=7, url="https://github.com/local/demo/issues/7")]
    assert perf.links_fetched is False
    assert perf.date.startswith("2024-01-10")


def test_filter_command_json_and_explain(demo_repo: DemoRepo) -> None:
    res = CliRunner().invoke(app, ["filter", "--repo", str(demo_repo.path), "--explain", "--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    rows, summary = lines[:-1], lines[-1]["summary"]
    assert summary["scanned"] == 15 and summary["selected"] == 8
    by_sha = {r["sha"]: r for r in rows}
    assert by_sha[demo_repo.shas["docs"]]["reason"] == "non-cpp-file"
    assert by_sha[demo_repo.shas["perf"]]["selected"] is True
    narrow = CliRunner().invoke(
        app, ["filter", "--repo", str(demo_repo.path), "--until", "2024-01-11", "--json"]
    )
    assert json.loads(narrow.stdout.splitlines()[-1])["summary"]["selected"] == 1


@pytest.mark.nats
async def test_filter_service_on_nats_publishes_each_commit_once(
    ctx: ServiceContext, demo_repo: DemoRepo
) -> None:
    broker = NatsBroker(ctx.settings.nats_url, logger=None)
    filter_app.register(broker, ctx)
    await broker.start()
    try:
        msg = m.RepoFound(repo="local/demo", url=str(demo_repo.path))
        await ctx.bus.publish(m.REPO_FOUND, msg)
        deadline = time.monotonic() + 30
        while (await ctx.store.get("repos", "local/demo") or {}).get("stage") != "filtered":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        # the same repo again (a new message id, e.g. a later crawl): nothing is re-published
        await ctx.bus.publish(m.REPO_FOUND, msg, msg_id="local/demo#again")
        await asyncio.sleep(1.0)
        rows = {r.subject: r for r in await ctx.bus.subject_status()}
        assert (rows[m.REPO_FOUND].done, rows[m.REPO_FOUND].pending, rows[m.REPO_FOUND].in_flight) == (
            2,
            0,
            0,
        )
    finally:
        await broker.stop()
    info = await ctx.bus.js.stream_info("COMMIT_SELECTED")
    assert info.state.messages == 8
    rec = await ctx.store.get("repos", "local/demo")
    assert rec is not None and rec["filter"]["scanned"] == 15 and rec["filter"]["rejected"]["merge"] == 1
    assert sorted(await ctx.store.ids("commits")) == sorted(
        f"local/demo@{demo_repo.shas[k]}"
        for k in ("perf", "noop", "comment", "regression", "side", "broken_test", "compile_error", "fixup")
    )


def test_walk_streams_history_with_bounded_memory(tmp_path: Path) -> None:
    """A 3,000-commit history is walked in one pass; only selected commits are kept."""
    import subprocess

    repo = tmp_path / "big"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    lines: list[str] = []
    for i in range(3000):
        path = f"src/f{i % 50}.cpp" if i % 3 else f"docs/n{i}.md"
        msg = f"c{i}"
        body = f"int v{i};"
        lines += [
            "commit refs/heads/main",
            f"committer D <d@e> {1_700_000_000 + i} +0000",
            f"data {len(msg)}",
            msg,
            f"M 100644 inline {path}",
            f"data {len(body)}",
            body,
            "",
        ]
    subprocess.run(
        ["git", "-C", str(repo), "fast-import", "--quiet"], input="\n".join(lines).encode(), check=True
    )
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "main"], check=True)
    result = walk(repo, rules())
    assert result.scanned == 3000
    assert len(result.selected) == 2000
    assert result.rejected["non-cpp-file"] == 1000


def test_a_repository_git_cannot_read_is_rejected_not_an_empty_history(tmp_path: Path) -> None:
    """A broken or unreadable repository must say so; before, it walked as 0 commits, exit 0."""
    import shutil
    import subprocess

    from cppperf.services.filter.walk import iter_commits
    from cppperf.shared.errors import RepoRejected
    from tests.gitrepo import commit_files

    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert list(iter_commits(repo)) == []  # no commit yet: an empty history, not an error
    commit_files(repo, {"a.cpp": "int a;\n"}, "one")
    assert len(list(iter_commits(repo))) == 1
    with pytest.raises(RepoRejected, match="git log nope failed"):
        list(iter_commits(repo, "nope"))
    shutil.rmtree(repo / ".git" / "objects")
    (repo / ".git" / "objects").mkdir()
    with pytest.raises(RepoRejected, match="failed"):
        walk(repo, rules())
    with pytest.raises(RepoRejected, match="not a git repository"):
        list(iter_commits(tmp_path / "missing"))


def test_one_github_client_per_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter makes its GitHub client once (its tokens' rate-limit rest state lasts), not per
    message; offline it makes none."""
    from cppperf.services.filter.links import GitHubLinkResolver, LinkResolver
    from cppperf.shared.github import GitHubClient
    from tests.conftest import make_settings
    from tests.fakes import FakeContext

    made: list[GitHubClient] = []

    class Counting(GitHubClient):
        def __init__(self, *a: object, **k: object) -> None:
            made.append(self)
            super().__init__(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(filter_app, "GitHubClient", Counting)
    pick = filter_app.resolver_for(FakeContext(make_settings(tmp_path, github={"fetch_links": True})))

    async def three_messages() -> list[LinkResolver]:
        return [pick(), pick(), pick()]

    resolvers = asyncio.run(three_messages())
    assert len(made) == 1 and all(isinstance(r, GitHubLinkResolver) for r in resolvers)
    offline = filter_app.resolver_for(FakeContext(make_settings(tmp_path / "off")))
    assert type(offline()) is LinkResolver and len(made) == 1
