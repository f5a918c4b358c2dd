"""Which tests run the change: gcc's own coverage (`--coverage`, `gcov --json-format`) on the new side.

The new side's tree is copied to a third side, `cov`, and built once more in the same jail, limits
and build type with `--coverage` added to the C/C++ flags and every linker's (`coverage_args`).
Each test runs once there (untimed, on the build cores) with its own `GCOV_PREFIX`, so its
`.gcda` counts land in a directory of its own; the `.gcno` notes are copied beside them and
`gcov -j -x` (in the jail too) writes one `.gcov.json.gz` per translation unit: per source line
its `count`, per function its lines and `execution_count`.

The diff's changed sites (`changed_sites`, from `git diff -U0 old new`): the new-side lines a hunk
adds or changes; for a hunk that only deletes, the new-side lines either side of the deletion.
A test *runs the change* when it executes a changed line gcov instruments, or — for a hunk with
no instrumented line (a deletion, a declaration) — the innermost function around it; it is
*assumed* to when it ran a changed file's code but its own translation units do not instrument the
changed sites (`always_inline` code gets no gcov line): a control must be known not to run it. Counts of a
header's line are summed over every translation unit that includes it.

Whatever goes wrong (the tree does not build with `--coverage`, gcov fails, no changed line is
code, no test runs the change) gives a `Coverage` with `used=False` and the reason: the instance is
then decided as without coverage, on every test. Never an exception out of `measure_coverage`.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from cppperf.shared.domain import Coverage, CoveredTest, DecisionRule, StatsRecord
from cppperf.shared.engine.backend import Backend, LocalBackend, Sides
from cppperf.shared.engine.cmake import TestCase, normalise
from cppperf.shared.engine.errorlines import first_error_lines
from cppperf.shared.engine.limits import limits_for
from cppperf.shared.engine.sandbox import RunResult, hand_over
from cppperf.shared.errors import InfraFailure
from cppperf.shared.logging import get_logger
from cppperf.shared.settings import BuilderSettings

log = get_logger(__name__)

COV_SIDE = "cov"
_FLAG_ENV = {  # the variable CMake initialises each one from: kept, --coverage added
    "CMAKE_C_FLAGS": "CFLAGS",
    "CMAKE_CXX_FLAGS": "CXXFLAGS",
    "CMAKE_EXE_LINKER_FLAGS": "LDFLAGS",
    "CMAKE_SHARED_LINKER_FLAGS": "LDFLAGS",
    "CMAKE_MODULE_LINKER_FLAGS": "LDFLAGS",
}


def coverage_args(env: Mapping[str, str]) -> tuple[str, ...]:
    """`-D<flags>=... --coverage` for the compilers and every linker (a -D replaces what CMake
    would take from CFLAGS/CXXFLAGS/LDFLAGS: those are kept in front)."""
    return tuple(f"-D{var}={(env.get(e, '') + ' --coverage').strip()}" for var, e in _FLAG_ENV.items())


GCOV_DIR = ".cppperf-gcov"  # in the coverage tree: <n>/ one test's counts, <n>.json/ its gcov output
SLOWDOWN = 3.0  # a test's timeout under coverage counters
GCOV_TIMEOUT = 600.0
JSON_LIMIT = 256 * 1024 * 1024  # bytes of one unpacked gcov document read at most

Phase = Callable[[str, int, int], None]


# ----------------------------------------------------------------------------- the diff's sites
@dataclass(frozen=True)
class Hunk:
    lines: frozenset[int]  # new-side lines added or changed
    anchors: frozenset[int] = frozenset()  # a deletion only: the new-side lines either side


def changed_sites(diff: str) -> dict[str, list[Hunk]]:
    """Per new-side path, the hunks of a unified diff (`git diff -U0` is enough) as new-side lines.
    Deleted files have no new side and are left out; an unreadable diff gives {}."""
    try:
        patch = PatchSet(diff)
    except UnidiffParseError:
        return {}
    out: dict[str, list[Hunk]] = {}
    for pf in patch:
        if pf.is_removed_file or pf.is_binary_file:
            continue
        hunks: list[Hunk] = []
        for h in pf:
            added = frozenset(ln.target_line_no for ln in h if ln.is_added and ln.target_line_no)
            if added:
                hunks.append(Hunk(added))
            elif any(ln.is_removed for ln in h):
                start = h.target_start  # -U0: the new-side line before the deletion (0: none)
                hunks.append(Hunk(frozenset(), frozenset(n for n in (start, start + 1) if n > 0)))
        if hunks:
            out[pf.path] = hunks
    return out


def git_diff(repo: Path, old: str, new: str) -> str | None:
    """`git diff -U0 old new` of the repository (None when git cannot tell)."""
    argv = ["git", "-C", str(repo), "-c", "core.quotepath=off", "diff", "-U0", "--no-color"]
    try:
        proc = subprocess.run(
            [*argv, "--no-ext-diff", "--no-textconv", old, new, "--"],
            capture_output=True,
            check=False,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.decode(errors="replace") if proc.returncode == 0 else None


# ------------------------------------------------------------------------------- gcov's counts
@dataclass(frozen=True)
class Function:
    name: str
    start: int
    end: int


@dataclass
class Counts:
    """One test's gcov data over the tree's sources (repository-relative paths)."""

    lines: dict[tuple[str, int], int] = field(default_factory=dict)
    functions: dict[tuple[str, Function], int] = field(default_factory=dict)

    def add(self, doc: Mapping[str, Any], src_root: str) -> None:
        """Fold in one `gcov --json-format` document (format_version 1, gcc 9+)."""
        cwd = str(doc.get("current_working_directory") or "")
        for f in doc.get("files") or []:
            path = _relative(str(f.get("file") or ""), cwd, src_root)
            if path is None:
                continue
            for ln in f.get("lines") or []:
                key = (path, int(ln["line_number"]))
                self.lines[key] = self.lines.get(key, 0) + int(ln["count"])
            for fn in f.get("functions") or []:
                name = str(fn.get("demangled_name") or fn.get("name") or "")
                fkey = (path, Function(name, int(fn["start_line"]), int(fn["end_line"])))
                self.functions[fkey] = self.functions.get(fkey, 0) + int(fn["execution_count"])


def _relative(file: str, cwd: str, src_root: str) -> str | None:
    """A gcov source path as a path in the repository, None outside the source tree."""
    full = os.path.normpath(file if os.path.isabs(file) else os.path.join(cwd, file))
    root = os.path.normpath(src_root)
    return os.path.relpath(full, root) if full.startswith(root + os.sep) else None


def _enclosing(path: str, line: int, functions: Sequence[tuple[str, Function]]) -> list[Function]:
    """The innermost function around `line`: every instantiation of it (a template's or an
    inline function's copies share its lines)."""
    around = [f for p, f in functions if p == path and f.start <= line <= f.end]
    if not around:
        return []
    inner = min(around, key=lambda f: f.end - f.start)
    return [f for f in around if (f.start, f.end) == (inner.start, inner.end)]


@dataclass(frozen=True)
class Sites:
    """The changed sites as gcov sees them: instrumented lines, else the function around a hunk."""

    lines: frozenset[tuple[str, int]]
    functions: frozenset[tuple[str, Function]]
    changed: int  # every changed site line
    unmapped: int  # hunks with neither
    unmapped_files: frozenset[str] = frozenset()  # the files those hunks are in


def map_sites(hunks: Mapping[str, Sequence[Hunk]], seen: Sequence[Counts]) -> Sites:
    """The diff's hunks against what gcov instruments in any test's data."""
    instrumented = {k for c in seen for k in c.lines}
    functions = sorted({k for c in seen for k in c.functions}, key=lambda k: (k[0], k[1].start, k[1].end))
    lines: set[tuple[str, int]] = set()
    funcs: set[tuple[str, Function]] = set()
    lost: set[str] = set()
    changed = unmapped = 0
    for path, hs in hunks.items():
        for h in hs:
            changed += len(h.lines | h.anchors)
            code = {(path, n) for n in h.lines if (path, n) in instrumented}
            if code:
                lines |= code
                continue
            around = {f for n in sorted(h.lines | h.anchors) for f in _enclosing(path, n, functions)}
            funcs |= {(path, f) for f in around}
            unmapped += not around
            if not around:
                lost.add(path)
    return Sites(frozenset(lines), frozenset(funcs), changed, unmapped, frozenset(lost))


def attribute(sites: Sites, counts: Counts) -> CoveredTest:
    hit = sum(1 for k in sites.lines if counts.lines.get(k, 0) > 0)
    funcs = sorted({f.name for k in sites.functions if counts.functions.get(k, 0) > 0 for f in [k[1]]})
    assumed = not (hit or funcs) and _unseen_in_a_file_it_runs(sites, counts)
    return CoveredTest(
        runs_change=hit > 0 or bool(funcs) or assumed,
        lines_hit=hit,
        lines_total=len(sites.lines),
        functions_hit=funcs,
        assumed=assumed,
    )


def _unseen_in_a_file_it_runs(sites: Sites, counts: Counts) -> bool:
    """Whether the test ran code of a changed file whose changed sites its own translation units
    do not instrument: gcc leaves no gcov line for code it inlines as `always_inline` (even at
    -O0), so a test whose TUs inline the changed function shows the file's other lines run and
    none of the change — bvh@e5047b91's traversal loop in every renderer test. Such a test is
    not known *not* to run the change: it stays in the deciding family (a control that runs the
    change would flag the instance suspect and lose the speed-up)."""
    ran = {p for (p, _), c in counts.lines.items() if c > 0}
    for path in ran:
        if path in sites.unmapped_files:
            return True
        if any(k[0] == path and k not in counts.lines for k in sites.lines):
            return True
        if any(k[0] == path and k not in counts.functions for k in sites.functions):
            return True
    return False


# ------------------------------------------------------------------------------ the whole run
def coverage_backend(backend: Backend) -> LocalBackend | str:
    """The backend that builds and runs the coverage side, or why there is none."""
    if not isinstance(backend, LocalBackend):
        return f"coverage needs the local backend, not {backend.name}"
    src = backend.side_dir("new") / "src"
    if not src.is_dir():
        return "the new side's tree is not in the workspace"
    dest = backend.side_dir(COV_SIDE)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest / "src", symlinks=True)
    spec = replace(backend.spec, extra_args=(*backend.spec.extra_args, *coverage_args(os.environ)))
    return replace(backend, spec=spec, readonly_tests=False)


