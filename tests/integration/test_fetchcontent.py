"""FetchContent dependencies are provided offline: the exported tree carries each declared
content at its tag (from a mirror mapped to its URL, or the shared cache) with a `-C` script that
points FetchContent at it; CMake then configures and builds without network. A content nobody has
is a `dependency` rejection naming it. A tiny local git repository stands in for the dependency."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from cppperf.shared.domain import FailureCategory, Verdict
from cppperf.shared.engine.backend import export_tree
from cppperf.shared.engine.cmake import BuildSpec, configure, configure_argv, tool_env
from cppperf.shared.engine.fetchcontent import (
    INIT_CACHE,
    MissingFetchContent,
    archive,
    declared,
    has_init_cache,
)
from cppperf.shared.engine.submodules import Sources
from tests.gitrepo import commit_files

URL = "https://github.com/example/tinydep.git"  # never reached: the mirror mapping answers


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def dep(tmp_path: Path) -> Path:
    """tinydep: v1 tagged (value 1), then its tip moves on (value 2)."""
    repo = tmp_path / "tinydep"
    commit_files(
        repo,
        {
            "CMakeLists.txt": "add_library(tinydep INTERFACE)\n"
            "target_include_directories(tinydep INTERFACE ${CMAKE_CURRENT_SOURCE_DIR})\n",
            "tinydep.h": "inline int tinydep() { return 1; }\n",
        },
        "v1",
    )
    git(repo, "tag", "v1")
    commit_files(repo, {"tinydep.h": "inline int tinydep() { return 2; }\n"}, "v2")
    return repo


TOP_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(top CXX)
include(FetchContent)
FetchContent_Declare(
  TinyDep  # the test framework, downloaded at configure time
  GIT_REPOSITORY {url}
  GIT_TAG v1
)
FetchContent_MakeAvailable(TinyDep)
add_executable(t t.cpp)
target_link_libraries(t tinydep)
enable_testing()
add_test(NAME t COMMAND t)
"""


@pytest.fixture
def top(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "top"
    sha = commit_files(
        repo,
        {
            "CMakeLists.txt": TOP_CMAKE.format(url=URL),
            "t.cpp": '#include "tinydep.h"\nint main() { return tinydep() == 1 ? 0 : 1; }\n',
        },
        "top",
    )
    return repo, sha


def test_declarations_parsed() -> None:
    text = """
    FetchContent_Declare(googletest
      URL https://github.com/google/googletest/archive/609281088cfefc76f9d0ce82e1ff6c30cc3591e5.zip)
    FetchContent_Declare(fmt GIT_REPOSITORY "https://github.com/fmtlib/fmt" GIT_TAG 10.2.1)
    FetchContent_Declare(local SOURCE_DIR ${CMAKE_CURRENT_SOURCE_DIR}/third_party/local)
    FetchContent_Declare(vars GIT_REPOSITORY ${REPO} GIT_TAG ${TAG})
    FetchContent_Declare(tarball URL https://example.org/x-1.0.tar.gz)
    FetchContent_Declare(fmt GIT_REPOSITORY https://elsewhere/fmt GIT_TAG main)
    """
    got = {c.name: c for c in declared([text])}
    assert set(got) == {"googletest", "fmt", "vars", "tarball"}  # SOURCE_DIR is local; first fmt wins
    assert (got["googletest"].url, got["googletest"].rev) == (
        "https://github.com/google/googletest",
        "609281088cfefc76f9d0ce82e1ff6c30cc3591e5",
    )
    assert (got["fmt"].url, got["fmt"].rev, got["fmt"].problem) == (
        "https://github.com/fmtlib/fmt",
        "10.2.1",
        "",
    )
    assert "variable" in got["vars"].problem and "download" in got["tarball"].problem


def test_tree_carries_the_content_at_its_tag(dep: Path, top: tuple[Path, str], tmp_path: Path) -> None:
    repo, sha = top
    dest = tmp_path / "out"
    export_tree(repo, sha, dest, Sources(mirrors={URL: str(dep)}, fetch=False))
    assert (
        dest / ".cppperf/fetchcontent/tinydep/tinydep.h"
    ).read_text() == "inline int tinydep() { return 1; }\n"
    script = (dest / INIT_CACHE).read_text()
    assert "FETCHCONTENT_SOURCE_DIR_TINYDEP" in script and "FETCHCONTENT_FULLY_DISCONNECTED ON" in script
    assert configure_argv(dest, tmp_path / "b", BuildSpec())[1:3] == ["-C", str(dest / INIT_CACHE)]
    # the docker backend's tar holds the same (and says so)
    data = archive(repo, sha, Sources(mirrors={URL: str(dep)}))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
    assert has_init_cache(data) and not has_init_cache(_plain(tmp_path))
    assert INIT_CACHE in names and ".cppperf/fetchcontent/tinydep/CMakeLists.txt" in names


def test_cmake_configures_and_builds_offline(dep: Path, top: tuple[Path, str], tmp_path: Path) -> None:
    repo, sha = top
    src = tmp_path / "src"
    export_tree(repo, sha, src, Sources(mirrors={URL: str(dep)}, fetch=False))
    build = tmp_path / "build"
    res = configure(src, build, BuildSpec(), env=tool_env(None, None), log=tmp_path / "configure.log")
    assert res.ok, res.result.output[-2000:]
    assert "-C" in res.argv
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    assert subprocess.run([str(build / "t")], check=False).returncode == 0  # v1's value, not the tip's


def test_a_remote_tracking_branch_resolves_in_a_bare_mirror(dep: Path, tmp_path: Path) -> None:
    """`GIT_TAG origin/main` (CMake's clone has the remote's branches as `origin/…`; a bare mirror
    has them as `refs/heads/…`) and a plain branch name both give the branch's tip; a branch the
    mirror lacks is still missing."""
    from cppperf.shared.engine.fetchcontent import Content, locate

    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(dep), str(mirror)], check=True)
    branch = git(mirror, "symbolic-ref", "--short", "HEAD")
    tip = git(mirror, "rev-parse", "HEAD")
    sources = Sources(mirrors={URL: str(mirror)}, fetch=False)
    for rev in (f"origin/{branch}", branch):
        assert locate(Content("tinydep", URL, rev), sources) == (mirror, tip)
    with pytest.raises(MissingFetchContent, match="lacks origin/nosuch"):
        locate(Content("tinydep", URL, "origin/nosuch"), sources)


