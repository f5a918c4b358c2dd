"""Hostile patches against the exact metric (`builder.metric=cachegrind`, the evaluator grading an
instance proven on counts by counts): a patch that counts fewer instructions under Valgrind than
it executes natively must not score `opt`.

The class: whatever makes the count disagree with the work — detecting Valgrind
(`RUNNING_ON_VALGRIND`, `LD_PRELOAD` naming `vgpreload`, /proc/self/maps, argv, the environment)
and doing less there, work whose count is lost (a forked child's count file deleted by its
parent: Valgrind writes them as the test's uid). Hiding Valgrind from the code it runs cannot be
complete (its client request is an instruction sequence the code can execute), so the defence is
a check of meaning: an `opt` decided on counts is confirmed by native CPU time on the timing core
(`pipeline._confirm`: the three trees timed and scored as a timed evaluation; the agent's tree
must be measurably faster than the original's and not clearly slower than the expert's, not only
count fewer instructions); an honest patch (the expert's) passes it. Also: the count files are read only as
regular files (a FIFO or a symlink a test leaves in the count directory neither hangs the runner
nor counts a file outside it)."""

from __future__ import annotations

import difflib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from cppperf.demo import core, create_demo_repo
from cppperf.shared.engine.runner_script import cachegrind_counts, valgrind_unsupported
from tests.conftest import make_settings
from tests.integration.test_builder import prove
from tests.integration.test_exact_metric import _has_avx512f

pytestmark = [
    pytest.mark.skipif(valgrind_unsupported() is not None, reason="valgrind not installed"),
    pytest.mark.stage2,
]

# spin() does its three passes natively and one under Valgrind: the count of the expert's patch
# (one pass), the native time of the original (three)
DETECT = """\
#include <cstdio>
#include <cstdlib>
#include <cstring>
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif

static bool under_valgrind() {
#ifdef RUNNING_ON_VALGRIND
  if (RUNNING_ON_VALGRIND) return true;
#endif
  const char* pre = std::getenv("LD_PRELOAD");
  if (pre && std::strstr(pre, "vgpreload")) return true;
  bool seen = false;
  if (FILE* maps = std::fopen("/proc/self/maps", "r")) {
    char line[512];
    while (!seen && std::fgets(line, sizeof line, maps)) seen = std::strstr(line, "valgrind") != nullptr;
    std::fclose(maps);
  }
  return seen;
}

"""


def cheating_core(native_reps: int = 3) -> str:
    """The original's spin() with one pass under Valgrind (the expert's count) and `native_reps`
    natively (3: the original's work; 2: a real but lesser speed-up than the expert's)."""
    text = core(3).replace("rep < 3;", f"rep < (under_valgrind() ? 1 : {native_reps});")
    head, sep, rest = text.partition('#include "core.h"\n')
    return head + sep + DETECT + rest


# No detection at all: spin()'s three passes run in a forked child (traced: Valgrind follows every
# fork), and the parent, after waiting for it, deletes the child's count file from the count
# directory (Valgrind writes it as the test's uid, in the jail's /tmp). Counted: only the parent's
# work; run: all of it.
FORKING_CORE = """\
#include "core.h"

#include <cstring>
#include <dirent.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

static volatile unsigned long long sink;

static void forget(pid_t child) {
  const std::string name = "cachegrind.out." + std::to_string(child);
  DIR* tmp = opendir("/tmp");
  if (!tmp) return;
  while (dirent* e = readdir(tmp)) {
    if (std::strncmp(e->d_name, "cppperf-cg-", 11) == 0) {
      unlink((std::string("/tmp/") + e->d_name + "/" + name).c_str());
    }
  }
  closedir(tmp);
}

unsigned long long spin(unsigned long long iters) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  pid_t child = fork();
  if (child == 0) {
    unsigned long long x = 0;
    for (int rep = 0; rep < 3; ++rep) {
      x = 88172645463325252ull;
      for (unsigned long long i = 0; i < iters; ++i) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        sink = x;
      }
    }
    if (write(fds[1], &x, sizeof x) != sizeof x) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  unsigned long long x = 0;
  if (read(fds[0], &x, sizeof x) != sizeof x) x = 0;
  close(fds[0]);
  waitpid(child, nullptr, 0);
  forget(child);
  return x;
}
"""