class TreeChanged(Exception):
    """A path cppperf made in the coverage tree is no longer a plain directory: a test changed it."""


def _real(host: Path, rel: Path) -> Path:
    """`host / rel` when each component below `host` is a directory, not a link (`lstat`): the
    tests wrote this tree, so the host follows no link in it. Called only when none runs."""
    p = host
    for part in rel.parts:
        p = p / part
        if not stat.S_ISDIR(os.lstat(p).st_mode):
            raise TreeChanged(f"{p.relative_to(host)} is no longer a directory")
    return p


def _fresh(host: Path, rel: Path) -> Path:
    """An empty directory at `host / rel` (whatever was there removed, links not followed)."""
    p = _real(host, rel.parent) / rel.name
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        p.unlink()
    elif p.exists():
        shutil.rmtree(p)
    p.mkdir(mode=0o755)
    return p


def _walk_files(root: Path, suffix: str) -> Iterator[Path]:
    """Regular files under `root` (never through a link)."""
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            p = Path(dirpath) / name
            if name.endswith(suffix) and stat.S_ISREG(os.lstat(p).st_mode):
                yield p


def _place(notes: Path, dest: Path, host: Path) -> bool:
    """Copy the build's `.gcno` beside a test's `.gcda`: the source only inside the tree, the
    destination created afresh (a link a test left there is removed, never written through)."""
    if not notes.is_file() or notes.is_symlink() or host.resolve() not in notes.resolve().parents:
        return False
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        return False
    data = notes.read_bytes()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return True


