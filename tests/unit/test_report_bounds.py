"""What an agent's patch can make long never makes its report long: checks quote the file names
a patch gives (any length), and every agent's report is stored in the `evaluations` bucket every
agent shares — one agent's 250 kB reasons filled it and stopped everyone's grading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cppperf.services.evaluator.pipeline import REASON_LIMIT, EvalRequest, evaluate_report, short_reason
from cppperf.shared.domain import EvalVerdict
from tests.conftest import eval_instance, make_settings

LONG = "x" * 250_000


@pytest.mark.parametrize(
    "patch",
    [
        f'diff --git "a/{LONG}\\q" "b/x"\n',  # a bad escape in a quoted name
        f"diff --git a/{LONG} b/{LONG}.cpp\n--- a/{LONG}\n+++ b/{LONG}.cpp\n@@ -1 +1 @@\n-a\n+b\n",
        f"diff --git a/../{LONG}.cpp b/../{LONG}.cpp\n--- a/../{LONG}.cpp\n+++ b/../{LONG}.cpp\n@@ -1 +1 @@\n-a\n+b\n",
    ],
)
def test_a_refusal_quoting_a_huge_file_name_is_a_short_reason(patch: str, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, evaluator={"runs_dir": str(tmp_path / "runs")})
    req = EvalRequest(
        run_id="r", model="m", instance_id=eval_instance().instance_id, patch=patch, for_agent=True
    )
    report = evaluate_report(req, settings, instance=eval_instance())
    assert report.verdict in (
        EvalVerdict.UNSAFE_PATCH,
        EvalVerdict.MALFORMED_PATCH,
        EvalVerdict.FORBIDDEN_FILE,
    )
    assert len(report.reason) <= REASON_LIMIT + 40 and report.reason.endswith("characters cut]"), (
        report.reason[-80:]
    )
    stored = json.loads((tmp_path / "runs" / "r" / "m" / req.instance_id / "report.json").read_text())
    assert len(json.dumps(stored)) < 10_000  # what the bucket would hold: kilobytes, not the patch


def test_a_short_reason_is_kept_as_it_is() -> None:
    assert short_reason("edits test file tests/a.cpp") == "edits test file tests/a.cpp"
    cut = short_reason("y" * (REASON_LIMIT + 5))
    assert cut.startswith("y" * REASON_LIMIT) and cut.endswith("[... 5 characters cut]")


def test_failing_tests_outputs_are_a_few_kilobytes_in_all() -> None:
    from cppperf.services.evaluator.pipeline import FAILURE_OUTPUT, _tail
    from cppperf.shared.domain import FailedTest

    failures: list[FailedTest] = []
    for i in range(200):  # every test of a big project failing with megabytes of output
        failures.append(
            FailedTest(
                test=f"t{i}",
                returncode=1,
                timed_out=False,
                output_tail=_tail("z" * 1_000_000 + f"end{i}", failures),
            )
        )
    kept = [f.output_tail for f in failures]
    assert sum(map(len, kept)) == FAILURE_OUTPUT and kept[0].endswith("end0") and len(kept[0]) == 1500
    assert kept[-1] == "" and [f.test for f in failures][-1] == "t199"  # named, without output
