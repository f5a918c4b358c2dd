"""A newcomer's bad inputs: each ends in one clear error line and a documented exit code (2 usage
error, 1 finished with failures), fails fast, and overwrites nothing. Also the outputs people
expect: --version, --json on listing verbs, piped output never cut, verdicts recomputed on import,
repository ids from the origin remote, state under OUT/.state, and the Python API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from cppperf.cli import app
from cppperf.shared.embedded import free_port
from tests.fakes import write_bare_instance
from tests.gitrepo import commit_files

pytestmark = pytest.mark.stage2

runner = CliRunner()
USAGE, FAILURES = 2, 1


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, list(args), env=env)


def error_text(res: Any) -> str:
    return str(res.output)  # stdout and stderr as a terminal shows them


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "proj"
    commit_files(repo, {"a.cpp": "int a;\n"}, "one")
    commit_files(repo, {"a.cpp": "int a = 1;\n"}, "two")
    return repo


@pytest.fixture
def merge_repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "merge"
    commit_files(repo, {"a.cpp": "int a;\n"}, "base")
    git = ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git, "checkout", "-qb", "side"], check=True)
    commit_files(repo, {"b.cpp": "int b;\n"}, "side")
    subprocess.run([*git, "checkout", "-q", "-"], check=True)
    commit_files(repo, {"c.cpp": "int c;\n"}, "main")
    subprocess.run([*git, "merge", "-q", "--no-edit", "side"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    return repo, sha.strip()


def published(name: str, tests: list[dict[str, Any]], improved: int) -> dict[str, Any]:
    return {
        "metadata": {"repository_name": name},
        "commit_info": {
            "old_sha": "a" * 40,
            "new_sha": "b" * 40,
            "files_changed": [{"filename": "x.cpp", "status": "modified"}],
            "commit_date": "2023-05-01T00:00:00Z",
        },
        "tests": {"significant_improvements": improved, "tests": tests},
        "raw_timing_data": {"min_p_value": 0.05, "min_exec_time_improvement": 0.05},
    }


def timed(name: str, old: float, new: float) -> dict[str, Any]:
    return {
        "test_name": name,
        "old_times": [old * (1 + 0.001 * (i % 7)) for i in range(30)],
        "new_times": [new * (1 + 0.001 * (i % 5)) for i in range(30)],
    }


# ------------------------------------------------------------------------------------------ basics
def test_version() -> None:
    res = cli("--version")
    assert res.exit_code == 0
    assert res.output.startswith("cppperf ")


def test_help_documents_exit_codes() -> None:
    res = cli("--help")
    assert "Exit codes: 0 done; 1 finished with failures; 2 usage error" in res.output


# ------------------------------------------------------------------------------------------ mine
def test_mine_nonexistent_repo_is_a_usage_error(tmp_path: Path) -> None:
    res = cli("mine", "--repo", "/nonexistent", "--out", str(tmp_path / "o"))
    assert res.exit_code == USAGE
    assert "/nonexistent: no such directory" in error_text(res)
    assert not (tmp_path / "o").exists()


def test_mine_not_a_git_repo(tmp_path: Path) -> None:
    res = cli("mine", "--repo", str(tmp_path))
    assert res.exit_code == USAGE
    assert "is not a git repository" in error_text(res)


@pytest.mark.parametrize("runs", ["0", "-1", "1", "3"])
def test_mine_too_few_runs(git_repo: Path, runs: str) -> None:
    res = cli("mine", "--repo", str(git_repo), "--runs", runs)
    assert res.exit_code == USAGE
    assert "--runs" in error_text(res)


def test_runs_from_env_are_checked_too(git_repo: Path) -> None:
    res = cli("filter", "--repo", str(git_repo), env={"CPPPERF_BUILDER_RUNS": "0"})
    assert res.exit_code == USAGE
    assert "builder.runs (CPPPERF_BUILDER_RUNS)" in error_text(res)


@pytest.mark.parametrize("flag", ["--since", "--until"])
def test_bad_date_flag(git_repo: Path, flag: str) -> None:
    res = cli("mine", "--repo", str(git_repo), flag, "yesterday")
    assert res.exit_code == USAGE
    assert "'yesterday' is not a date (YYYY-MM-DD)" in error_text(res)


def test_bad_date_env(git_repo: Path) -> None:
    res = cli("filter", "--repo", str(git_repo), env={"CPPPERF_MINING_SINCE": "notadate"})
    assert res.exit_code == USAGE
    assert "mining.since (CPPPERF_MINING_SINCE)" in error_text(res)
    assert "Traceback" not in error_text(res)


def test_name_must_be_owner_slash_name(git_repo: Path) -> None:
    res = cli("mine", "--repo", str(git_repo), "--name", "justaname")
    assert res.exit_code == USAGE
    assert "not owner/name" in error_text(res)


# ------------------------------------------------------------------------------------------ NATS
@pytest.mark.parametrize("verb", [["status"], ["dlq", "list"], ["dlq", "replay", "commit.selected"]])
def test_unreachable_nats_fails_fast_naming_the_url(verb: list[str]) -> None:
    port = free_port()
    t0 = time.monotonic()
    res = cli(*verb, "--nats-url", f"nats://127.0.0.1:{port}")
    assert time.monotonic() - t0 < 15
    assert res.exit_code == FAILURES
    assert f"cannot reach NATS at 127.0.0.1:{port}" in error_text(res)  # host:port, never userinfo


def test_mine_with_unreachable_nats(git_repo: Path, tmp_path: Path) -> None:
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    res = cli("mine", "--repo", str(git_repo), "--nats-url", url, "--out", str(tmp_path / "o"))
    assert res.exit_code == FAILURES
    assert f"cannot reach NATS at 127.0.0.1:{port}" in error_text(res)


@pytest.mark.parametrize("verb", [["status"], ["dlq", "list"], ["serve", "builder"]])
def test_malformed_nats_url_is_a_usage_error(verb: list[str]) -> None:
    res = cli(*verb, "--nats-url", "notaurl")
    assert res.exit_code == USAGE
    assert "'notaurl' is not a NATS URL" in error_text(res)


def test_malformed_nats_url_from_env() -> None:
    res = cli("status", env={"CPPPERF_NATS_URL": "http//x"})
    assert res.exit_code == USAGE


@pytest.mark.nats
def test_mine_search_offline_is_one_line(git_repo: Path, tmp_path: Path) -> None:
    env = {"CPPPERF_GITHUB_API_URL": f"http://127.0.0.1:{free_port()}", "CPPPERF_GITHUB_MAX_WAIT": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "cppperf", "mine", "--search", "--json", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=180,
        check=False,
    )
    assert proc.returncode == FAILURES, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "GitHub" in proc.stderr


def test_dlq_replay_unknown_subject() -> None:
    res = cli("dlq", "replay", "foo.bar")
    assert res.exit_code == USAGE
    assert "unknown subject 'foo.bar'" in error_text(res)


# ------------------------------------------------------------------------------------------ config
def test_unknown_toml_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[builder]\nrunz = 11\n")
    res = cli("status", "--config", str(cfg))
    assert res.exit_code == USAGE
    assert "unknown setting builder.runz" in error_text(res)


def test_unknown_toml_section(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[biulder]\nruns = 11\n")
    res = cli("status", "--config", str(cfg))
    assert res.exit_code == USAGE
    assert "unknown setting 'biulder'" in error_text(res)


def test_missing_config_file(tmp_path: Path) -> None:
    res = cli("status", "--config", str(tmp_path / "missing.toml"))
    assert res.exit_code == USAGE
    assert "missing.toml" in error_text(res)
    res = cli("status", env={"CPPPERF_CONFIG": str(tmp_path / "missing.toml")})
    assert res.exit_code == USAGE


# ------------------------------------------------------------------------------------------ build
def test_build_nonexistent_repo() -> None:
    res = cli("build", "--repo", "/nonexistent", "--sha", "HEAD")
    assert res.exit_code == USAGE
    assert "/nonexistent: no such directory" in error_text(res)


def test_build_unknown_commit(git_repo: Path) -> None:
    res = cli("build", "--repo", str(git_repo), "--sha", "nope")
    assert res.exit_code == USAGE
    assert "unknown commit nope" in error_text(res)


def test_build_merge_commit_needs_parent(merge_repo: tuple[Path, str]) -> None:
    repo, sha = merge_repo
    res = cli("build", "--repo", str(repo), "--sha", sha)
    assert res.exit_code == USAGE
    assert "is a merge commit (2 parents): give the parent to compare with (--parent)" in error_text(res)


def test_merge_commit_with_explicit_parent(merge_repo: tuple[Path, str]) -> None:
    import cppperf

    repo, sha = merge_repo
    commit = cppperf.commit_from_repo(repo, sha, parent=f"{sha}^2")
    assert commit.sha == sha


def test_images_prune_without_an_engine(tmp_path: Path) -> None:
    res = cli("images", "prune", env={"CPPPERF_BUILDER_DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert res.exit_code == FAILURES
    assert "no container engine reachable" in error_text(res)


# ------------------------------------------------------------------------------------------ evaluate
def test_evaluate_unknown_instance(tmp_path: Path) -> None:
    patch = tmp_path / "p.diff"
    patch.write_text("--- a/x\n+++ b/x\n")
    res = cli(
        "evaluate", "--instance", "a__b-123456789abc", "--patch", str(patch), "--out", str(tmp_path / "o")
    )
    assert res.exit_code == FAILURES
    assert "unknown instance a__b-123456789abc" in error_text(res)


@pytest.mark.parametrize("flag", ["--patch", "--predictions"])
def test_evaluate_missing_input_file(tmp_path: Path, flag: str) -> None:
    args = ["--instance", "a__b-1"] if flag == "--patch" else []
    res = cli("evaluate", *args, flag, str(tmp_path / "missing"))
    assert res.exit_code == USAGE
    assert "does not exist" in error_text(res)


def _prediction(iid: str, model: str = "m") -> dict[str, str]:
    return {"instance_id": iid, "model_name_or_path": model, "model_patch": "--- a/x\n+++ b/x\n"}


def test_predictions_as_a_json_array(tmp_path: Path) -> None:
    from cppperf.cli.evaluate import _load_predictions

    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([_prediction("a__b-1"), _prediction("a__b-2")]))
    assert [r["instance_id"] for r in _load_predictions(preds)] == ["a__b-1", "a__b-2"]
    res = cli("evaluate", "--predictions", str(preds), "--out", str(tmp_path / "o"))
    assert res.exit_code == FAILURES  # read fine; the instances are unknown
    assert "unknown instance a__b-1" in error_text(res)


def test_duplicated_prediction_is_refused(tmp_path: Path) -> None:
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps(_prediction("a__b-1")) + "\n" for _ in range(2)))
    res = cli("evaluate", "--predictions", str(preds))
    assert res.exit_code == USAGE
    assert "a second prediction of a__b-1 by m" in error_text(res)


def test_instance_ids_filter(tmp_path: Path) -> None:
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps(_prediction(f"a__b-{i}")) + "\n" for i in range(3)))
    res = cli("evaluate", "--predictions", str(preds), "--instance-ids", "a__b-1", "--out", str(tmp_path))
    assert res.exit_code == FAILURES
    assert "a__b-1" in error_text(res) and "a__b-2" not in error_text(res)
    res = cli("evaluate", "--predictions", str(preds), "--instance-ids", "a__b-9")
    assert res.exit_code == USAGE


@pytest.mark.parametrize("runs", ["0", "2"])
def test_evaluate_runs_checked_before_anything_runs(tmp_path: Path, runs: str) -> None:
    patch = tmp_path / "p.diff"
    patch.write_text("x")
    res = cli("evaluate", "--instance", "a__b-1", "--patch", str(patch), "--runs", runs)
    assert res.exit_code == USAGE
    assert not Path("runs").exists() or not any(Path("runs").glob("default/manual/a__b-1"))


# ------------------------------------------------------------------------------------------ dataset
def test_dataset_import_nonexistent() -> None:
    res = cli("dataset", "import", "/nonexistent")
    assert res.exit_code == USAGE
    assert "does not exist" in error_text(res)


def test_dataset_import_bad_file_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    res = cli("dataset", "import", str(bad), "--out", str(tmp_path / "o"))
    assert res.exit_code == FAILURES
    assert "skipped" in error_text(res)


def test_export_bad_since_does_not_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "tasks.jsonl"
    target.write_text("precious\n")
    res = cli("dataset", "export", str(target), "--since", "garbage", "--out", str(tmp_path / "o"))
    assert res.exit_code == USAGE
    assert target.read_text() == "precious\n"


def test_export_to_an_unwritable_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = cli("dataset", "export", str(blocker / "sub" / "t.jsonl"), "--out", str(tmp_path / "o"))
    assert res.exit_code == USAGE  # a bad path: refused before anything is written
    assert "cannot write" in error_text(res)
    assert "Traceback" not in error_text(res)


def test_demo_init_on_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    res = cli("demo", "init", str(f))
    assert res.exit_code == USAGE
    assert "is a file" in error_text(res)
    assert f.read_text() == "x"


def _store_with(tmp_path: Path, name: str = "someowner/a-rather-long-repository-name") -> Path:
    src = tmp_path / "src.json"
    src.write_text(json.dumps(published(name, [timed("t1", 0.010, 0.005)], improved=1)))
    out_dir = tmp_path / "o"
    res = cli("dataset", "import", str(src), "--out", str(out_dir), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["imported"] == ["someowner__a-rather-long-repository-name-" + "b" * 12]
    return out_dir


def test_json_on_listing_verbs(tmp_path: Path) -> None:
    out_dir = _store_with(tmp_path)
    iid = "someowner__a-rather-long-repository-name-" + "b" * 12
    rows = json.loads(cli("dataset", "list", "--json", "--out", str(out_dir)).stdout)
    assert [r["instance_id"] for r in rows] == [iid]
    assert rows[0]["verdict"] == "improved"
    one = json.loads(cli("dataset", "inspect", iid, "--json", "--out", str(out_dir)).stdout)
    assert one["changed_tests"][0]["name"] == "t1" and one["changed_tests"][0]["ci"] is not None
    stats = json.loads(cli("dataset", "stats", "--json", "--out", str(out_dir)).stdout)
    assert stats["instances"] == 1 and stats["verdicts"] == {"improved": 1}
    assert stats["origin"] == {"imported": 1}


def test_piped_list_is_never_cut(tmp_path: Path) -> None:
    out_dir = _store_with(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "cppperf", "dataset", "list", "--out", str(out_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "40"},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "someowner__a-rather-long-repository-name-" + "b" * 12 in proc.stdout


def test_import_recomputes_verdicts_from_raw_timings(tmp_path: Path) -> None:
    from cppperf.dataset.records import to_record

    rec = to_record(
        published("o/n", [timed("fast", 0.010, 0.005), timed("slow", 0.010, 0.020)], improved=1), "x.json"
    )
    assert rec.cppperf.verdict == "regressed"  # not `improved` beside a significant regression
    assert rec.cppperf.regressed_tests == ["slow"]
    assert rec.cppperf.improved_tests == ["fast"]
    assert rec.tests.significant_improvements == 1  # the published fields stay as they were


def test_published_regression_record_is_not_improved() -> None:
    from cppperf.dataset.records import to_record

    src = Path(__file__).resolve().parents[3] / "shared" / "data" / "cppperf-db" / "entries"
    files = sorted(src.glob("fmtlib_fmt_c9102619da70*.json"))
    if not files:
        pytest.skip("CppPerf-DB data not available")
    rec = to_record(json.loads(files[0].read_text()), files[0].name)
    assert rec.cppperf.verdict != "improved"
    assert rec.cppperf.regressed_tests


def test_instance_page_shows_regressions_with_their_p(tmp_path: Path) -> None:
    from cppperf.dataset.records import to_record
    from cppperf.dataset.report import _test_rows

    rec = to_record(published("o/n", [timed("slow", 0.010, 0.020)], improved=0), "x.json")
    (row,) = _test_rows(rec)
    assert row["regressed"] and row["p"] < 0.05
    assert row["ci"] is not None


def test_imported_instance_page_shows_a_ci_for_every_timed_test() -> None:
    """Import keeps a CI only where the verdict needs one; the instance page bootstraps the rest
    from the published raw times, so no timed test shows "–"."""
    from cppperf.dataset.records import to_record
    from cppperf.dataset.report import _test_rows, instance_section

    rec = to_record(
        published("o/n", [timed("same", 0.010, 0.010), timed("slow", 0.010, 0.020)], improved=0), "x.json"
    )
    same = next(t for t in rec.cppperf.tests if t.name == "same")
    assert same.ci_high == float("inf")  # undecided at import: no CI stored
    rows = {r["name"]: r for r in _test_rows(rec)}
    low, high = rows["same"]["ci"]
    assert 0.98 < low <= high < 1.02  # (nearly) equal times: a narrow CI at 1
    assert rows["slow"]["ci"][1] < 0.6  # a 2× slowdown: speed-up CI near 0.5
    assert "<td>–</td><td>" not in instance_section(rec).split("<table")[1]


# ------------------------------------------------------------------------------------------ state, ids, API
def test_state_lives_in_the_output_folder(tmp_path: Path) -> None:
    from cppperf.shared.settings import load_settings

    s = load_settings(env={}, out_dir=str(tmp_path / "results"))
    assert s.nats_data_dir() == tmp_path / "results" / ".state" / "nats"


def test_repo_id_from_github_origin(git_repo: Path) -> None:
    from cppperf.cli.repos import local_repo_id

    assert local_repo_id(git_repo) == "local/proj"
    subprocess.run(
        ["git", "-C", str(git_repo), "remote", "add", "origin", "git@github.com:zeux/pugixml.git"], check=True
    )
    assert local_repo_id(git_repo) == "zeux/pugixml"
    assert local_repo_id(git_repo, "me/fork") == "me/fork"


def test_python_api_scan_and_commit(git_repo: Path) -> None:
    import cppperf

    seen: list[int] = []
    found = list(cppperf.scan(git_repo, until="2999-12-31", progress=lambda p: seen.append(p.scanned)))
    assert seen == [1, 2] and [c.message for c in found] == ["two", "one"]  # newest first
    commit = cppperf.commit_from_repo(git_repo, "HEAD", name="o/n")
    assert commit.repo == "o/n"
    with pytest.raises(ValueError, match="not a git repository"):
        cppperf.scan(git_repo / "nope")
    with pytest.raises(ValueError, match="unknown instance"):
        cppperf.evaluate("a__b-123456789abc", "", out_dir=git_repo / "out")


def test_overview_has_distributions_and_links(tmp_path: Path) -> None:
    out_dir = _store_with(tmp_path)
    dest = tmp_path / "site" / "overview.html"
    dest.parent.mkdir()  # the report refuses a missing folder (it never creates one)
    res = cli("dataset", "report", "--all", str(dest), "--pages", "--out", str(out_dir))
    assert res.exit_code == 0, res.output
    page = dest.read_text()
    assert 'id="verdicts"' in page and 'id="speedups"' in page
    iid = "someowner__a-rather-long-repository-name-" + "b" * 12
    assert f'href="overview_instances/{iid}.html"' in page
    assert (tmp_path / "site" / "overview_instances" / f"{iid}.html").is_file()
    assert cli("dataset", "report", "x", "--pages").exit_code == USAGE


def _readme_block(heading: str) -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index(heading) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```", start)]


def test_readme_demo_instance_id_is_real(tmp_path: Path) -> None:
    from cppperf.demo import create_demo_repo

    repo = create_demo_repo(tmp_path / "demo")
    assert repo.shas["perf"].startswith("4bda4860cd0d")
    assert "local__demo-4bda4860cd0d" in _readme_block("### Python API")


@pytest.mark.build
@pytest.mark.slow
def test_readme_python_api_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cppperf.demo import create_demo_repo

    demo = create_demo_repo(tmp_path / "demo")
    code = _readme_block("### Python API").replace("/tmp/demo", str(demo.path))
    code = code.replace('"results"', repr(str(tmp_path / "results")))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example
    finally:
        os.chdir(here)
    printed = capsys.readouterr().out
    assert "local__demo-4bda4860cd0d improved" in printed
    assert list(cwd.iterdir()) == []  # results only under out_dir, nothing in the current folder
    results = tmp_path / "results"
    assert (results / "runs" / "default" / "expert" / "local__demo-4bda4860cd0d" / "report.json").is_file()


@pytest.mark.nats
def test_status_keeps_its_state_in_the_output_folder(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cppperf", "status", "--json", "--out", str(tmp_path / "proj")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "proj" / ".state" / "nats" / "jetstream").is_dir()
    assert json.loads(res.stdout)["funnel"]["scanned"] == 0


@pytest.mark.nats
def test_ctrl_c_says_stopping_at_once(tmp_path: Path) -> None:
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "cppperf", "serve", "filter", "--out", str(tmp_path / "o")],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "filter running" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopping… waiting for filter to hand back in-flight messages" in rest
    assert proc.returncode == 130
    assert "Traceback" not in rest


def test_usage_error_is_one_line_from_the_console_script(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cppperf", "mine", "--repo", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == USAGE
    assert res.stderr.strip().count("\n") == 0
    assert res.stderr.startswith("error: ") and "no such directory" in res.stderr
    assert "cppperf mine --help" in res.stderr


def test_a_broken_repository_is_one_line_from_the_console_script(git_repo: Path) -> None:
    """git cannot read the history (objects gone): one line naming git's complaint, exit 2 —
    before, `filter` walked it as an empty history and said nothing."""
    import shutil

    shutil.rmtree(git_repo / ".git" / "objects")
    (git_repo / ".git" / "objects").mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "cppperf", "filter", "--repo", str(git_repo)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == USAGE, res.stderr
    assert "Traceback" not in res.stderr and res.stderr.strip().count("\n") == 0
    assert res.stderr.startswith("error: git log HEAD failed") and "bad object" in res.stderr


def test_compare_batch_matches_compare_test() -> None:
    import math

    from cppperf.shared.engine.stats import compare_batch, compare_test

    samples = {
        "a": ([0.010 + 0.0001 * (i % 7) for i in range(30)], [0.006 + 0.0001 * (i % 5) for i in range(30)]),
        "b": ([0.010] * 5, [0.010] * 5),  # identical: p = 1 both ways
        "c": ([0.01, 0.012, 0.011], [0.02, 0.021, 0.019]),  # small: scipy's exact path
    }
    for x, y in zip(
        compare_batch(samples),
        [compare_test(k, *samples[k], resamples=0) for k in sorted(samples)],
        strict=True,
    ):
        for f, u in msgspec.structs.asdict(x).items():
            v = getattr(y, f)
            assert u == v or (isinstance(u, float) and math.isclose(u, v, rel_tol=1e-12)), (x.name, f, u, v)


@pytest.mark.nats
def test_dlq_list_json(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cppperf", "dlq", "list", "commit.selected", "--json", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout) == []


@pytest.mark.nats
def test_mine_off_a_terminal_keeps_tables_off_stderr(git_repo: Path, tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cppperf", "mine", "--repo", str(git_repo), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert res.returncode == FAILURES, res.stderr[-2000:]  # its only repository was rejected
    assert "funnel" in res.stdout and "TOTAL" in res.stdout
    assert not any(ch in res.stderr for ch in "┃━┏")  # no live table among the JSON log lines
    assert "rejected local/proj" in res.stderr


@pytest.mark.nats
def test_mine_in_a_terminal_sends_logs_to_a_file(git_repo: Path, tmp_path: Path) -> None:
    """In a terminal the live table owns the screen: log lines go to OUT/.state/logs/, whose path is
    printed, and none of them is written among the table's lines."""
    import pty
    import re

    primary, secondary = pty.openpty()
    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cppperf", "mine", "--repo", str(git_repo), "--out", str(out)],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
    )
    os.close(secondary)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            data = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=30)
    os.close(primary)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert proc.returncode == FAILURES, screen[-2000:]  # its only repository was rejected
    match = re.search(r"logs: (\S+\.log)", screen.replace("\r\n", "\n").replace("\n", ""))
    assert match, screen[-2000:]
    logs = sorted((out / ".state" / "logs").glob("mine-*.log"))
    assert len(logs) == 1 and logs[0].read_text().strip(), "the log file holds the run's log lines"
    first = json.loads(logs[0].read_text().splitlines()[0])
    assert "event" in first
    # no log line among the live view's output, whether rendered as JSON or for the console
    assert '"event"' not in screen and "[info" not in screen and "[warning" not in screen