def _read_doc(path: Path) -> dict[str, Any] | None:
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read(JSON_LIMIT + 1)
        doc = json.loads(data) if len(data) <= JSON_LIMIT else None
    except (OSError, EOFError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True)
class _Tree:
    """The coverage side: host and seen paths, and the folder of counts (ours, not the tests')."""

    cov: LocalBackend
    settings: BuilderSettings

    @property
    def host(self) -> Path:
        return self.cov.side_dir(COV_SIDE)

    @property
    def view(self) -> Path:
        return Path(self.cov.tree_root(COV_SIDE))

    def seen(self, p: Path) -> str:
        return str(self.view / p.relative_to(self.host))

    def check(self) -> None:
        """The counts folder is still ours (a test cannot have swapped it: it is not the sandbox
        uid's, but its parent is)."""
        if os.lstat(_real(self.host, Path(GCOV_DIR))).st_uid != os.geteuid():
            raise TreeChanged(f"{GCOV_DIR} was replaced")

    def run(self, test: TestCase, i: int) -> tuple[Path, RunResult]:
        """`test` once with its counts under `<GCOV_DIR>/<i>`."""
        prefix = _fresh(self.host, Path(GCOV_DIR, str(i)))
        hand_over(prefix)  # the folder only (empty): the test writes there
        env = {**test.env, "GCOV_PREFIX": self.seen(prefix), "GCOV_PREFIX_STRIP": "0"}
        limits = limits_for(test, self.settings)
        slow = limits.timeout * SLOWDOWN
        limits = replace(limits, timeout=slow, cpu_seconds=int(slow * 2) + 1)
        res = normalise(test, self.cov.run_test(COV_SIDE, replace(test, env=env), limits))
        self.check()
        return _real(self.host, Path(GCOV_DIR, str(i))), res

    def gcov(self, prefix: Path, i: int) -> Counts | str:
        """gcov over one test's counts, in the jail; its documents read back; both folders gone."""
        data: list[str] = []
        for gcda in _walk_files(prefix, ".gcda"):
            seen = Path("/") / gcda.relative_to(prefix)  # the object's path as the build saw it
            if self.view in seen.parents:
                notes = (self.host / seen.relative_to(self.view)).with_suffix(".gcno")
                if _place(notes, gcda.with_suffix(".gcno"), self.host):
                    data.append(self.seen(gcda))
        counts = Counts()
        if not data:
            shutil.rmtree(prefix)
            return counts  # it ran no instrumented code of the tree
        out = _fresh(self.host, Path(GCOV_DIR, f"{i}.json"))
        hand_over(prefix, out)
        tool = TestCase(name="gcov", command=["gcov", "-j", "-x", *data], cwd=self.seen(out))
        limits = replace(limits_for(tool, self.settings), timeout=GCOV_TIMEOUT)
        res = self.cov.run_test(COV_SIDE, tool, limits)
        self.check()
        out = _real(self.host, Path(GCOV_DIR, f"{i}.json"))
        try:
            if not res.ok:
                return f"gcov failed (exit {res.returncode}): {' '.join(first_error_lines(res.output)[:3])[:300]}"
            for doc_path in _walk_files(out, ".gcov.json.gz"):
                doc = _read_doc(doc_path)
                try:
                    counts.add(doc or {}, str(self.view / "src"))
                except (KeyError, TypeError, ValueError):
                    doc = None
                if doc is None:
                    return f"gcov wrote an unreadable document: {doc_path.name}"
            return counts
        finally:
            shutil.rmtree(prefix)
            shutil.rmtree(out)


