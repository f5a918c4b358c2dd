"""Valgrind's report of an instruction it cannot run (`runner_script.valgrind_unhandled`, read from
its `--log-file`): Valgrind 3.19 has no AVX-512, which `-march=native` emits on a host that has it.
The builder then proves on CPU time instead (`instance.cpu_fallback`): the metric's limit, not the
project's nor the commit's."""

from __future__ import annotations

from pathlib import Path

from cppperf.services.builder.instance import InstanceResult, cpu_fallback
from cppperf.shared.domain import FailureCategory, Verdict
from cppperf.shared.engine.runner_script import valgrind_logs_unhandled, valgrind_unhandled
from cppperf.shared.settings import BuilderSettings

# a real Cachegrind log (Valgrind 3.19.0) of libdivide's tester built with -march=native
LIBDIVIDE_LOG = """\
==2550== Cachegrind, a cache and branch-prediction profiler
==2550== Copyright (C) 2002-2017, and GNU GPL'd, by Nicholas Nethercote et al.
==2550== Using Valgrind-3.19.0 and LibVEX; rerun with -h for copyright info
==2550== Command: /tmp/ldv/b/tester
==2550== Parent PID: 2549
==2550==
--2550-- warning: L3 cache found, using its data for the LL simulation.
vex amd64->IR: unhandled instruction bytes: 0x62 0xE1 0x7D 0x48 0x6F 0x35 0x41 0xDC 0x2 0x0
vex amd64->IR:   REX=0 REX.W=0 REX.R=0 REX.X=0 REX.B=0
vex amd64->IR:   VEX=0 VEX.L=0 VEX.nVVVV=0x0 ESC=NONE
vex amd64->IR:   PFX.66=0 PFX.F2=0 PFX.F3=0
==2550== valgrind: Unrecognised instruction at address 0x10e835.
==2550==    at 0x10E835: void DivideTest<int>::test_many<(libdivide::Branching)0>(int) (in /tmp/ldv/b/tester)
==2550==    by 0x126039: void run_test<int>(char const*) (in /tmp/ldv/b/tester)
==2550==    by 0x4B88B4F: clone (clone.S:100)
==2550== Your program just tried to execute an instruction that Valgrind
==2550== did not recognise.  There are two possible reasons for this.
==2550== Either way, Valgrind will now raise a SIGILL signal which will
==2550== probably kill your program.
==2550==
==2550== Process terminating with default action of signal 4 (SIGILL)
==2550==  Illegal opcode at address 0x10E835
==2550==    at 0x10E835: void DivideTest<int>::test_many<(libdivide::Branching)0>(int) (in /tmp/ldv/b/tester)
==2550==
==2550== I   refs:      3,455,277
"""

CLEAN_LOG = """\
==2551== Cachegrind, a cache and branch-prediction profiler
==2551== Using Valgrind-3.19.0 and LibVEX; rerun with -h for copyright info
==2551== Command: /bin/true
==2551==
==2551== I   refs:      171,213
"""


def test_the_instruction_bytes_and_the_function_make_one_line() -> None:
    line = valgrind_unhandled(LIBDIVIDE_LOG)
    assert line == (
        "unhandled instruction bytes: 0x62 0xE1 0x7D 0x48 0x6F 0x35 0x41 0xDC 0x2 0x0 "
        "in void DivideTest<int>::test_many<(libdivide::Branching)0>(int) (in /tmp/ldv/b/tester)"
    )


def test_a_clean_log_reports_nothing() -> None:
    assert valgrind_unhandled(CLEAN_LOG) is None
    assert valgrind_unhandled("") is None


def test_an_unrecognised_instruction_without_its_bytes_is_still_reported() -> None:
    log = (
        "==7== valgrind: Unrecognised instruction at address 0x401000.\n==7==    at 0x401000: main (in /x)\n"
    )
    assert valgrind_unhandled(log) == "unrecognised instruction in main (in /x)"


def test_a_long_function_name_is_cut_to_one_short_line() -> None:
    log = LIBDIVIDE_LOG.replace("test_many", "t" * 1000)
    line = valgrind_unhandled(log)
    assert line is not None and len(line) <= 240 and line.endswith("...") and "\n" not in line


def test_the_logs_of_every_process_are_read_and_only_regular_files(tmp_path: Path) -> None:
    (tmp_path / "valgrind.10.log").write_text(CLEAN_LOG)
    (tmp_path / "cachegrind.out.11").write_text(LIBDIVIDE_LOG)  # not a log: never read
    assert valgrind_logs_unhandled(str(tmp_path)) is None
    (tmp_path / "valgrind.12.log").symlink_to(tmp_path / "cachegrind.out.11")  # the test's own link
    assert valgrind_logs_unhandled(str(tmp_path)) is None
    (tmp_path / "valgrind.13.log").write_text(LIBDIVIDE_LOG)  # a traced child's
    assert "DivideTest<int>::test_many" in str(valgrind_logs_unhandled(str(tmp_path)))


def _rejected(unhandled: str) -> InstanceResult:
    return InstanceResult(
        instance_id="x",
        verdict=Verdict.REJECTED,
        failure_category=FailureCategory.TEST_FAILURE_BOTH_SIDES,
        valgrind_unhandled=unhandled,
    )


def test_cpu_fallback_only_when_valgrind_could_not_run_under_the_exact_metric() -> None:
    exact, cpu = BuilderSettings(metric="cachegrind"), BuilderSettings(metric="cpu")
    why = cpu_fallback(_rejected("unhandled instruction bytes: 0x62 in main (in /x)"), exact)
    assert why == (
        "Valgrind cannot run this project's binaries (unhandled instruction bytes: 0x62 in main (in /x)):"
        " measured on cpu instead"
    )
    assert cpu_fallback(_rejected(""), exact) is None  # a real test failure under Valgrind
    assert cpu_fallback(_rejected("unhandled ..."), cpu) is None  # already timed: nothing to fall back to
    proven = _rejected("unhandled ...")
    proven.verdict = Verdict.IMPROVED
    assert cpu_fallback(proven, exact) is None
