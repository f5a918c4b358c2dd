"""Split one CTest test that runs a whole gtest / Catch2 / doctest binary into one test per case
(setting `builder.split_cases`), so a speed-up in one case is not averaged away by the others.

The binary is asked for its cases (`--gtest_list_tests`, Catch2 v3 `--list-tests --verbosity
quiet`, doctest `--list-test-cases --no-intro`); each case becomes `<test>::<case>` running the
same command with the framework's filter. A binary that answers none of them stays one test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from cppperf.shared.engine.cmake import TestCase
from cppperf.shared.engine.sandbox import RunResult

Runner = Callable[[TestCase], RunResult]
_GTEST_SUITE = re.compile(r"^([A-Za-z_][\w/]*)\.\s*(#.*)?$")
_GTEST_CASE = re.compile(r"^  ([A-Za-z_][\w/]*)\s*(#.*)?$")


def parse_gtest(output: str) -> list[str]:
    cases: list[str] = []
    suite = None
    for line in output.splitlines():
        if mt := _GTEST_SUITE.match(line):
            suite = mt.group(1)
        elif (mt := _GTEST_CASE.match(line)) and suite:
            if not mt.group(1).startswith("DISABLED_") and not suite.startswith("DISABLED_"):
                cases.append(f"{suite}.{mt.group(1)}")
        elif line.strip():
            return []  # not a gtest listing
    return cases


def _plain_lines(output: str) -> list[str]:
    return [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith(("[doctest]", "="))]


FRAMEWORKS: list[tuple[str, list[str], Callable[[str], list[str]], Callable[[str], list[str]]]] = [
    ("gtest", ["--gtest_list_tests"], parse_gtest, lambda c: [f"--gtest_filter={c}"]),
    ("doctest", ["--list-test-cases", "--no-intro"], _plain_lines, lambda c: [f"--test-case={c}"]),
    ("catch2", ["--list-tests", "--verbosity", "quiet"], _plain_lines, lambda c: [c]),
]


def split(test: TestCase, run: Runner, *, max_cases: int = 500) -> list[TestCase]:
    """The test's cases as separate tests, or [test] when it is not a known framework binary."""
    if test.pass_regex or test.fail_regex or test.will_fail:
        return [test]  # the output decides those: keep CTest's judgement whole
    for name, args, parse, select in FRAMEWORKS:
        res = run(replace(test, command=[*test.command, *args]))
        if not res.ok:
            continue
        cases = parse(res.output)
        if cases and len(cases) <= max_cases and _plausible(name, res.output, cases):
            return [
                replace(test, name=f"{test.name}::{c}", command=[*test.command, *select(c)]) for c in cases
            ]
    return [test]


def _plausible(name: str, output: str, cases: list[str]) -> bool:
    if name == "gtest":
        return True  # parse_gtest already rejected anything that is not a listing
    # doctest/Catch2 listings are plain lines; a binary that ignored the flag and ran its tests
    # prints results instead ("passed", "failed", "assertions")
    lowered = output.lower()
    return not any(w in lowered for w in ("passed", "failed", "assertion", "error"))