@pytest.mark.nats
def test_mine_exits_1_when_a_message_was_dead_lettered(git_repo: Path, tmp_path: Path) -> None:
    """A run whose only failure is a dead letter (a garbage `repo.found` already queued) still
    finishes, says how many were dead-lettered and where to look, and exits 1."""
    import asyncio

    from cppperf.shared.bus import Bus
    from cppperf.shared.embedded import EmbeddedNats
    from cppperf.shared.messages import REPO_FOUND
    from tests.conftest import make_settings

    with EmbeddedNats(tmp_path / "nats") as server:

        async def queue_garbage() -> None:
            bus = await Bus.connect(server.url, make_settings(tmp_path).bus)
            try:
                await bus.provision()
                await bus.js.publish(REPO_FOUND, b"\x00 not a message")
            finally:
                await bus.close()

        asyncio.run(queue_garbage())
        res = subprocess.run(
            [
                sys.executable, "-m", "cppperf", "mine", "--repo", str(git_repo), "--no-validate",
                "--nats-url", server.url, "--out", str(tmp_path / "o"),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )  # fmt: skip
    assert res.returncode == FAILURES, res.stderr[-2000:]
    assert "dead-lettered: see `cppperf dlq list`" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_evaluate_empty_predictions_write_the_run_report_under_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SWE-bench's harness check: `--predictions empty` over OUT/instances (an unknown id among
    them counted as an error), the run-level report under --out, nothing in the current folder."""
    out = tmp_path / "out"
    write_bare_instance(out)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    ids = "o__r-aaaaaaaaaaaa,x__y-000000000000"
    res = CliRunner().invoke(
        app, ["evaluate", "--predictions", "empty", "--instance-ids", ids, "--out", str(out), "--run-id", "v"]
    )
    assert res.exit_code == 1, res.output  # the unknown instance
    assert "1 empty patch, 1 error" in res.output and "{" not in res.output
    rr = json.loads((out / "runs" / "v" / "empty.v.json").read_text())
    assert rr["submitted_ids"] == ["o__r-aaaaaaaaaaaa", "x__y-000000000000"]
    assert rr["empty_patch_ids"] == ["o__r-aaaaaaaaaaaa"] and rr["error_ids"] == ["x__y-000000000000"]
    assert list(cwd.iterdir()) == []


def test_import_of_an_empty_folder_says_why(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    res = cli("dataset", "import", str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    assert res.exit_code == 1
    assert "nothing to import" in res.output and "*.json" in res.output


def test_report_into_a_missing_folder_refuses_and_creates_nothing(tmp_path: Path) -> None:
    res = cli("dataset", "report", "--all", str(tmp_path / "no" / "dir" / "x.html"), "--out", str(tmp_path))
    assert res.exit_code == 2 and "no folder" in res.output
    assert not (tmp_path / "no").exists()
    ok = cli("dataset", "report", "--all", str(tmp_path / "x.html"), "--out", str(_store_with(tmp_path)))
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "x.html").stat().st_mode & 0o777 == 0o644  # readable by the people it is for


def test_every_option_of_every_verb_is_described() -> None:
    """`--help` on any verb describes each of its options and arguments (none left as a bare name)."""
    import typer.main

    from cppperf.cli import app

    missing: list[str] = []

    def walk(cmd: Any, path: str) -> None:
        for p in cmd.params:
            if p.param_type_name in ("option", "argument") and not getattr(p, "hidden", False) and not p.help:
                missing.append(f"{path} {'/'.join(p.opts)}")
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "cppperf")
    assert not missing, missing


def test_evaluate_json_leaves_out_every_sample_key(tmp_path: Path) -> None:
    """`evaluate --json` strips what the bus strips (handlers.SAMPLE_KEYS), not only `samples`."""
    from cppperf.services.evaluator.handlers import SAMPLE_KEYS
    from cppperf.services.evaluator.pipeline import patch_sha256

    out_dir = _store_with(tmp_path)
    iid = "someowner__a-rather-long-repository-name-" + "b" * 12
    patch = tmp_path / "p.diff"
    patch.write_text("diff --git a/x.cpp b/x.cpp\n")
    cached = out_dir / "runs" / "r" / "m" / iid / "report.json"
    cached.parent.mkdir(parents=True)
    samples = {k: {"t": {"agent": [1.0, 2.0]}} for k in SAMPLE_KEYS}  # per test, per side
    cached.write_text(
        json.dumps({"verdict": "correct", "patch_sha256": patch_sha256(patch.read_text())} | samples)
    )
    res = cli(
        "evaluate", "--instance", iid, "--patch", str(patch), "--model", "m", "--run-id", "r",
        "--json", "--out", str(out_dir),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (report,) = json.loads(res.stdout)["reports"]
    assert report["verdict"] == "correct" and not SAMPLE_KEYS & report.keys()


@pytest.mark.parametrize("verb", ["build", "mine"])
def test_runs_that_cannot_decide_one_test_are_refused(git_repo: Path, tmp_path: Path, verb: str) -> None:
    """--runs 4 (3 samples a side): no rank test can reach alpha=0.05, so no verdict but
    `not-improved` is possible; refused before anything runs, with the smallest --runs."""
    where = ["--sha", "HEAD"] if verb == "build" else []
    res = cli(verb, "--repo", str(git_repo), *where, "--runs", "4", "--out", str(tmp_path / "o"))
    assert res.exit_code == USAGE
    assert "--runs 4 cannot decide even one test" in error_text(res) and "use --runs 5 or more" in error_text(
        res
    )
    assert "under the 'ours' rule" in error_text(res) and "<" not in error_text(res)  # no repr
    assert not (tmp_path / "o" / "instances").exists()
