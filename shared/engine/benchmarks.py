"""The project's own benchmarks as workloads: discovered through CMake's file API, run by their
own JSON output, fed to the same interleaved protocol and statistics as the tests.

Discovery. Before configure the build tree gets a stateless file-API query
(`.cmake/api/v1/query/codemodel-v2`); configure (with the tree's benchmark switches on, see
`cmake.benchmark_options`) answers it under `.cmake/api/v1/reply/`. Every `EXECUTABLE` target
whose link line or dependencies name Google Benchmark (`benchmark::benchmark`,
`benchmark_main`, `libbenchmark.{a,so}`, `-lbenchmark`) is a benchmark executable; it is asked
for its benchmarks (`--benchmark_list_tests=true`, untimed, in the tests' jail) and each
benchmark becomes one workload `bench:<target>/<benchmark>`. Targets linking nanobench are
recorded as skipped: nanobench has no command-line switch for machine-readable output (the
program picks its renderer), so nothing generic can read it. Catch2's `BENCHMARK` cases run
inside CTest tests, which are timed already.

Running. A workload is an ordinary `TestCase` (so it runs in the same jail, limits and core
lease as a test): the executable with `--benchmark_filter=^<name>$ --benchmark_format=json
--benchmark_repetitions=N --benchmark_min_time=T`, cut at `builder.benchmark_timeout`. Its sample
is read from the JSON (`benchmarks[]`, `run_type` `iteration` only, aggregates skipped): the
median over the repetitions of the per-iteration `real_time` (the wall sample) and `cpu_time`
(the CPU sample), in seconds. One process run is one sample: repetitions inside a process share
its code layout and allocator state, so they are not independent samples; the rounds (processes)
are, and the protocol interleaves them with the other side's exactly like tests. A sample is
never repeated by the sample floor (it is Google Benchmark's own timing, already long enough:
`pinned` repeats of 1). A probe run per side first (untimed) drops a benchmark that crashes,
reports an error or prints no JSON, with a `BenchmarkSkip` reason (and the side) instead of a
rejection.

Identity. A target's own sources (the file API's, minus every file another target compiles)
are its definition: when they differ between two sides (`find(unchanged=…)`, the builder's old
and new; `timed_edits`, the evaluator's original and agent) each side would time other code.
Byte-identical benchmark executables are part of `unchanged-binaries` (`executables_identical`).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cppperf.shared.domain import BenchmarkSkip, BenchmarkWorkload, SkippedBenchmark
from cppperf.shared.engine.backend import Backend
from cppperf.shared.engine.cmake import TestCase, normalise
from cppperf.shared.engine.fileapi import codemodel_targets
from cppperf.shared.engine.gbench import (
    LIST_ARGS,
    PROBE_SECONDS,
    UNITS_ARGS,
    BenchOutputError,
    BenchSettings,
    listed,
    min_time_arg,
    parse_run,
    run_args,
)
from cppperf.shared.engine.leases import core_plan
from cppperf.shared.engine.sandbox import Limits, RunResult
from cppperf.shared.settings import BuilderSettings

PREFIX = "bench:"
FRAMEWORK = "google-benchmark"
_GBENCH_LINK = re.compile(r"(?:^|[/\s])(?:-l|lib)?benchmark(?:_main)?(?:\.a|\.so[.\d]*)?$")
_NANOBENCH = re.compile(r"nanobench", re.IGNORECASE)

Run = Callable[[TestCase], RunResult]


def is_benchmark(name: str) -> bool:
    return name.startswith(PREFIX)


@dataclass(frozen=True)
class BenchTarget:
    target: str
    executable: str  # relative to the build tree
    framework: str  # google-benchmark | nanobench
    # its own sources (relative to the source tree; none compiled into a non-benchmark target):
    # the benchmark's definition, which a commit or an agent must not change to be timed by it
    sources: tuple[str, ...] = ()


def _framework(target: dict[str, Any]) -> str | None:
    link = target.get("link") if isinstance(target.get("link"), dict) else {}
    fragments = [
        str(f.get("fragment", "")) for f in (link or {}).get("commandFragments", []) if isinstance(f, dict)
    ]
    deps = [
        str(d.get("id", "")).split("::@")[0] for d in target.get("dependencies", []) if isinstance(d, dict)
    ]
    words = [w for frag in fragments for w in frag.split()] + deps
    if any(_GBENCH_LINK.search(w) or w in ("benchmark", "benchmark_main") for w in words):
        return FRAMEWORK
    if any(_NANOBENCH.search(w) for w in words):
        return "nanobench"
    return None


def _sources(target: dict[str, Any]) -> set[str]:
    """A target's source files inside the source tree (the file API gives them relative to it)."""
    paths = (str(s.get("path", "")) for s in target.get("sources", []) if isinstance(s, dict))
    return {p for p in paths if p and not p.startswith(("/", "..")) and not p.startswith(".cmake")}


