"""Whose fault a failing test is: pure decisions over what the runs said (the runs are elsewhere).

    limit_category(f)                 timeout | resource-limit | None (a None is re-run to decide)
    blame(side, same_ok=, other_ok=)  test-flaky | test-failure-both-sides | test-failure |
                                      test-failure-parent-only
    explain(category, f, build_type)  the rejection's `failure_detail`

A run killed by a wall (the timeout, the kernel's OOM killer or the pids limit) is the limit's
category at once. Any other failing run is repeated on its own side and run on the other side
once (builder/instance.py does that); what those two runs said decides:

    same side passes    -> test-flaky                (nondeterministic: nothing to time)
    other side fails    -> test-failure-both-sides   (the project or the build profile)
    fails on new only   -> test-failure              (the commit broke it)
    fails on old only   -> test-failure-parent-only  (the commit fixes it: nothing to time)
"""

from __future__ import annotations

from typing import Final

from cppperf.shared.domain import FailureCategory
from cppperf.shared.engine.backend import SideName
from cppperf.shared.engine.protocol import RunFailure
from cppperf.shared.engine.sandbox import KILLED

BOTH_SIDES_WHY: Final = "the project or the build profile, not the commit"
PARENT_ONLY_WHY: Final = "the commit fixes it, nothing to time"


def limit_category(*, timed_out: bool, returncode: int) -> FailureCategory | None:
    """The category of a run a wall stopped (no re-run can change it); None for a plain failure."""
    if timed_out:
        return FailureCategory.TIMEOUT
    if returncode in KILLED:
        return FailureCategory.RESOURCE_LIMIT
    return None


def blame(side: SideName, *, same_ok: bool, other_ok: bool) -> FailureCategory:
    """The category of a test that failed on `side`, from its re-run there (`same_ok`) and its run
    on the other side (`other_ok`)."""
    if same_ok:
        return FailureCategory.TEST_FLAKY
    if not other_ok:
        return FailureCategory.TEST_FAILURE_BOTH_SIDES
    return FailureCategory.TEST_FAILURE if side == "new" else FailureCategory.TEST_FAILURE_PARENT_ONLY


def explain(category: FailureCategory, f: RunFailure, build_type: str) -> str:
    """The `failure_detail` of a rejection for the failed run `f` decided as `category`."""
    where = f"test {f.test} failed on the {f.side} side in round {f.round}"
    if category in (FailureCategory.TIMEOUT, FailureCategory.RESOURCE_LIMIT):
        why = "timed out" if category == FailureCategory.TIMEOUT else "killed (resource limit)"
        return f"{where} ({why}): {f.output_tail[-800:]}"
    head, tail = f"{where} (exit code {f.returncode})", f.output_tail[-600:]
    if category == FailureCategory.TEST_FLAKY:
        return f"{head} and passed when re-run there: {tail}"
    if category == FailureCategory.TEST_FAILURE_BOTH_SIDES:
        return f"{head}; it fails on both sides in {build_type} ({BOTH_SIDES_WHY}): {tail}"
    if category == FailureCategory.TEST_FAILURE:
        return f"{head}; it fails on the new side only (the commit broke it): {tail}"
    if category == FailureCategory.TEST_FAILURE_PARENT_ONLY:
        return f"{head}; it fails on the old side (the parent) only ({PARENT_ONLY_WHY}): {tail}"
    raise ValueError(f"not a failed run's category: {category}")
