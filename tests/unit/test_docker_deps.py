"""The docker backend's missing-package retries, without an engine: CMake stops at the first
REQUIRED package it lacks, so a project needing two gets one named per configure; each retry
makes a fresh container with what the last configure named, while new packages are named, at
most `INSTALL_ROUNDS` times, and never once a side has configured (its tree would be lost)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cppperf.shared.engine import docker_backend
from cppperf.shared.engine.cmake import BuildSpec
from cppperf.shared.engine.docker_backend import INSTALL_ROUNDS, DockerBackend
from cppperf.shared.engine.sandbox import RunResult


class FakeCMake(DockerBackend):
    """A container whose `cmake` configure needs `needs` (find_package name → Debian package), in
    order, and reports the first one missing as CMake does; builds succeed. `_start`/`cleanup`
    touch no engine; containers started are counted."""

    needs: list[tuple[str, str]]
    started: list[list[str]]

    def _start(self, image: str, *, fill: bool = False) -> None:
        self.started.append(list(self.packages))

    def _load_sources(self) -> None:
        pass

    def cleanup(self) -> None:
        pass

    def _run(self, argv: list[str], **_kw: Any) -> RunResult:
        if argv[:2] == ["cmake", "-S"]:
            for name, pkg in self.needs:
                if pkg not in self.packages:
                    out = f"CMake Error at CMakeLists.txt:3 (find_package):\n  Could NOT find {name}\n"
                    return RunResult(1, 0.1, 0.1, out, False, False)
        return RunResult(0, 0.1, 0.1, "", False, False)


def backend(tmp_path: Path, needs: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> FakeCMake:
    monkeypatch.setattr(docker_backend, "ensure_env_image", lambda _c, base, pkgs: f"env:{'+'.join(pkgs)}")
    b = FakeCMake(
        client=None, base_image="cppperf/base:bookworm", spec=BuildSpec(), env_overrides={}, logs=tmp_path
    )
    b.needs, b.started = needs, []
    return b


def steps_of(b: FakeCMake, side: str) -> list[tuple[str, bool]]:
    return [(s.step, s.ok) for s in b.build(side)]  # type: ignore[arg-type]


def test_each_configure_names_the_next_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = backend(tmp_path, [("GTest", "libgtest-dev"), ("ZLIB", "zlib1g-dev")], monkeypatch)
    assert steps_of(b, "old") == [
        ("configure", False),
        ("configure", False),
        ("configure", True),
        ("build", True),
    ]
    assert b.installed == ["libgmock-dev", "libgtest-dev", "zlib1g-dev"]
    assert steps_of(b, "new") == [("configure", True), ("build", True)]  # the same container
    assert len(b.started) == 2


def test_a_package_that_does_not_help_is_not_installed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed, and the configure still names it (a version too old, say): no second retry."""
    b = backend(tmp_path, [("GTest", "not-in-the-table")], monkeypatch)
    got = b.build("old")  # type: ignore[arg-type]
    assert [(s.step, s.ok) for s in got] == [("configure", False), ("configure", False)]
    assert got[-1].missing is not None and got[-1].missing.names == ["GTest"]
    assert b.installed == ["libgmock-dev", "libgtest-dev"]


def test_rounds_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = [("ZLIB", "zlib1g-dev"), ("BZip2", "libbz2-dev"), ("ZSTD", "libzstd-dev"), ("LZ4", "liblz4-dev")]
    b = backend(tmp_path, names, monkeypatch)
    got = b.build("old")  # type: ignore[arg-type]
    assert len(got) == 1 + INSTALL_ROUNDS and not got[-1].ok
    assert len(b.installed) == INSTALL_ROUNDS


def test_no_fresh_container_once_a_side_has_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new side needs a package the old one did not: installing it would start a container
    without the old side's build, so the new side's configure failure stands."""
    b = backend(tmp_path, [], monkeypatch)
    assert steps_of(b, "old") == [("configure", True), ("build", True)]
    b.needs = [("ZLIB", "zlib1g-dev")]
    assert steps_of(b, "new") == [("configure", False)]
    assert b.installed == [] and b.started == []


def test_a_fresh_prepare_may_install_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder's retries (Debug, -Wno-error) clean up and prepare a new container: nothing is
    built in it, so a configure there may still get the packages it names."""
    b = backend(tmp_path, [], monkeypatch)
    assert steps_of(b, "old") == [("configure", True), ("build", True)]
    b.cleanup()
    b.prepare(tmp_path, {})
    b.needs = [("ZLIB", "zlib1g-dev")]
    assert steps_of(b, "old") == [("configure", False), ("configure", True), ("build", True)]
    assert b.installed == ["zlib1g-dev"]
