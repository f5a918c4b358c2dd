"""Base image bootstrap without an engine's cached image: the root file system streams into the
import through a pipe that is closed afterwards (a fresh machine's first bootstrap)."""

from __future__ import annotations

from typing import Any

import pytest


def test_first_bootstrap_closes_the_tar_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh machine (no base image): the import reads the root fs through a pipe that must be
    closed afterwards (filterwarnings=error turns an unclosed file into a failure)."""
    import subprocess
    from types import SimpleNamespace

    from cppperf.shared.engine import images

    real_run = subprocess.run

    def fake_run(argv: list[str], **kw: Any) -> Any:
        if argv[0] in ("which", "debootstrap", "chroot"):
            return SimpleNamespace(returncode=0, stdout="", stderr="")
        return real_run(argv, **kw)

    imported: list[int] = []

    class Images:
        def get(self, name: str) -> Any:
            if not imported:
                raise LookupError(name)  # no base image yet
            return SimpleNamespace(tag=lambda *_a: None)

    class Api:
        def import_image_from_stream(self, stream: Any, **_kw: Any) -> str:
            imported.append(len(stream.read()))
            return '{"status":"sha256:' + "a" * 64 + '"}'

    monkeypatch.setattr(images.subprocess, "run", fake_run)
    client = SimpleNamespace(images=Images(), api=Api())
    assert images.bootstrap_base(client, "bookworm") == "cppperf/base:bookworm"
    assert imported and imported[0] > 0


def test_era_among_the_releases_present() -> None:
    """A 2020 commit's era is buster; where buster cannot be had (deb.debian.org no longer serves
    it) the oldest release present serves it, and a CMake minimum still bumps it."""
    from cppperf.shared.engine.images import era_for

    assert era_for("2020-05-01").release == "buster"
    assert era_for("2020-05-01", available=["bullseye", "bookworm"]).release == "bullseye"
    assert era_for("2022-03-01", available=["bullseye", "bookworm"]).release == "bullseye"
    assert era_for("2024-03-01", available=["bullseye", "bookworm"]).release == "bookworm"
    need = "cmake_minimum_required(VERSION 3.20)"
    assert era_for("2020-05-01", need, available=["bullseye", "bookworm"]).release == "bookworm"