def benchmark_targets(build_dir: Path) -> list[BenchTarget]:
    """The executables of the build tree (on this host) that link a benchmark library, by name."""
    found: list[tuple[dict[str, Any], str, str]] = []
    others: set[str] = set()  # sources of every other target (the code benchmarks measure)
    for t in codemodel_targets(build_dir):
        artifacts = [a.get("path") for a in t.get("artifacts", []) if isinstance(a, dict)]
        framework = _framework(t) if t.get("type") == "EXECUTABLE" and artifacts and artifacts[0] else None
        if framework is None:
            others |= _sources(t)
        else:
            found.append((t, str(artifacts[0]), framework))
    out = [
        BenchTarget(str(t.get("name", "")), exe, framework, tuple(sorted(_sources(t) - others)))
        for t, exe, framework in found
    ]
    return sorted(out, key=lambda b: b.target)


def edited_sources(backend: HostBuilds, target: BenchTarget, a: str, b: str) -> list[str]:
    """The benchmark's own sources that differ between sides `a` and `b` (missing counts)."""
    out = []
    for rel in target.sources:
        try:
            same = (backend.host_source_dir(a) / rel).read_bytes() == (
                backend.host_source_dir(b) / rel
            ).read_bytes()
        except OSError:
            same = False
        if not same:
            out.append(rel)
    return out


def workload_name(target: str, benchmark: str) -> str:
    return f"{PREFIX}{target}/{benchmark}"


def benchmark_of(name: str) -> str:
    """The benchmark's own name in a workload name (`bench:<target>/<benchmark>`)."""
    return name[len(PREFIX) :].partition("/")[2]


def workload(
    exe: str, cwd: str, target: str, benchmark: str, s: BenchSettings, *, units: bool = False
) -> TestCase:
    return TestCase(
        name=workload_name(target, benchmark),
        command=[exe, *run_args(benchmark, s, units=units)],
        cwd=cwd,
        timeout=s.timeout,
    )


def as_sample(name: str, res: RunResult) -> RunResult:
    """A workload's run as one protocol sample: wall and CPU seconds from its JSON. A run that
    failed stays failed; one whose output cannot be read fails too (returncode 1, the reason in
    its output), so the protocol names the workload and the side."""
    if not res.ok:
        return res
    try:
        real, cpu, _n = parse_run(res.output, benchmark_of(name))
    except BenchOutputError as exc:
        return replace(res, returncode=1, output=f"{exc.reason}: {exc}\n{res.output[-1500:]}")
    return replace(res, wall_s=real, cpu_s=cpu, instructions=None, ir=None, est_cycles=None)


def timed_run(backend: Backend, side: str, t: TestCase, limits: Limits) -> RunResult:
    """One timed run of a workload: a test as CTest judges it, a benchmark as its JSON's sample."""
    res = backend.run_test(side, t, limits)
    return as_sample(t.name, res) if is_benchmark(t.name) else normalise(t, res)


def probe_problem(res: RunResult, name: str, side: str = "") -> SkippedBenchmark | None:
    """Why an untimed probe run of a workload on `side` disqualifies it (None: it can be timed)."""
    if res.timed_out:
        return SkippedBenchmark(name=name, reason=BenchmarkSkip.TIMEOUT, detail=res.output[-300:], side=side)
    if not res.ok:
        detail = f"exit {res.returncode}: {res.output[-300:]}"
        return SkippedBenchmark(name=name, reason=BenchmarkSkip.CRASHED, detail=detail, side=side)
    try:
        parse_run(res.output, benchmark_of(name))
    except BenchOutputError as exc:
        return SkippedBenchmark(name=name, reason=exc.reason, detail=str(exc), side=side)
    return None