def patch_of(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """The demo's perf commit proven on Cachegrind's counts; the evaluator's settings (its own
    metric the default, cpu: the instance's exact metric decides)."""
    tmp = tmp_path_factory.mktemp("cheats")
    demo = create_demo_repo(tmp / "demo", spin_iters=3_000_000, other_iters=200_000, extra_kinds=False)
    leases = str(tmp / "leases")
    proving = make_settings(tmp, builder={"metric": "cachegrind", "lease_dir": leases})
    record = prove(demo, "perf", proving, tmp)
    assert record["cppperf"]["verdict"] == "improved" and record["cppperf"]["metric"] == "cachegrind"
    grading = make_settings(tmp, builder={"lease_dir": leases}, evaluator={"runs_dir": str(tmp / "runs")})
    return record["cppperf"]["instance_id"], grading


@pytest.mark.build
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_patch_that_detects_valgrind_and_works_less_there_is_not_opt(counted: tuple[str, Any]) -> None:
    from cppperf.services.evaluator.instances import load_instance
    from cppperf.services.evaluator.pipeline import EvalRequest, evaluate

    iid, settings = counted
    inst = load_instance(iid, Path(settings.out_dir))
    cheat = patch_of("src/core.cpp", core(3), cheating_core())
    report = evaluate(EvalRequest(run_id="attack", model="cheat", instance_id=iid, patch=cheat), settings)
    # the counts alone are fooled: the agent's spin counts like the expert's
    spin = report["samples"]["spin"]
    assert spin["agent"][0] < 0.5 * spin["old"][0], spin
    assert report["metric"] == "cachegrind"
    assert report["verdict"] == "correct" and not report["opt"], report["reason"]
    confirm = report["native_confirmation"]
    assert not confirm["confirmed"] and confirm["metric"] == "cpu"
    assert "native cpu time" in report["reason"].lower(), report["reason"]
    assert "spin" not in confirm["improved"] and confirm["short_of_expert"] == ["spin"], confirm
    # really faster natively (two passes of three), but less than the expert (one): the count
    # says "as fast as the expert", the time says otherwise
    lesser = patch_of("src/core.cpp", core(3), cheating_core(native_reps=2))
    report = evaluate(EvalRequest(run_id="attack", model="lesser", instance_id=iid, patch=lesser), settings)
    counts = report["samples"]["spin"]
    assert abs(counts["agent"][0] / counts["expert"][0] - 1) < 1e-4, counts  # the expert's count
    assert report["verdict"] == "correct" and not report["opt"], report["reason"]
    confirm = report["native_confirmation"]
    assert not confirm["confirmed"] and confirm["short_of_expert"] == ["spin"], confirm
    assert confirm["speedup"]["spin"] < confirm["expert_speedup"]["spin"], confirm
    # work hidden from the count by deleting a traced child's count file: the same
    forking = patch_of("src/core.cpp", core(3), FORKING_CORE)
    report = evaluate(EvalRequest(run_id="attack", model="forking", instance_id=iid, patch=forking), settings)
    counts = report["samples"]["spin"]
    assert counts["agent"][0] < counts["expert"][0], counts  # fewer than the expert's: no spin counted
    assert report["verdict"] == "correct" and not report["opt"], report["reason"]
    assert not report["native_confirmation"]["confirmed"], report["native_confirmation"]
    # the expert's own patch, as an agent's: the count's opt is confirmed natively
    honest = evaluate(
        EvalRequest(run_id="attack", model="honest", instance_id=iid, patch=inst.expert_patch), settings
    )
    assert honest["verdict"] == "opt", honest["reason"]
    confirm = honest["native_confirmation"]
    assert confirm["confirmed"] and confirm["improved"] == ["spin"] and confirm["short_of_expert"] == []
    assert confirm["leased_core"] is not None or not settings.builder.pin_cpu  # timed on the timing core


def _counts_within(out_dir: Path, seconds: float) -> dict[str, int] | str | None:
    got: list[dict[str, int] | None] = []
    worker = threading.Thread(target=lambda: got.append(cachegrind_counts(str(out_dir))), daemon=True)
    worker.start()
    worker.join(seconds)
    return got[0] if got else "hung"


def test_count_files_are_read_only_as_regular_files_in_the_directory(tmp_path: Path) -> None:
    """A test running under Valgrind can write into its count directory: a FIFO named like a count
    file must not hang the runner, a symlink must not count a file outside it; its own regular
    files are counted (they can only add to its own side's count)."""
    out = tmp_path / "cg"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("events: Ir\nsummary: 5000\n")
    (out / "cachegrind.out.7").symlink_to(elsewhere)
    os.mkfifo(out / "cachegrind.out.8")
    (out / "cachegrind.out.9").write_text("events: Ir\nsummary: 100\n")
    assert _counts_within(out, 10) == {"Ir": 100}


def test_confirm_runs_cannot_be_set_below_what_can_decide() -> None:
    """Five kept rounds a side are the fewest whose rank test can reach α = 0.05 after the
    Benjamini-Hochberg correction: fewer would make every confirmation fail (or, worse, tempt an
    operator to switch it off); there is no switch."""
    from cppperf.shared.errors import ConfigError
    from cppperf.shared.settings import load_settings

    assert load_settings(env={}).evaluator.confirm_runs == 8
    with pytest.raises(ConfigError, match=r"evaluator\.confirm_runs"):
        load_settings(env={"CPPPERF_EVALUATOR_CONFIRM_RUNS": "3"})


# the expert's one pass plus an AVX-512 instruction executed on every call (vpbroadcastq zmm,
# EVEX-encoded): natively a legitimate optimisation's instruction, under Valgrind 3.19 SIGILL
WIDE_FN = """\
#include <immintrin.h>

static volatile long long wide_in = 0;

__attribute__((target("avx512f"))) static unsigned long long wide_zero() {
  alignas(64) long long out[8];
  __m512i v = _mm512_set1_epi64(wide_in);
  _mm512_store_si512(out, _mm512_add_epi64(v, v));
  asm volatile("" : : "r"(out) : "memory");  // the store happens: no scalar shortcut
  return (unsigned long long)out[7];
}

"""


@pytest.mark.build
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not _has_avx512f(), reason="the CPU has no AVX-512F")
def test_an_agents_instruction_valgrind_lacks_is_timed_on_cpu_not_failed(counted: tuple[str, Any]) -> None:
    """An agent's tree Valgrind cannot run (an AVX-512 instruction: Valgrind 3.19 has none) is not
    a failing or flaky patch: the counts cannot grade it, so the three trees are timed on CPU
    instead, the report says why (`cpu_fallback`) and the verdict is decided on time."""
    from cppperf.services.evaluator.pipeline import EvalRequest, evaluate

    iid, settings = counted
    wide = core(1, bug=" + wide_zero()").replace('#include "core.h"\n', '#include "core.h"\n' + WIDE_FN, 1)
    patch = patch_of("src/core.cpp", core(3), wide)
    report = evaluate(EvalRequest(run_id="wide", model="wide", instance_id=iid, patch=patch), settings)
    assert report["tests_pass"] and report["verdict"] in ("opt", "correct"), report["reason"]
    fallback = report["cpu_fallback"]
    assert fallback.startswith("Valgrind cannot run spin on the agent side (unhandled instruction"), fallback
    assert fallback.endswith(": timed on cpu instead")
    assert report["metric"] == "cpu" and set(report["decided_on"].values()) == {"cpu"}
    assert report["rounds"] == settings.evaluator.runs and "native_confirmation" not in report
