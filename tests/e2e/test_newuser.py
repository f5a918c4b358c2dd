"""A new user's pass over the CLI (issue #28): helps keep their examples' lines, human output
holds no Python reprs, nothing is cut, bad input is one line and a non-zero exit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_inputs import _store_with, cli
from tests.gitrepo import commit_files

pytestmark = pytest.mark.stage2


def runner_piped(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a pipe sees it (`cppperf … | cat`), on a narrow terminal."""
    env = {**os.environ, "COLUMNS": "40"}
    return subprocess.run(
        [sys.executable, "-m", "cppperf", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


REPR = re.compile(r"\{'|\['|<\w[\w.]* object at 0x")


def test_dataset_stats_prints_counts_not_reprs(tmp_path: Path) -> None:
    out_dir = _store_with(tmp_path)
    res = cli("dataset", "stats", "--out", str(out_dir))
    assert res.exit_code == 0, res.output
    assert not REPR.search(res.output), res.output
    assert "(imported 1)" in res.output and "oracles: unvalidated 1" in res.output


def _commands() -> list[tuple[str, Any]]:
    import typer.main

    from cppperf.cli import app

    found: list[tuple[str, Any]] = []

    def walk(cmd: Any, path: list[str]) -> None:
        found.append((" ".join(path), cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def test_every_help_keeps_its_examples_lines() -> None:
    """Each example command of a docstring is a line of its own in `--help`, as written: never
    reflowed into a paragraph or wrapped mid-command (copy-paste works)."""
    broken: list[str] = []
    for path, cmd in _commands():
        examples = [
            line.strip()
            for line in (cmd.help or "").splitlines()
            if line.strip().startswith(("cppperf ", "CPPPERF_", "Example"))
        ]
        shown = {
            line.strip() for line in cli(*path.split(), "--help", env={"COLUMNS": "80"}).output.splitlines()
        }
        broken += [f"{path or 'cppperf'}: {e}" for e in examples if e not in shown]
    assert not broken, "\n".join(broken)


def test_dataset_inspect_prints_untrusted_text_whole_and_literal(tmp_path: Path) -> None:
    """A commit message or build script is shown whole (never cut at N characters) and as
    written: brackets in it are text, not console markup (`[/b]` once raised a MarkupError)."""
    out_dir = _store_with(tmp_path)
    iid = "someowner__a-rather-long-repository-name-" + "b" * 12
    path = out_dir / "instances" / f"{iid}.json"
    record = json.loads(path.read_text())
    message = "Speed up [/b] the [bold]parser[/bold] " + "word " * 150 + "END-OF-MESSAGE"
    record["commit_info"]["commit_message"] = [message]
    script = "cmake -S src -B build " + "-DOPTION=ON " * 40 + "-DLAST=1"
    record["build_info"] = {"build_system": "cmake", "new_build_script": [script]}
    path.write_text(json.dumps(record))
    res = runner_piped("dataset", "inspect", iid, "--out", str(out_dir))
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert f"message: {message}\n" in res.stdout
    assert f"build: cmake; {script}\n" in res.stdout


def test_commit_messages_with_brackets_are_text_in_filter_and_classify(tmp_path: Path) -> None:
    """A commit message is untrusted text: `filter` and `classify` print it as written, whole."""
    repo = tmp_path / "proj"
    commit_files(repo, {"a.cpp": "int a;\n"}, "one")
    subject = "Speed up [/b] the [bold]parser[/bold]: faster " + "x" * 120
    commit_files(repo, {"a.cpp": "int a = 1;\n"}, subject)
    for args in (
        ("filter", "--repo", str(repo), "--explain", "--since", "2000-01-01", "--until", "2100-01-01"),
        ("classify", "--repo", str(repo), "--sha", "HEAD", "--backend", "heuristic"),
    ):
        res = runner_piped(*args)
        assert res.returncode == 0, res.stderr
        assert subject in res.stdout.splitlines()[0], res.stdout


def test_import_of_the_dataset_root_says_where_the_records_are(tmp_path: Path) -> None:
    """The published CppPerf-DB folder holds `index.jsonl` and `entries/`: importing the folder
    itself imports nothing, and the one line says which folder to give instead."""
    root = tmp_path / "cppperf-db"
    (root / "entries").mkdir(parents=True)
    (root / "index.jsonl").write_text("{}\n")
    res = cli("dataset", "import", str(root), "--out", str(tmp_path / "o"))
    assert res.exit_code == 1
    assert f"cppperf dataset import {root / 'entries'}" in res.output


def test_records_and_exports_are_readable_by_others(tmp_path: Path) -> None:
    """Instance records and `dataset export`'s files get the umask's mode (0644 under 022), not
    the temporary file's 0600: a team or a web server reads them."""
    old = os.umask(0o022)
    try:
        out_dir = _store_with(tmp_path)
        jsonl, pub = tmp_path / "tasks.jsonl", tmp_path / "pub"
        assert cli("dataset", "export", str(jsonl), "--out", str(out_dir)).exit_code == 0
        assert (
            cli("dataset", "export", "--format", "cppperf-db", str(pub), "--out", str(out_dir)).exit_code == 0
        )
    finally:
        os.umask(old)
    written = [*(out_dir / "instances").iterdir(), jsonl, *pub.iterdir()]
    assert {p.stat().st_mode & 0o777 for p in written} == {0o644}, written


def test_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """`--out FILE` (a typo, a report's name) was a traceback from the embedded NATS' start."""
    afile = tmp_path / "results"
    afile.write_text("not a folder\n")
    for args in (("status",), ("dataset", "list"), ("evaluate", "--predictions", "empty")):
        res = runner_piped(*args, "--out", str(afile))
        assert res.returncode == 2, res
        assert res.stderr.strip() == (
            f"error: invalid setting out_dir (CPPPERF_OUT_DIR): {afile} is a file: --out names a folder "
            "(created when missing)"
        ), res.stderr
        assert afile.read_text() == "not a folder\n"


def test_errors_on_a_piped_stderr_are_never_wrapped() -> None:
    """`cppperf … 2>&1 | cat` on a 40-column terminal: the error is still one line."""
    res = runner_piped("schema", "nope")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: unknown schema 'nope'"), res.stderr
    assert res.stderr.rstrip().endswith("eval-report, run-report")


def test_an_unreachable_container_engine_is_one_line_without_reprs(tmp_path: Path) -> None:
    from cppperf.shared.engine.backends import docker_client
    from cppperf.shared.errors import InfraFailure
    from cppperf.shared.settings import BuilderSettings

    sock = f"unix://{tmp_path}/no-engine.sock"
    with pytest.raises(InfraFailure) as err:
        docker_client(BuilderSettings(docker_host=sock))
    assert str(err.value) == f"no container engine reachable ({sock}): No such file or directory"


def test_agents_list_of_a_missing_config_says_so(tmp_path: Path) -> None:
    conf = tmp_path / "nowhere" / "agents.conf"
    res = cli("agents", "list", "--config", str(conf))
    assert res.exit_code == 0
    assert f"no agents in {conf} (no such file" in res.output


def test_export_into_a_missing_folder_refuses_and_creates_nothing(tmp_path: Path) -> None:
    """As `dataset report`: a typo'd folder is refused (exit 2), never created."""
    out_dir = _store_with(tmp_path)
    for args in (("x.jsonl",), ("--format", "cppperf-db", "pub")):
        target = tmp_path / "no" / "dir" / args[-1]
        res = cli("dataset", "export", *args[:-1], str(target), "--out", str(out_dir))
        assert res.exit_code == 2, res.output
        assert f"no folder {target.parent}" in res.output
        assert not (tmp_path / "no").exists()


def test_command_lists_are_never_cut() -> None:
    """A group's `Commands:` list wraps each verb's first sentence, never cuts it with `...`."""
    for path, cmd in _commands():
        if getattr(cmd, "commands", None):
            shown = cli(*path.split(), "--help", env={"COLUMNS": "40"}).output
            listed = shown[shown.index("Commands:") :]
            assert "..." not in listed, f"{path or 'cppperf'}:\n{listed}"


def test_a_piped_import_and_report_leave_no_stray_blank_line(tmp_path: Path) -> None:
    """A transient progress bar off a terminal printed a lone newline on stderr."""
    out_dir = _store_with(tmp_path)
    imp = runner_piped("dataset", "import", str(tmp_path / "src.json"), "--out", str(out_dir))
    rep = runner_piped(
        "dataset", "report", "--all", str(tmp_path / "o.html"), "--pages", "--out", str(out_dir)
    )
    assert (imp.returncode, rep.returncode) == (0, 0), (imp.stderr, rep.stderr)
    assert (imp.stderr, rep.stderr) == ("", "")


def test_repeatable_options_show_a_name_not_a_python_type() -> None:
    """`--repo <list[str]>` read like a Python type: repeatable options name what they take."""
    for path, cmd in _commands():
        for p in cmd.params:
            if p.param_type_name == "option" and getattr(p, "multiple", False):
                shown = cli(*path.split(), "--help", env={"COLUMNS": "100"}).output
                line = next(ln for ln in shown.splitlines() if ln.strip().startswith(p.opts[0] + " "))
                assert "list[" not in line, f"{path}: {line}"
