"""Builds and tests see the allow-listed environment on every path, jailed or not: a repository
whose CMake configure and test print their environment never see the bus password or tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from cppperf.shared.engine.backend import LocalBackend
from cppperf.shared.engine.cmake import BuildSpec
from cppperf.shared.engine.sandbox import Limits, jail_available
from tests.gitrepo import commit_files

PASSWORD = "bus-pass-9f8e7d6c"
TOKEN = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8"
CMAKE = """cmake_minimum_required(VERSION 3.13)
project(envdump NONE)
execute_process(COMMAND env OUTPUT_VARIABLE ALL_ENV)
message(STATUS "ENV-DUMP ${ALL_ENV}")
enable_testing()
add_test(NAME dump COMMAND env)
"""


@pytest.mark.parametrize("jailed", [False, True])
def test_configure_and_tests_never_see_the_services_secrets(
    jailed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if jailed and not jail_available():
        pytest.skip("bubblewrap cannot create its namespaces here")
    monkeypatch.setenv("CPPPERF_NATS_URL", f"nats://cppperf:{PASSWORD}@nats-1:4222")
    monkeypatch.setenv("CPPPERF_GITHUB_TOKENS", TOKEN)
    monkeypatch.setenv("NATS_PASSWORD", PASSWORD)
    monkeypatch.setenv("CXX", "g++")  # allow-listed: still passed
    repo = tmp_path / "repo"
    sha = commit_files(repo, {"CMakeLists.txt": CMAKE}, "env")
    backend = LocalBackend(tmp_path / "ws", BuildSpec(), {}, sandbox=True, jailed=jailed)
    backend.prepare(repo, {"new": sha})
    steps = backend.build("new")
    assert steps[-1].ok, steps[-1].result.output
    configure_log = (backend.logs / "new-configure.log").read_text()
    assert "ENV-DUMP" in configure_log and "CXX=g++" in configure_log
    [test] = backend.tests("new")
    res = backend.run_test("new", test, Limits(timeout=60, memory_mb=None))
    assert "CXX=g++" in res.output
    for text in (configure_log, res.output, *(s.result.output for s in steps)):
        assert PASSWORD not in text and TOKEN not in text and "CPPPERF_" not in text
