"""The CLI as a new user meets it: help with examples, status on embedded NATS (starts and stops
cleanly), one-line setting errors, and `mine` end to end on the demo repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cppperf.demo import DemoRepo

pytestmark = pytest.mark.stage2

CLI = [sys.executable, "-m", "cppperf"]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def test_help_shows_examples() -> None:
    res = run_cli("--help")
    assert res.returncode == 0
    assert "cppperf mine --repo" in res.stdout and "status" in res.stdout


def test_status_on_embedded_nats_starts_and_stops(tmp_path: Path) -> None:
    env = {"CPPPERF_BUS_DATA_DIR": str(tmp_path / "nats")}
    res = run_cli("status", "--json", env=env)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert {r["subject"] for r in data["subjects"]} >= {"repo.found", "commit.selected", "patch.built"}
    assert (tmp_path / "nats" / "jetstream").is_dir()
    ps = subprocess.run(["pgrep", "-f", str(tmp_path / "nats")], capture_output=True, text=True, check=False)
    assert ps.stdout.strip() == ""  # the embedded server is gone


def test_status_says_who_holds_the_timing_core_and_since_when(tmp_path: Path) -> None:
    """`status` names the timing core's holder (this test process) and when it took it; --json
    carries the same under `waiting`."""
    from cppperf.shared.engine.leases import acquire

    leases = tmp_path / "leases"
    env = {"CPPPERF_BUS_DATA_DIR": str(tmp_path / "nats"), "CPPPERF_BUILDER_LEASE_DIR": str(leases)}
    lease = acquire(leases, [0], timeout=5)
    try:
        text = run_cli("status", env=env)
        data = run_cli("status", "--json", env=env)
    finally:
        lease.release()
    assert text.returncode == 0, text.stderr
    assert f"timing core 0: held by pid {os.getpid()} on " in text.stdout
    holders = json.loads(data.stdout)["waiting"]["holders"]
    assert [(h["core"], h["pid"]) for h in holders] == [(0, os.getpid())]
    after = run_cli("status", env=env)
    assert "nothing holds or waits for a timing core" in after.stdout


def test_invalid_setting_is_one_line(tmp_path: Path) -> None:
    res = run_cli("status", env={"CPPPERF_BUILDER_RUNS": "lots", "CPPPERF_BUS_DATA_DIR": str(tmp_path)})
    assert res.returncode == 2
    assert "builder.runs" in res.stderr


@pytest.mark.build
@pytest.mark.slow
def test_mine_end_to_end_on_the_demo_repo(demo_repo: DemoRepo, tmp_path: Path) -> None:
    env = {"CPPPERF_BUS_DATA_DIR": str(tmp_path / "nats"), "CPPPERF_BUILDER_WORK_DIR": str(tmp_path / "work")}
    res = run_cli(
        "mine",
        "--repo",
        str(demo_repo.path),
        "--runs",
        "11",
        "--out",
        str(tmp_path / "out"),
        "--json",
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)
    f = data["funnel"]
    assert (f["scanned"], f["selected"], f["classified"]) == (15, 8, 8)
    assert f["positive"] >= 1 and f["built"] >= 1 and f["improved"] >= 1
    perf_id = f"local__demo-{demo_repo.shas['perf'][:12]}"
    record = json.loads((tmp_path / "out" / "instances" / f"{perf_id}.json").read_text())
    assert record["cppperf"]["verdict"] == "improved"
    # a second run resumes from the store: nothing is redone, the funnel is unchanged
    again = run_cli(
        "mine",
        "--repo",
        str(demo_repo.path),
        "--runs",
        "11",
        "--out",
        str(tmp_path / "out"),
        "--json",
        env=env,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["funnel"] == f
    status = run_cli("status", "--json", env=env)
    rows = {r["subject"]: r for r in json.loads(status.stdout)["subjects"]}
    assert rows["commit.selected"]["done"] == 8 and rows["commit.selected"]["pending"] == 0


@pytest.mark.build
@pytest.mark.slow
@pytest.mark.timeout(1300)  # two mines on a loaded build node: beyond the suite's 300 s default
def test_two_mines_at_once_in_two_folders_sharing_a_work_dir_both_come_out_right(tmp_path: Path) -> None:
    """The work dir shared on purpose (CPPPERF_BUILDER_WORK_DIR): the second run starts while the
    first one's workspace is live, and must not remove it (it belongs to another run)."""
    import time

    from cppperf.demo import create_demo_repo

    demo = create_demo_repo(tmp_path / "demo", extra_kinds=False)
    work = tmp_path / "work"
    env = {**os.environ, "CPPPERF_BUILDER_WORK_DIR": str(work)}

    def start(name: str) -> subprocess.Popen[str]:
        args = ["mine", "--repo", str(demo.path), "--since", "2024-01-09", "--until", "2024-01-11"]
        args += ["--no-validate", "--runs", "11", "--out", str(tmp_path / name), "--json"]
        return subprocess.Popen(
            [*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    first = start("a")
    procs = [first]
    try:
        deadline = time.monotonic() + 120
        while not list((work / "attempts").glob("*/.owner.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        [owned] = list((work / "attempts").glob("*/.owner.json"))
        second = start("b")
        procs.append(second)
        results = [p.communicate(timeout=600) for p in (first, second)]
    finally:  # never leave a mine (and its pipes) running into the next test
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_, stderr) in zip((first, second), results, strict=True):
        assert p.returncode == 0, stderr[-3000:]
    perf_id = f"local__demo-{demo.shas['perf'][:12]}"
    for name, (stdout, _) in zip("ab", results, strict=True):
        assert json.loads(stdout)["funnel"]["improved"] == 1
        record = json.loads((tmp_path / name / "instances" / f"{perf_id}.json").read_text())
        assert record["cppperf"]["verdict"] == "improved", record["cppperf"].get("failure_detail")
        assert not (tmp_path / name / "runs").exists() or (tmp_path / name / "runs").is_dir()
    assert "stale_workspace_removed" not in results[1][1]
    assert json.loads(owned.read_text())["owner"] == str((tmp_path / "a" / ".state").absolute())


def test_status_from_a_second_shell_attaches_to_the_running_embedded_server(tmp_path: Path) -> None:
    from cppperf.shared.embedded import URL_FILE, EmbeddedNats

    store = tmp_path / "out" / ".state" / "nats"
    with EmbeddedNats(store) as server:  # what a running `mine --out OUT` holds
        assert (store / URL_FILE).read_text().strip() == server.url
        res = run_cli("status", "--json", "--out", str(tmp_path / "out"))
        assert res.returncode == 0, res.stderr
        assert "another cppperf" not in res.stderr
        assert {r["subject"] for r in json.loads(res.stdout)["subjects"]} >= {"commit.selected"}
    assert not (store / URL_FILE).exists()
