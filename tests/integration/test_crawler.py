"""Crawler: static checks read from git (language, root CMakeLists, tests defined in CMake),
source parsing, and `submit` recording rejections and publishing candidates."""

from __future__ import annotations

from pathlib import Path

import pytest

from cppperf.demo import DemoRepo
from cppperf.services.crawler.checks import check_repository
from cppperf.services.crawler.handlers import submit
from cppperf.services.crawler.sources import candidate_for
from cppperf.shared import messages as m
from cppperf.shared.service import ServiceContext
from tests.gitrepo import commit_files


def make_repo(path: Path, files: dict[str, str]) -> Path:
    commit_files(path, files, "init")
    return path


CPP = {"src/a.cpp": "int a() { return 1; }\n" * 50}


def test_demo_repository_passes(demo_repo: DemoRepo) -> None:
    res = check_repository(demo_repo.path)
    assert res.ok and res.language == "C++"


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        (
            {
                **CPP,
                "main.py": "x = 1\n" * 5000,
                "CMakeLists.txt": "enable_testing()\nadd_test(NAME a COMMAND a)\n",
            },
            "primary language is Python",
        ),
        (
            {**CPP, "sub/CMakeLists.txt": "enable_testing()\nadd_test(NAME a COMMAND a)\n"},
            "no CMakeLists.txt",
        ),
        ({**CPP, "CMakeLists.txt": "project(x)\nadd_executable(a src/a.cpp)\n"}, "enable_testing"),
        ({**CPP, "CMakeLists.txt": "project(x)\ninclude(CTest)\n"}, "no test is defined"),
    ],
)
def test_rejections_with_reason(tmp_path: Path, files: dict[str, str], reason: str) -> None:
    res = check_repository(make_repo(tmp_path / "r", files))
    assert not res.ok and reason in res.reason


def test_discovery_macros_in_cmake_modules_count(tmp_path: Path) -> None:
    files = {
        **CPP,
        "CMakeLists.txt": "project(x)\ninclude(CTest)\nadd_subdirectory(tests)\n",
        "tests/CMakeLists.txt": "include(GoogleTest)\ngtest_discover_tests(unit)\n",
    }
    assert check_repository(make_repo(tmp_path / "r", files)).ok


def test_sources(tmp_path: Path) -> None:
    assert candidate_for("fmtlib/fmt").url == "https://github.com/fmtlib/fmt.git"
    assert candidate_for("https://example.org/git/kimci86/bkcrack.git").repo == "kimci86/bkcrack"
    local = candidate_for(str(tmp_path))
    assert local.repo == f"local/{tmp_path.name}" and local.source == "path"
    with pytest.raises(ValueError, match="neither"):
        candidate_for("not a repo at all")


@pytest.mark.nats
async def test_submit_publishes_candidates_and_records_rejections(
    ctx: ServiceContext, demo_repo: DemoRepo, tmp_path: Path
) -> None:
    bad = make_repo(tmp_path / "py", {"main.py": "x = 1\n"})
    report = await submit(ctx, [str(demo_repo.path), str(bad), "nonsense repo"], validate=True)
    assert report.published == ["local/demo"]
    assert "primary language" in report.rejected["local/py"]
    assert "nonsense repo" in report.rejected
    rec = await ctx.store.get("repos", "local/py")
    assert rec is not None and rec["stage"] == "rejected" and "Python" in rec["reason"]
    assert (await ctx.bus.js.stream_info("REPO_CANDIDATE")).state.messages == 1
    report2 = await submit(ctx, [str(demo_repo.path)], validate=False)
    assert report2.published == ["local/demo"]
    info = await ctx.bus.js.stream_info("REPO_FOUND")
    assert info.state.messages == 1
    assert m.REPO_FOUND  # subject constant used by the crawler's direct path
