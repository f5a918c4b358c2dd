"""Exported trees carry their submodules (nested too) at the commit's recorded revisions, taken from
the clone, a mapped local mirror or the shared cache (fetched once); a submodule nobody has is a
`MissingSubmodule` naming it and what was tried; the docker path's tar holds the same files."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from cppperf.shared.engine.backend import export_tree
from cppperf.shared.engine.images import git_archive
from cppperf.shared.engine.submodules import (
    MissingSubmodule,
    Sources,
    cache_key,
    normalise_url,
    resolve_url,
    submodules_at,
)
from tests.gitrepo import commit_files

GIT = ["git", "-c", "protocol.file.allow=always", "-c", "user.name=a", "-c", "user.email=a@b"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        [*GIT, "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def add_submodule(repo: Path, url: str, path: str) -> str:
    git(repo, "submodule", "add", "-q", url, path)
    git(repo, "commit", "-qm", f"add {path}")
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def family(tmp_path: Path) -> dict[str, object]:
    """leaf (v1, v2) ← mid (nests leaf at v1) ← top (mid at its tip); top's later commit moves mid."""
    leaf = tmp_path / "leaf"
    leaf_v1 = commit_files(leaf, {"leaf.h": "int leaf = 1;\n"}, "leaf v1")
    mid = tmp_path / "mid"
    commit_files(mid, {"mid.h": "int mid = 1;\n"}, "mid v1")
    mid_v1 = add_submodule(mid, f"file://{leaf}", "deps/leaf")
    commit_files(leaf, {"leaf.h": "int leaf = 2;\n"}, "leaf v2")  # mid still records v1
    top = tmp_path / "top"
    commit_files(top, {"main.cpp": "int main() {}\n"}, "top v1")
    top_v1 = add_submodule(top, f"file://{mid}", "third_party/mid")
    return {"leaf": leaf, "mid": mid, "top": top, "top_v1": top_v1, "mid_v1": mid_v1, "leaf_v1": leaf_v1}


def test_lists_gitlinks_with_their_urls(family: dict[str, object]) -> None:
    top = family["top"]
    assert isinstance(top, Path)
    (sub,) = submodules_at(top, str(family["top_v1"]))
    assert (sub.path, sub.sha) == ("third_party/mid", family["mid_v1"])
    assert sub.url == f"file://{family['mid']}"


def test_clone_with_modules_exports_nested_tree(family: dict[str, object], tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(
        [*GIT, "clone", "-q", "--recurse-submodules", f"file://{family['top']}", str(clone)], check=True
    )
    dest = tmp_path / "out"
    export_tree(clone, str(family["top_v1"]), dest, Sources(fetch=False))  # no cache: the clone's own
    assert (dest / "main.cpp").is_file()
    assert (dest / "third_party/mid/mid.h").read_text() == "int mid = 1;\n"
    assert (dest / "third_party/mid/deps/leaf/leaf.h").read_text() == "int leaf = 1;\n"  # recorded, not tip


def test_fetched_into_the_shared_cache_once(family: dict[str, object], tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"  # a mirror of top without any submodule history
    subprocess.run([*GIT, "clone", "-q", "--bare", f"file://{family['top']}", str(bare)], check=True)
    cache = tmp_path / "cache"
    dest = tmp_path / "out"
    export_tree(bare, str(family["top_v1"]), dest, Sources(cache_dir=cache))
    assert (dest / "third_party/mid/deps/leaf/leaf.h").read_text() == "int leaf = 1;\n"
    cached = sorted(p.name for p in cache.glob("*.git"))
    assert len(cached) == 2, cached  # mid and leaf, each one mirror
    # offline afterwards: the cache alone is enough
    export_tree(bare, str(family["top_v1"]), tmp_path / "again", Sources(cache_dir=cache, fetch=False))
    assert (tmp_path / "again/third_party/mid/mid.h").is_file()


def test_offline_mirror_mapping_and_missing_submodule(family: dict[str, object], tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    subprocess.run([*GIT, "clone", "-q", "--bare", f"file://{family['top']}", str(bare)], check=True)
    sha = str(family["top_v1"])
    with pytest.raises(MissingSubmodule) as err:
        export_tree(bare, sha, tmp_path / "x", Sources(cache_dir=tmp_path / "c", fetch=False))
    assert err.value.path == "third_party/mid"
    assert "third_party/mid" in str(err.value) and "fetching is off" in str(err.value)
    mirrors = {
        f"file://{family['mid']}.git": str(family["mid"]),
        f"file://{family['leaf']}/": str(family["leaf"]),
    }
    export_tree(bare, sha, tmp_path / "y", Sources(mirrors=mirrors, fetch=False))
    assert (tmp_path / "y/third_party/mid/deps/leaf/leaf.h").is_file()
    # the docker backend's tar holds the same files
    with tarfile.open(fileobj=io.BytesIO(git_archive(bare, sha, Sources(mirrors=mirrors)))) as tar:
        names = tar.getnames()
    assert "third_party/mid/deps/leaf/leaf.h" in names and "main.cpp" in names
    assert len(names) == len(set(names))


def test_urls() -> None:
    assert resolve_url("../benchmark.git", "https://github.com/google/snappy.git") == (
        "https://github.com/google/benchmark.git"
    )
    assert resolve_url("https://x/y", "https://a/b") == "https://x/y"
    assert normalise_url("git@github.com:google/benchmark.git") == "ssh://git@github.com/google/benchmark"
    assert normalise_url("https://github.com/google/benchmark.git/") == "https://github.com/google/benchmark"
    assert cache_key("https://github.com/google/benchmark.git") == "google/benchmark"


@pytest.mark.docker
def test_docker_backend_trees_carry_submodules(family: dict[str, object], tmp_path: Path) -> None:
    from cppperf.shared.engine.backends import make_backend
    from tests.conftest import make_settings
    from tests.integration.test_docker import _engine

    if _engine() is None:
        pytest.skip("no container engine reachable: set DOCKER_HOST")
    top = family["top"]
    assert isinstance(top, Path)
    sha = str(family["top_v1"])
    builder = {"backend": "docker", "base_release": "bookworm", "submodule_cache": str(tmp_path / "c")}
    s = make_settings(tmp_path, builder=builder)
    backend: Any = make_backend(s.builder, tmp_path / "w", source=(top, sha, "2024-01-01"))
    try:
        backend.prepare(top, {"old": sha, "new": sha})  # mid from the clone, leaf fetched (nested)
        code, out = backend._exec(["cat", "/work/new/src/third_party/mid/deps/leaf/leaf.h"], user="1000")
        assert code == 0 and out.decode() == "int leaf = 1;\n", out
    finally:
        backend.cleanup()
