"""The evaluation verdict: pure decisions over what each step of the pipeline saw (pipeline.py runs
the steps and stops at the first that decides). The patch's text and tree are judged in checks.py
(empty-patch, malformed-patch, too-large, unsafe-patch, test-edit, forbidden-file); the rest here:

    instance_id_verdict(iid)              unknown-instance for an id no path may be built from
    refusal(jail_problem, trust=, docker=)  untrusted-refused: no jail and not trusted
    apply_verdict(applied)                apply-failed when no method applied the patch
    build_verdict(failed_side)            build-failed (the agent's tree) | instance-broken (ours)
    tests_defined_verdict(same)           test-edit when the agent's tree defines other tests
    common_tests_verdict(common)          instance-broken when no test exists on all three sides
    correctness_verdict(timed_out)        tests-failed | timeout (every failure timed out) | None
    timing_verdict(failed_side, timed_out)  a run failing while timed: the agent's or ours
    score_verdict(opt)                    opt | correct
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from cppperf.shared.domain import EvalVerdict

INSTANCE_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,150}__[A-Za-z0-9._-]{1,150}-[0-9a-f]{12}$")
AGENT: Final = "agent"


def instance_id_verdict(iid: str) -> EvalVerdict | None:
    return None if INSTANCE_ID.fullmatch(iid) else EvalVerdict.UNKNOWN_INSTANCE


def refusal(jail_problem: str, *, trust_patches: bool, docker: bool) -> EvalVerdict | None:
    """Agents' code runs in a jail (bubblewrap, or the docker backend's container) or not at all,
    unless the patches are trusted (`evaluator.trust_patches`)."""
    return EvalVerdict.UNTRUSTED_REFUSED if jail_problem and not trust_patches and not docker else None


def apply_verdict(applied: bool) -> EvalVerdict | None:
    return None if applied else EvalVerdict.APPLY_FAILED


def build_verdict(failed_side: str) -> EvalVerdict:
    """A side that does not build: the agent's is the patch's fault, the original's or the
    expert's the instance's."""
    return EvalVerdict.BUILD_FAILED if failed_side == AGENT else EvalVerdict.INSTANCE_BROKEN


def tests_defined_verdict(same: bool) -> EvalVerdict | None:
    return None if same else EvalVerdict.TEST_EDIT


def common_tests_verdict(common: Sequence[str]) -> EvalVerdict | None:
    return None if common else EvalVerdict.INSTANCE_BROKEN


def correctness_verdict(timed_out: Sequence[bool]) -> EvalVerdict | None:
    """From each failing correctness run's `timed_out`: None when nothing failed."""
    if not timed_out:
        return None
    return EvalVerdict.TIMEOUT if all(timed_out) else EvalVerdict.TESTS_FAILED


def timing_verdict(failed_side: str, *, timed_out: bool) -> EvalVerdict:
    """A run that failed while timed: on the agent's tree a flaky or nondeterministic patch, on
    the original or the expert a broken instance."""
    if failed_side != AGENT:
        return EvalVerdict.INSTANCE_BROKEN
    return EvalVerdict.TIMEOUT if timed_out else EvalVerdict.TESTS_FAILED


def score_verdict(opt: bool) -> EvalVerdict:
    return EvalVerdict.OPT if opt else EvalVerdict.CORRECT
