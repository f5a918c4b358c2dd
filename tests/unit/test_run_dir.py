"""One run folder per (run, model, instance): two names never share one, and evaluations of the
same one take turns on it (patches A and B at once on evaluator processes sharing the runs dir)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from cppperf.services.evaluator.pipeline import (
    LOCK_SUFFIX,
    EvalRequest,
    evaluate_report,
    model_folder,
    run_dir,
    safe_name,
)
from cppperf.services.evaluator.runreport import report_path
from cppperf.shared.files import locked
from tests.conftest import make_settings

COLLIDED_BEFORE = [
    "m",
    "_m",
    "m_",
    ".m",
    "m.",
    "__m__",
    "org/model",
    "org_model",
    "org model",
    "org//model",
    "org_model+" + hashlib.sha256(b"org/model").hexdigest()[:10],  # the hashed form, typed as a name
    "org_model-" + hashlib.sha256(b"org/model").hexdigest()[:10],
]


def test_two_names_never_share_a_folder() -> None:
    """Before: `m`, `_m`, `m.` were all `m`, and `org/model` was `org_model`: one model's reports
    overwrote another's, and `results` read the wrong one."""
    folders = [safe_name(n) for n in COLLIDED_BEFORE]
    assert len(set(folders)) == len(COLLIDED_BEFORE), dict(zip(COLLIDED_BEFORE, folders, strict=True))
    assert safe_name("m") == "m" and safe_name("org_model") == "org_model"  # a folder name stays itself
    assert safe_name("org/model").startswith("org_model+")


@pytest.mark.parametrize("name", ["", ".", "..", "/", "a/../b", "x" * 300, "é" * 200, "a\0b", "._.", "-"])
def test_any_name_is_one_short_folder_name(name: str) -> None:
    folder = safe_name(name)
    assert folder not in ("", ".", "..") and "/" not in folder and "\0" not in folder
    assert len(folder.encode()) <= 128
    assert safe_name(name) == folder  # the same name, the same folder


@pytest.mark.parametrize("model", ["m" * 128, "o/" + "m" * 300, "x" * 80, "x" * 81])
def test_a_run_report_s_file_name_and_its_temporary_file_fit_in_255_bytes(model: str, tmp_path: Path) -> None:
    s = make_settings(tmp_path, evaluator={"runs_dir": str(tmp_path / "runs")})
    name = report_path(s, "r" * 128, model).name
    assert len(name.encode()) + len("..12345678.tmp") <= 255, name
    assert len(model_folder(model)) <= 80 and (model_folder(model) == model) == (len(model) <= 80)


def test_evaluations_of_one_run_folder_take_turns(tmp_path: Path) -> None:
    """While another evaluation of the same run, model and instance holds the folder, a second
    waits; then it runs, and its report and patch.diff are its own."""
    s = make_settings(tmp_path, evaluator={"runs_dir": str(tmp_path / "runs")})
    req = EvalRequest("r1", "m", "nobody__nothing-0123456789ab", "--- a/x\n+++ b/x\n")
    out = run_dir(s, req)
    done = threading.Event()

    def second() -> None:
        evaluate_report(req, s)
        done.set()

    with locked(out.parent / f"{out.name}{LOCK_SUFFIX}"):  # the first evaluation, still running
        t = threading.Thread(target=second, daemon=True)
        t.start()
        assert not done.wait(1.0)  # waits its turn
        assert not (out / "report.json").exists()
    assert done.wait(30)
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "unknown-instance" and (out / "patch.diff").read_text() == req.patch
    assert set(os.listdir(out.parent)) == {out.name, f"{out.name}{LOCK_SUFFIX}"}