@dataclass
class Discovered:
    """Per side, the workloads to time (by name); the benchmarks found and not timed."""

    by_side: dict[str, dict[str, TestCase]]
    skipped: list[SkippedBenchmark]
    targets: dict[str, BenchTarget]  # workload name -> its target

    @property
    def common(self) -> list[str]:
        sides = list(self.by_side.values())
        return sorted(set.intersection(*(set(s) for s in sides))) if sides else []

    def records(self, s: BenchSettings) -> list[BenchmarkWorkload]:
        return [
            BenchmarkWorkload(
                name=n,
                target=self.targets[n].target,
                executable=self.targets[n].executable,
                benchmark=benchmark_of(n),
                framework=self.targets[n].framework,
                repetitions=s.repetitions,
                min_time_s=s.min_time,
            )
            for n in self.common
        ]


def discover(
    targets: list[BenchTarget],
    build_roots: Mapping[str, str],
    run_on: Mapping[str, Run],
    s: BenchSettings,
    *,
    limit: int,
    only: Iterable[str] | None = None,
    data_dirs: Mapping[str, str] | None = None,
) -> Discovered:
    """The workloads of `targets` (read from one side's file API) on every side: `build_roots`
    is each side's build tree as its runs see it, `run_on` runs a command there untimed. Each
    side lists its benchmarks; the ones on every side are probed once per side; at most `limit`
    are kept, spread over the benchmark functions (`spread`; `only`: just these names, e.g. the
    evaluator's instance's benchmarks). A benchmark that crashes in the build tree is probed once
    more in `data_dirs[side]` (the project's tests' working directory: snappy's benchmarks read
    `testdata/` relative to the source tree, where its test runs) and timed there if it runs."""
    wanted = set(only) if only is not None else None
    if wanted is not None:  # a target holding none of the wanted benchmarks is not even listed
        targets = [t for t in targets if any(n.startswith(workload_name(t.target, "")) for n in wanted)]
    found = Discovered(by_side={side: {} for side in build_roots}, skipped=[], targets={})
    names_by_side: dict[str, set[str]] = {side: set() for side in build_roots}
    for t in targets:
        if t.framework != FRAMEWORK:
            found.skipped.append(
                SkippedBenchmark(
                    name=workload_name(t.target, "*"),
                    reason=BenchmarkSkip.UNSUPPORTED_FRAMEWORK,
                    detail=f"{t.framework}: no command-line switch for machine-readable output",
                )
            )
            continue
        for side, root in build_roots.items():
            exe = f"{root}/{t.executable}"
            res = run_on[side](TestCase(name=t.target, command=[exe, *UNITS_ARGS], cwd=root))
            units = res.ok and bool(listed(res.output))
            if not units:  # Google Benchmark before 1.8 (no unit in --benchmark_min_time), or no listing
                res = run_on[side](TestCase(name=t.target, command=[exe, *LIST_ARGS], cwd=root))
            names = listed(res.output) if res.ok else []
            if not names:
                why = f"on the {side} side: exit {res.returncode}: {res.output[-300:]}"
                found.skipped.append(
                    SkippedBenchmark(
                        name=workload_name(t.target, "*"),
                        reason=BenchmarkSkip.LIST_FAILED,
                        detail=why,
                        side=side,
                    )
                )
                continue
            for b in names:
                n = workload_name(t.target, b)
                if wanted is None or n in wanted:
                    found.by_side[side][n] = workload(exe, root, t.target, b, s, units=units)
                    names_by_side[side].add(n)
                    found.targets[n] = t
    everywhere = set.intersection(*names_by_side.values()) if names_by_side else set()
    for n in sorted(set.union(set(), *names_by_side.values()) - everywhere):
        missing = next(side for side, names in names_by_side.items() if n not in names)
        found.skipped.append(SkippedBenchmark(name=n, reason=BenchmarkSkip.ONE_SIDE_ONLY, side=missing))
    kept = spread(sorted(everywhere), limit)
    for n in sorted(everywhere - set(kept)):
        found.skipped.append(
            SkippedBenchmark(name=n, reason=BenchmarkSkip.OVER_LIMIT, detail=f"limit {limit}")
        )
    timed = [n for n in kept if _timeable(found, n, run_on, data_dirs)]
    found.by_side = {side: {n: tests[n] for n in timed} for side, tests in found.by_side.items()}
    return found