def measure_coverage(
    backend: Backend,
    repo_path: Path | None,
    sides: Sides | None,
    tests: Mapping[str, TestCase],
    settings: BuilderSettings,
    phase: Phase,
) -> Coverage:
    """Which of `tests` (name → the new side's test) run the change between `sides["old"]` and
    `sides["new"]`; `used=False` with the reason when coverage cannot tell."""
    start = time.monotonic()
    try:
        cov = _measure(backend, repo_path, sides, tests, settings, phase)
    except (OSError, InfraFailure, TreeChanged) as exc:  # a copy, a read, a run that could not start
        cov = Coverage(reason=f"coverage failed: {exc}")
    cov.seconds = round(time.monotonic() - start, 3)
    if isinstance(backend, LocalBackend):
        with contextlib.suppress(OSError):
            shutil.rmtree(backend.side_dir(COV_SIDE), ignore_errors=True)
    if not cov.used:
        log.info("coverage not used", reason=cov.reason)
    return cov


def _measure(
    backend: Backend,
    repo_path: Path | None,
    sides: Sides | None,
    tests: Mapping[str, TestCase],
    settings: BuilderSettings,
    phase: Phase,
) -> Coverage:
    old, new = (sides or {}).get("old"), (sides or {}).get("new")
    if repo_path is None or not isinstance(old, str) or not isinstance(new, str):
        return Coverage(reason="no commit pair to diff (an instance image or a tree)")
    diff = git_diff(repo_path, old, new)
    hunks = changed_sites(diff or "")
    if not hunks:
        return Coverage(reason="the diff changes no line on the new side" if diff else "git diff failed")
    made = coverage_backend(backend)
    if isinstance(made, str):
        return Coverage(reason=made)
    cov = made
    phase("coverage build", 0, 1)
    steps = cov.build(COV_SIDE)
    build_log = steps[-1].log_path.name if steps[-1].log_path else ""  # kept in the instance's logs
    if not steps[-1].ok:
        lines = " | ".join(first_error_lines(steps[-1].result.output)[:3])[:400]
        return Coverage(
            reason=f"the new side does not {steps[-1].step} with --coverage: {lines}", build_log=build_log
        )
    by_name = {t.name: t for t in cov.tests(COV_SIDE)}
    tree = _Tree(cov, settings)
    _fresh(tree.host, Path(GCOV_DIR))  # root's when cppperf is root: no test can add to it
    counts: dict[str, Counts] = {}
    failed: set[str] = set()
    names = sorted(tests)
    for i, name in enumerate(names):
        phase("coverage", i, len(names))
        t = by_name.get(name)
        if t is None:
            failed.add(name)
            continue
        prefix, res = tree.run(t, i)
        got = tree.gcov(prefix, i)
        if isinstance(got, str):
            return Coverage(reason=got, build_log=build_log)
        if not res.ok:
            failed.add(name)
        counts[name] = got
    phase("coverage", len(names), len(names))
    return family_from_counts(hunks, counts, failed, names, build_log)


