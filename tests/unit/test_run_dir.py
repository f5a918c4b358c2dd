"""One run folder per (run, model, instance): two names never share one, and evaluations of the
same one take turns on it (patches A and B at once on evaluator processes sharing the runs dir)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from cppperf.services.evaluator.pipeline import LOCK_SUFFIX, EvalRequest, evaluate_report, run_dir, safe_name
from cppperf.shared.files import locked
from tests.conftest import make_settings

COLLIDED_BEFORE = ["m", "_m", "m_", ".m", "m.", "__m__", "org/model", "org_model", "org model", "org//model"]


def test_two_names_never_share_a_folder() -> None:
    """Before: `m`, `_m`, `m.` were all `m`, and `org/model` was `org_model`: one model's reports
    overwrote another's, and `results` read the wrong one."""
    folders = [safe_name(n) for n in COLLIDED_BEFORE]
    assert len(set(folders)) == len(COLLIDED_BEFORE), dict(zip(COLLIDED_BEFORE, folders, strict=True))
    assert safe_name("m") == "m" and safe_name("org_model") == "org_model"  # a folder name stays itself
    assert safe_name("org/model").startswith("org_model-")


@pytest.mark.parametrize("name", ["", ".", "..", "/", "a/../b", "x" * 300, "é" * 200, "a\0b", "._.", "-"])
def test_any_name_is_one_short_folder_name(name: str) -> None:
    folder = safe_name(name)
    assert folder not in ("", ".", "..") and "/" not in folder and "\0" not in folder
    assert len(folder.encode()) <= 128
    assert safe_name(name) == folder  # the same name, the same folder


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