def test_a_dependencys_own_declaration_that_cannot_be_had_is_left_out(
    dep: Path, top: tuple[Path, str], tmp_path: Path
) -> None:
    """tinydep declares (for its own tests, off by default) a content no mirror has: the top
    project's tree is still exported, without it, and configures and builds offline; the same
    declaration at the top level is a dependency rejection (test below)."""
    commit_files(
        dep,
        {
            "CMakeLists.txt": "add_library(tinydep INTERFACE)\n"
            "target_include_directories(tinydep INTERFACE ${CMAKE_CURRENT_SOURCE_DIR})\n"
            "if(TINYDEP_TESTS)\n  include(FetchContent)\n"
            "  FetchContent_Declare(tinydata GIT_REPOSITORY https://github.com/example/absent.git"
            " GIT_TAG origin/main)\n  FetchContent_MakeAvailable(tinydata)\nendif()\n",
        },
        "v1 with optional test data",
    )
    git(dep, "tag", "-f", "v1")
    repo, sha = top
    src = tmp_path / "src"
    export_tree(repo, sha, src, Sources(mirrors={URL: str(dep)}, fetch=False))
    script = (src / INIT_CACHE).read_text()
    assert "TINYDEP" in script and "TINYDATA" not in script
    res = configure(src, tmp_path / "build", BuildSpec(), env=tool_env(None, None), log=tmp_path / "c.log")
    assert res.ok, res.result.output[-2000:]


def test_content_from_the_cache(dep: Path, top: tuple[Path, str], tmp_path: Path) -> None:
    repo, sha = top
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(dep), str(cache / "example__tinydep.git")], check=True
    )
    export_tree(repo, sha, tmp_path / "out", Sources(cache_dir=cache, fetch=False))
    assert (tmp_path / "out/.cppperf/fetchcontent/tinydep/tinydep.h").is_file()


def test_missing_content_is_a_dependency_rejection(top: tuple[Path, str], tmp_path: Path) -> None:
    from cppperf.services.builder.instance import prove
    from cppperf.shared.engine.backends import make_backend
    from tests.conftest import make_settings

    repo, sha = top
    with pytest.raises(MissingFetchContent) as err:
        export_tree(repo, sha, tmp_path / "x", Sources(cache_dir=tmp_path / "c", fetch=False))
    assert "FetchContent TinyDep" in str(err.value) and "fetching is off" in str(err.value)
    s = make_settings(tmp_path, builder={"submodule_fetch": False, "submodule_cache": str(tmp_path / "c")})
    backend = make_backend(s.builder, tmp_path / "w")
    parent = commit_files(repo, {"README": "x\n"}, "later")
    res = prove("i", backend, s.builder, sides={"old": sha, "new": parent}, repo_path=repo)
    assert res.verdict == Verdict.REJECTED and res.failure_category == FailureCategory.DEPENDENCY
    assert res.failure_step == "checkout" and "TinyDep" in res.failure_lines[0]


def _plain(tmp_path: Path) -> bytes:
    repo = tmp_path / "plain"
    sha = commit_files(repo, {"CMakeLists.txt": "project(p NONE)\n", ".cppperf.txt": "x\n"}, "plain")
    return archive(repo, sha, Sources())


@pytest.mark.docker
def test_docker_backend_on_the_era_image(dep: Path, top: tuple[Path, str], tmp_path: Path) -> None:
    """On bullseye (CMake 3.18: no `ctest --test-dir`) the container configures offline with the
    provided content, builds, discovers the test and proves the commit."""
    from cppperf.services.builder.instance import prove
    from cppperf.shared.engine.backends import make_backend
    from cppperf.shared.engine.images import base_name, image_exists
    from tests.conftest import make_settings
    from tests.integration.test_docker import _engine

    client = _engine()
    if client is None or not image_exists(client, base_name("bullseye")):
        pytest.skip(
            "no container engine with cppperf/base:bullseye (cppperf images bootstrap --release bullseye)"
        )
    repo, sha = top
    head = commit_files(
        repo, {"t.cpp": '#include "tinydep.h"\nint main() { return tinydep() - 1; }\n'}, "two"
    )
    builder = {
        "backend": "docker",
        "base_release": "bullseye",
        "runs": 3,
        "warmup": 0,
        "confirm": False,
        "pin_cpu": False,
        "submodule_mirrors": {URL: str(dep)},
        "submodule_fetch": False,
        "lease_dir": str(tmp_path / "leases"),
    }
    s = make_settings(tmp_path, builder=builder)
    backend = make_backend(s.builder, tmp_path / "w", source=(repo, head, "2022-01-01"))
    try:
        res = prove("i", backend, s.builder, sides={"old": sha, "new": head}, repo_path=repo)
    finally:
        backend.cleanup()
    assert res.verdict != Verdict.REJECTED, (res.failure_category, res.failure_detail[-1500:])
    assert res.compared_tests == ["t"]
    assert "10." in str(res.environment.compiler_version), res.environment