def _timeable(
    found: Discovered, name: str, run_on: Mapping[str, Run], data_dirs: Mapping[str, str] | None
) -> bool:
    """Whether the workload runs on every side (probed; a crash in the build tree probed once
    more in `data_dirs`, where it is then timed); why not goes to `found.skipped`."""
    cases = {side: tests[name] for side, tests in found.by_side.items()}
    problem = _probe_sides(cases, run_on, name)
    if problem is not None and problem.reason == BenchmarkSkip.CRASHED and data_dirs:
        moved = {side: replace(case, cwd=data_dirs[side]) for side, case in cases.items()}
        if moved != cases and _probe_sides(moved, run_on, name) is None:
            for side, case in moved.items():
                found.by_side[side][name] = case
            return True
    if problem is not None:
        found.skipped.append(problem)
    return problem is None


def _probe_sides(
    cases: Mapping[str, TestCase], run_on: Mapping[str, Run], name: str
) -> SkippedBenchmark | None:
    """The first side's reason the workload cannot be timed (None: it runs on every side)."""
    for side, t in cases.items():
        problem = probe_problem(run_on[side](_probe(t)), name, side)
        if problem is not None:
            return problem
    return None


def spread(names: list[str], limit: int) -> list[str]:
    """At most `limit` of `names` (sorted), taken in turn from each benchmark function (a
    workload's name up to the benchmark's first `/`: `bench:t/BM_UFlat/3` is of `BM_UFlat`):
    a limit keeps some arguments of every function rather than the first functions whole
    (snappy lists 12 inputs per function; by name alone its 50 were all decompression)."""
    families: dict[str, list[str]] = {}
    for n in names:
        families.setdefault(
            n[len(PREFIX) :].split("/", 2)[0] + "/" + benchmark_of(n).split("/")[0], []
        ).append(n)
    picked: list[str] = []
    queues = list(families.values())
    while len(picked) < limit and any(queues):
        for q in queues:
            if q and len(picked) < limit:
                picked.append(q.pop(0))
    return sorted(picked)


def _probe(t: TestCase) -> TestCase:
    """The workload once, as short as Google Benchmark allows (one repetition, minimal time; the
    minimum time written as the workload's own is, with or without its unit)."""
    units = any(a.startswith("--benchmark_min_time=") and a.endswith("s") for a in t.command)
    cmd = [a for a in t.command if not a.startswith(("--benchmark_repetitions=", "--benchmark_min_time="))]
    return replace(t, command=[*cmd, "--benchmark_repetitions=1", min_time_arg(PROBE_SECONDS, units=units)])


def files_identical(old: Path, new: Path, old_prefix: bytes, new_prefix: bytes) -> bool:
    """Whether two benchmark executables are the same bytes once `old_prefix` reads `new_prefix`."""
    try:
        a = old.read_bytes().replace(old_prefix, new_prefix) if old_prefix else old.read_bytes()
        b = new.read_bytes()
    except OSError:
        return False
    return hashlib.sha256(a).digest() == hashlib.sha256(b).digest()


@runtime_checkable
class HostBuilds(Protocol):
    """A backend whose build trees are on this host (the local backend): its file API is readable."""

    def host_build_dir(self, side: str) -> Path: ...
    def host_source_dir(self, side: str) -> Path: ...


def bench_settings(settings: BuilderSettings) -> BenchSettings:
    return BenchSettings(
        settings.benchmark_repetitions, settings.benchmark_min_time, settings.benchmark_timeout
    )