def family_from_counts(
    hunks: Mapping[str, Sequence[Hunk]],
    counts: Mapping[str, Counts],
    failed: set[str],
    names: Sequence[str],
    build_log: str = "",
) -> Coverage:
    """The coverage record from each test's counts: who runs the change, the deciding family and
    the controls; `used=False` when no changed line is code or no test runs it. A test whose
    coverage run failed is kept in the family (nothing says it does not run the change)."""
    sites = map_sites(hunks, list(counts.values()))
    per_test = {n: attribute(sites, counts.get(n, Counts())) for n in names}
    for n in failed:
        per_test[n] = msgspec.structs.replace(per_test[n], runs_change=True, ran=False)
    base = Coverage(
        changed_lines=sites.changed,
        executable_lines=len(sites.lines),
        unmapped_hunks=sites.unmapped,
        tests=per_test,
        build_log=build_log,
    )
    if not sites.lines and not sites.functions:
        base.reason = "no changed line is code a test's translation units instrument"
        return base
    deciding = [n for n in names if per_test[n].runs_change]
    if not deciding:
        base.reason = "no test runs the change"
        return base
    base.used, base.deciding = True, deciding
    base.controls = [n for n in names if not per_test[n].runs_change]
    return base


# ------------------------------------------------------------------------------ the decision
def _ctest_name(name: str, known: Mapping[str, object]) -> str:
    """A case `<test>::<case>` (builder.split_cases) belongs to its CTest test."""
    if name in known:
        return name
    parents = [t for t in known if name.startswith(t + "::")]
    return max(parents, key=len, default=name)


def split_family(cov: Coverage | None, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The tests that decide and the controls among `names`: every test decides without a used
    coverage; a test coverage does not know (neither deciding nor a control) decides."""
    if cov is None or not cov.used:
        return list(names), []
    known = dict.fromkeys([*cov.deciding, *cov.controls])
    controls = set(cov.controls) - set(cov.deciding)
    ctl = [n for n in names if _ctest_name(n, known) in controls]
    return [n for n in names if n not in set(ctl)], ctl


def flag_controls(cov: Coverage, controls: Sequence[StatsRecord], *, rule: DecisionRule) -> None:
    """Record the controls that moved by the deciding rule; any makes the measurement suspect."""
    moved = {t.name: "improved" if rule.improved(t) else "regressed" for t in controls if any(rule.flags(t))}
    cov.moved_controls, cov.suspect = moved, bool(moved)
