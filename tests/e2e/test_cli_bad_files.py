"""A careless user's files and ids, through the console script (`python -m cppperf`, as a shell runs
it): corrupt instance records, a heartbeat or agents file that is not one, instance ids that are
paths, export targets that are a FIFO or a symlink, NaN and out-of-range numbers. Each ends in one
line and a documented exit code, never a traceback; nothing is half-written or replaced."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.fakes import write_bare_instance

pytestmark = pytest.mark.stage2

USAGE, FAILURES = 2, 1
GOOD = "o__r-aaaaaaaaaaaa"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cppperf", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    """The error output, asserted to be one line without a traceback."""
    err = res.stderr.strip()
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr
    assert err.count("\n") == 0, err
    return err


@pytest.fixture
def corrupt_out(tmp_path: Path) -> Path:
    """OUT with one good record and four files that are not records."""
    out = tmp_path / "out"
    write_bare_instance(out, GOOD)
    store = out / "instances"
    (store / "o__r-bbbbbbbbbbbb.json").write_text('{"cppperf": {"instance_id": ')  # truncated
    (store / "o__r-cccccccccccc.json").write_bytes(b"\xff\xfe not utf-8")
    (store / "o__r-dddddddddddd.json").write_text("[1, 2, 3]")
    (store / "o__r-eeeeeeeeeeee.json").mkdir()  # a folder named like a record
    return out


@pytest.mark.parametrize(
    "verb",
    [["dataset", "list"], ["dataset", "stats"], ["dataset", "export", "{tmp}/tasks.jsonl"]],
)
def test_corrupt_records_are_skipped_with_one_warning(corrupt_out: Path, verb: list[str]) -> None:
    """Before: a folder in OUT/instances was a traceback (IsADirectoryError); the other bad files
    vanished from listings and exports without a word."""
    args = [a.replace("{tmp}", str(corrupt_out.parent)) for a in verb]
    res = run(*args, "--out", str(corrupt_out))
    assert res.returncode == 0, res.stderr
    err = one_line(res)
    assert err.startswith("warning: skipped 4 file(s) that are not instance records")
    assert "o__r-bbbbbbbbbbbb.json" in err  # the first, with why
    if verb[1] == "export":
        rows = (corrupt_out.parent / "tasks.jsonl").read_text().splitlines()
        assert [json.loads(r)["instance_id"] for r in rows] == [GOOD]


def test_report_all_over_corrupt_records(corrupt_out: Path, tmp_path: Path) -> None:
    res = run("dataset", "report", "--all", str(tmp_path / "all.html"), "--out", str(corrupt_out))
    assert res.returncode == 0 and "skipped 4 file(s)" in one_line(res)
    assert (tmp_path / "all.html").is_file()


@pytest.mark.parametrize(
    "verb", [["dataset", "inspect", "{id}"], ["dataset", "report", "{id}", "{tmp}/r.html"]]
)
def test_a_record_that_is_not_utf8_is_one_line(corrupt_out: Path, verb: list[str]) -> None:
    args = [a.replace("{id}", "o__r-cccccccccccc").replace("{tmp}", str(corrupt_out.parent)) for a in verb]
    res = run(*args, "--out", str(corrupt_out))
    assert res.returncode == FAILURES
    err = one_line(res)
    assert err.startswith("error: ") and "o__r-cccccccccccc.json: not an instance record: not UTF-8" in err


@pytest.mark.parametrize("iid", ["../x", "a/b", "x" * 300, "../../etc/passwd"])
@pytest.mark.parametrize(
    "verb",
    [
        ["dataset", "inspect", "{id}"],
        ["dataset", "report", "{id}", "{tmp}/r.html"],
        ["evaluate", "--instance", "{id}", "--patch", "{tmp}/p.diff"],
        ["evaluate", "--predictions", "gold", "--instance-ids", "{id}"],
    ],
)
def test_an_instance_id_that_is_a_path_is_refused(tmp_path: Path, iid: str, verb: list[str]) -> None:
    """Before: `a/b` and `../x` were looked up outside OUT/instances, and a 300-byte id was a
    traceback (File name too long)."""
    out = tmp_path / "out"
    write_bare_instance(out, GOOD)
    (tmp_path / "p.diff").write_text("")
    args = [a.replace("{id}", iid).replace("{tmp}", str(tmp_path)) for a in verb]
    res = run(*args, "--out", str(out))
    assert res.returncode == USAGE, res.stderr
    assert one_line(res).startswith("error: not an instance id: ")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("run_id", ["", "..", "_x", "a/b", "r\u00e9"])
@pytest.mark.parametrize(
    "verb",
    [
        ["evaluate", "--instance", GOOD, "--patch", "{tmp}/p.diff"],
        ["evaluate", "--predictions", "empty", "--instance-ids", GOOD],
    ],
)
def test_a_run_id_that_cannot_name_its_folder_is_refused(
    tmp_path: Path, run_id: str, verb: list[str]
) -> None:
    """Before: `--run-id ""` ran as the run `model`, `_x` as `x`, `a/b` as `a_b`, silently."""
    out = tmp_path / "out"
    write_bare_instance(out, GOOD)
    (tmp_path / "p.diff").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)) for a in verb]
    res = run(*args, "--run-id", run_id, "--out", str(out))
    assert res.returncode == USAGE, res.stderr
    assert one_line(res).startswith("error: not a run id: ")
    assert not (out / "runs").exists()


EXPORTS = [
    ["dataset", "export", "{tmp}/tasks.jsonl"],
    ["dataset", "export", "--format", "cppperf-db", "{tmp}/pub"],
    ["dataset", "report", "--all", "{tmp}/all.html"],
]


@pytest.mark.parametrize("verb", EXPORTS)
@pytest.mark.parametrize(
    ("store", "code", "why"),
    [
        ("missing", USAGE, "error: no instance store at {out}/instances: nothing to "),
        ("empty", FAILURES, "error: no instance record in {out}/instances: nothing to "),
    ],
)
def test_an_export_of_a_store_without_instances_is_refused(
    tmp_path: Path, verb: list[str], store: str, code: int, why: str
) -> None:
    """Before: `dataset export X --out /typo` said `exported 0 instance(s)` and exit 0, having
    replaced X with an empty file."""
    out = tmp_path / "typo"
    if store == "empty":
        (out / "instances").mkdir(parents=True)
    args = [a.replace("{tmp}", str(tmp_path)) for a in verb]
    target = Path(args[-1])
    if target.suffix:  # a file from an earlier export is neither replaced nor emptied
        target.write_text("precious\n")
    res = run(*args, "--out", str(out))
    assert res.returncode == code, res.stderr
    assert one_line(res).startswith(why.replace("{out}", str(out)))
    assert target.read_text() == "precious\n" if target.suffix else not target.exists()
    assert store == "empty" or not out.exists()  # a typo'd --out is not created either


@pytest.mark.parametrize("verb", [["dataset", "list"], ["dataset", "stats"], ["dataset", "stats", "--json"]])
def test_listing_a_store_that_is_not_there_is_refused(tmp_path: Path, verb: list[str]) -> None:
    """Before: `dataset list|stats --out /typo` printed 0 instances and exit 0; an empty store
    (the folder is there) still lists 0."""
    out = tmp_path / "typo"
    res = run(*verb, "--out", str(out))
    assert res.returncode == USAGE, res.stderr
    assert one_line(res).startswith(f"error: no instance store at {out}/instances: nothing to ")
    assert not out.exists()
    (out / "instances").mkdir(parents=True)
    res = run(*verb, "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "0" in res.stdout


def test_an_export_whose_filters_match_nothing_is_written_with_a_warning(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_bare_instance(out, GOOD)
    res = run("dataset", "export", str(tmp_path / "t.jsonl"), "--repo", "no/such", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert one_line(res) == (
        f"warning: none of the 1 instance(s) in {out}/instances matches the filters: the export is empty"
    )
    assert (tmp_path / "t.jsonl").read_text() == ""


@pytest.mark.parametrize(
    ("body", "why"), [("[1]", "not a heartbeat object"), ('{"at": "x"}', "not a heartbeat")]
)
def test_a_heartbeat_that_is_not_one_is_one_line(tmp_path: Path, body: str, why: str) -> None:
    (tmp_path / "builder.json").write_text(body)
    res = run("health", "builder", "--health-dir", str(tmp_path))
    assert res.returncode == FAILURES
    assert why in res.stdout and res.stdout.strip().count("\n") == 0 and "Traceback" not in res.stderr


def test_an_agents_file_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "agents.conf"
    conf.write_bytes(b"\xff\xfe")
    res = run("agents", "list", "--config", str(conf))
    assert res.returncode == USAGE and "not UTF-8 text" in one_line(res)
    res = run("agents", "add", "bob", "--config", str(conf), "--creds", str(tmp_path / "bob.creds"))
    assert res.returncode == USAGE and "not UTF-8 text" in one_line(res)
    assert not (tmp_path / "bob.creds").exists()
    assert conf.read_bytes() == b"\xff\xfe"


def test_an_agents_folder_is_refused_before_a_seed_is_written(tmp_path: Path) -> None:
    """Before: the seed was written, then a traceback (IsADirectoryError) left it orphaned."""
    conf = tmp_path / "agents.conf"
    conf.mkdir()
    res = run("agents", "add", "bob", "--config", str(conf), "--creds", str(tmp_path / "bob.creds"))
    assert res.returncode == USAGE and "is a folder" in one_line(res)
    assert not (tmp_path / "bob.creds").exists()


def test_service_keys_into_a_file_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "keys"
    target.write_text("x")
    res = run("agents", "service-keys", "--out", str(target))
    assert res.returncode == FAILURES
    assert one_line(res) == f"error: {target}: File exists"
    assert target.read_text() == "x"


def test_export_into_a_fifo_writes_into_it(tmp_path: Path) -> None:
    """`export /dev/stdout`, a FIFO, a device: written into, never replaced by a regular file (as
    root, the export used to replace /dev/stdout or /dev/full itself)."""
    out = tmp_path / "out"
    write_bare_instance(out, GOOD)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    res = run("dataset", "export", str(fifo), "--out", str(out))
    reader.join(timeout=30)
    assert res.returncode == 0, res.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert [json.loads(r)["instance_id"] for r in got[0].decode().splitlines()] == [GOOD]


def test_export_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_bare_instance(out, GOOD)
    real = tmp_path / "real.jsonl"
    real.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    res = run("dataset", "export", str(link), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and json.loads(real.read_text())["instance_id"] == GOOD


@pytest.mark.parametrize(
    ("var", "value", "why"),
    [
        ("CPPPERF_BUS_ACK_WAIT", "nan", "must be a finite number"),
        ("CPPPERF_BUILDER_TEST_TIMEOUT", "inf", "must be a finite number"),
        ("CPPPERF_BUILDER_LEASE_TIMEOUT", "-1", "must be >= 0"),
        ("CPPPERF_BUILDER_JOBS", "99999999999999999999", "must be at most"),
    ],
)
def test_a_number_setting_out_of_range_is_one_line(tmp_path: Path, var: str, value: str, why: str) -> None:
    res = run("dataset", "list", "--out", str(tmp_path), env={var: value})
    assert res.returncode == USAGE
    err = one_line(res)
    assert err.startswith("error: invalid setting ") and var in err and why in err


@pytest.mark.parametrize(
    "args",
    [
        ["classify", "eval", "--labels", "{labels}", "--phase2-share", "nan"],
        ["classify", "eval", "--labels", "{labels}", "--phase2-share", "-3"],
        ["classify", "eval", "--labels", "{labels}", "--folds", "0"],
        ["classify", "train", "--db", "{tmp}", "--gate-recall", "nan"],
        ["validate", "--timeout", "-1", "--nats-url", "nats://127.0.0.1:1"],
        ["validate", "--timeout", "nan", "--nats-url", "nats://127.0.0.1:1"],
    ],
)
def test_nan_and_out_of_range_flags_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    """Before: `--phase2-share nan` said `cannot convert float NaN to integer` (exit 1), `-3`
    printed negative call counts (exit 0), `--folds 0` divided by zero."""
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"message": "faster loop", "manual_label": "yes"}) + "\n")
    res = run(*[a.replace("{labels}", str(labels)).replace("{tmp}", str(tmp_path)) for a in args])
    assert res.returncode == USAGE
    assert one_line(res).startswith("error: Invalid value for '--")


def _db_entry(repo: str, sha: str, message: str) -> dict[str, object]:
    return {
        "metadata": {"repository_name": repo},
        "commit_info": {
            "old_sha": "0" * 40,
            "new_sha": sha,
            "commit_message": [message],
            "files_changed": [{"filename": "a.cpp", "status": "modified", "patch": "@@ -1 +1 @@\n-a\n+b\n"}],
        },
        "tests": {"tests": []},
    }


def test_train_never_leaves_half_a_model(tmp_path: Path) -> None:
    """The model is written whole or not at all (it may be the shipped one): a write that fails
    half-way (here the file-size limit) leaves the old model. Before: truncated, then half-written."""
    import resource

    db = tmp_path / "db"
    db.mkdir()
    labels = tmp_path / "labels.jsonl"
    rows = []
    for i in range(8):
        sha = f"{i:040x}"
        (db / f"e{i}.json").write_text(json.dumps(_db_entry(f"o{i}/r", sha, f"speed up parser loop {i}")))
        rows.append(
            json.dumps({"repo": f"n{i}/r", "sha": sha, "message": f"fix typo {i}", "manual_label": False})
        )
    labels.write_text("\n".join(rows) + "\n")
    model = tmp_path / "model.json"
    args = ["classify", "train", "--db", str(db), "--labels", str(labels), "--out", str(model)]
    assert run(*args).returncode == 0 and model.stat().st_size > 512  # the model is bigger than the limit
    model.write_text('{"old": true}')

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    res = subprocess.run(
        [sys.executable, "-m", "cppperf", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=small_files,  # one setrlimit in the child
    )
    assert res.returncode == FAILURES and "File too large" in one_line(res)
    assert model.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "labels.jsonl", "model.json"]


def test_calibrate_into_a_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    """Before: the whole A/A build and timing ran, then a traceback (IsADirectoryError) lost it."""
    res = run("calibrate", "--repo", str(tmp_path), "--sha", "HEAD", "--out", str(tmp_path))
    assert res.returncode == USAGE
    assert "is a folder: --out names the record's JSON file" in one_line(res)


def test_a_state_folder_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    """OUT/.state/nats (the embedded server's store) is a file: before, a FileExistsError traceback."""
    (tmp_path / ".state").mkdir()
    (tmp_path / ".state" / "nats").write_text("garbage")
    res = run("status", "--out", str(tmp_path))
    assert res.returncode == FAILURES
    assert one_line(res) == f"error: {tmp_path / '.state' / 'nats'}: File exists"


def test_import_skips_an_entry_whose_id_cannot_be_a_file_name(tmp_path: Path) -> None:
    """A published entry with a 300-byte repository name: before, `File name too long` stopped
    the whole import at that file; now it is reported and skipped, the others imported."""
    from tests.e2e.test_cli_inputs import published, timed

    src = tmp_path / "entries"
    src.mkdir()
    (src / "a_long.json").write_text(json.dumps(published("o/" + "r" * 300, [timed("t", 2.0, 1.0)], 1)))
    (src / "b_good.json").write_text(json.dumps(published("o/good", [timed("t", 2.0, 1.0)], 1)))
    res = run("dataset", "import", str(src), "--out", str(tmp_path / "out"))
    assert res.returncode == FAILURES and "Traceback" not in res.stderr
    assert "a_long.json: BadInput: not an instance id" in res.stdout + res.stderr
    assert [p.name for p in (tmp_path / "out" / "instances").iterdir()] == ["o__good-bbbbbbbbbbbb.json"]


DEEP = '{"a":' * 100_000  # deeper than Python's JSON decoder recurses


@pytest.mark.parametrize(
    ("setup", "args", "code", "why"),
    [
        (
            "out/instances/o__r-9.json",
            ["dataset", "inspect", "o__r-9", "--out", "{tmp}/out"],
            FAILURES,
            "too deeply",
        ),
        ("out/instances/o__r-9.json", ["dataset", "list", "--out", "{tmp}/out"], 0, "skipped 1 file(s)"),
        ("p.json", ["evaluate", "--predictions", "{tmp}/p.json", "--out", "{tmp}/out"], USAGE, "too deeply"),
        ("l.jsonl", ["classify", "eval", "--labels", "{tmp}/l.jsonl"], USAGE, "too deeply"),
        (
            "db/x.json",
            ["classify", "train", "--db", "{tmp}/db", "--out", "{tmp}/m.json"],
            FAILURES,
            "too deeply",
        ),
    ],
)
def test_json_nested_too_deeply_is_one_line(
    tmp_path: Path, setup: str, args: list[str], code: int, why: str
) -> None:
    """Before: a RecursionError traceback from Python's JSON decoder in each of these."""
    write_bare_instance(tmp_path / "out", GOOD)
    (tmp_path / setup).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / setup).write_text(DEEP)
    res = run(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.returncode == code, res.stderr
    assert why in one_line(res)


def test_a_heartbeat_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "builder.json").write_text(DEEP)
    res = run("health", "builder", "--health-dir", str(tmp_path))
    assert res.returncode == FAILURES and "Traceback" not in res.stderr
    assert (
        res.stdout.strip()
        == f"builder: unreadable heartbeat {tmp_path / 'builder.json'}: JSON nested too deeply"
    )


def test_import_of_json_nested_too_deeply_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text(DEEP)
    res = run("dataset", "import", str(tmp_path / "deep.json"), "--out", str(tmp_path / "out"))
    assert res.returncode == FAILURES and "Traceback" not in res.stderr
    assert "skipped" in res.stdout + res.stderr