def find(
    backend: Backend,
    sides: Sequence[str],
    settings: BuilderSettings,
    *,
    only: Iterable[str] | None = None,
    unchanged: tuple[str, str] | None = None,
) -> Discovered:
    """The benchmark workloads of `backend`'s built `sides` (targets from the first side's file
    API), listed and probed untimed on the build cores; none when `builder.benchmarks` is off.
    `unchanged`: two sides whose benchmark definitions must be the same — a target whose own
    sources differ between them times different code on each side and is skipped (`changed`)."""
    none = Discovered(by_side={side: {} for side in sides}, skipped=[], targets={})
    if not settings.benchmarks or (only is not None and not list(only)):
        return none
    if not isinstance(backend, HostBuilds):
        none.skipped.append(
            SkippedBenchmark(
                name=f"{PREFIX}*", reason=BenchmarkSkip.BACKEND, detail=f"{backend.name} backend"
            )
        )
        return none
    targets = benchmark_targets(backend.host_build_dir(sides[0]))
    if targets and settings.metric == "cachegrind":
        none.skipped.append(SkippedBenchmark(name=f"{PREFIX}*", reason=BenchmarkSkip.EXACT_METRIC))
        return none
    skipped = []
    if unchanged is not None:
        kept = []
        for t in targets:
            edited = edited_sources(backend, t, *unchanged)
            if edited:
                detail = f"its own sources differ between {' and '.join(unchanged)}: {', '.join(edited)}"
                skipped.append(
                    SkippedBenchmark(
                        name=workload_name(t.target, "*"), reason=BenchmarkSkip.CHANGED, detail=detail
                    )
                )
            else:
                kept.append(t)
        targets = kept
    cores = core_plan(settings).build if settings.pin_cpu else ()

    def run_on(side: str) -> Run:
        def run(t: TestCase) -> RunResult:
            return backend.run_test(side, t, Limits(timeout=settings.benchmark_timeout, cpus=cores))

        return run

    roots = {side: f"{backend.tree_root(side)}/build" for side in sides}
    found = discover(
        targets,
        roots,
        {side: run_on(side) for side in sides},
        bench_settings(settings),
        limit=settings.max_benchmarks,
        only=only,
        data_dirs=tests_dirs(backend, sides) if targets else None,
    )
    found.skipped[:0] = skipped
    return found


def tests_dirs(backend: Backend, sides: Sequence[str]) -> dict[str, str] | None:
    """Per side, the working directory most of the project's CTest tests run in (None when a
    side has no test with one)."""
    dirs: dict[str, str] = {}
    for side in sides:
        cwds = Counter(t.cwd for t in backend.tests(side) if t.cwd)
        if not cwds:
            return None
        dirs[side] = cwds.most_common(1)[0][0]
    return dirs


BROKEN_ON_SIDE = frozenset(
    {
        BenchmarkSkip.LIST_FAILED,
        BenchmarkSkip.CRASHED,
        BenchmarkSkip.TIMEOUT,
        BenchmarkSkip.MALFORMED_OUTPUT,
        BenchmarkSkip.ERROR_REPORTED,
        BenchmarkSkip.ONE_SIDE_ONLY,
    }
)


def broken_on(found: Discovered, side: str) -> list[SkippedBenchmark]:
    """The benchmarks that cannot run on `side` (its listing or probe failed, or it is missing)
    while some other side runs them: one broken on every side (spdlog's `formatter-bench`, whose
    own `main` lists nothing) is the project's, not the side's."""
    broken = {(s.name, s.side) for s in found.skipped if s.reason in BROKEN_ON_SIDE}
    others = [o for o in found.by_side if o != side]
    return [
        s
        for s in found.skipped
        if s.side == side
        and s.reason in BROKEN_ON_SIDE
        and not (others and all((s.name, o) in broken for o in others))
    ]


def timed_edits(backend: Backend, found: Discovered, a: str, b: str) -> list[str]:
    """The own sources of the timed benchmarks that differ between sides `a` and `b`."""
    if not isinstance(backend, HostBuilds):
        return []
    targets = {found.targets[n].target: found.targets[n] for n in found.common}
    return sorted({rel for t in targets.values() for rel in edited_sources(backend, t, a, b)})


def executables_identical(
    backend: Backend, settings: BuilderSettings, sides: tuple[str, str] = ("old", "new")
) -> bool:
    """Whether every Google Benchmark executable of the build tree is byte-identical on both
    sides (paths mapped) — read from the file API before anything is listed or probed, so an
    unchanged build costs no benchmark run. True when no benchmark would be timed (benchmarks
    off, a backend whose trees are not on this host)."""
    if not settings.benchmarks or not isinstance(backend, HostBuilds):
        return True
    old, new = (backend.host_build_dir(side) for side in sides)
    prefixes = str(old.parent).encode(), str(new.parent).encode()
    exes = {t.executable for t in benchmark_targets(old) if t.framework == FRAMEWORK}
    return all(files_identical(old / exe, new / exe, *prefixes) for exe in exes)
