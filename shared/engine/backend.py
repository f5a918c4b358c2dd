"""Where builds and test runs happen. `LocalBackend` runs on this host in a per-instance workspace:

    <work>/<instance>/old/{src,build}    the parent commit
    <work>/<instance>/new/{src,build}    the commit
    <work>/<instance>/ccache             one cache for both sides
                                         (CCACHE_BASEDIR = workspace only with builder.ccache_basedir:
                                         it makes __FILE__ relative, which breaks tests that find
                                         their data through it, e.g. bkcrack's unit tests)
    <work>/<instance>/logs/              configure/build logs per side

Both trees have the same shape and path length, so ccache hits across sides and binaries can be
compared byte for byte after mapping `old` → `new` in embedded paths. The docker backend
(containers issue) implements the same `Backend` protocol.

`jailed=True`: every configure, build, test discovery and test run is under bubblewrap
(sandbox.Jail) as the sandbox uid, with only its own tree bound at `<workspace>/current` (the same
path for every side without mount namespaces), the workspace's ccache (read-only for the sides in
`readonly_ccache`), a fresh `/tmp`, and an allow-listed environment; with `readonly_tests` the tree
is read-only while its tests run.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cppperf.shared.engine.cmake import (
    BuildSpec,
    StepResult,
    TestCase,
    benchmark_options,
    build,
    configure,
    ctest_json,
    discover_tests,
    tool_env,
)
from cppperf.shared.engine.fetchcontent import archive
from cppperf.shared.engine.fileapi import write_query
from cppperf.shared.engine.runner_script import instructions_unsupported, valgrind_unsupported
from cppperf.shared.engine.sandbox import (
    JAIL_TMP,
    Jail,
    Limits,
    RunResult,
    hand_over,
    host_env,
    jail_env,
    run,
)
from cppperf.shared.engine.submodules import Sources
from cppperf.shared.errors import InfraFailure

SideName = str  # any name: "old"/"new" for the builder, "old"/"agent"/"expert" for the evaluator
SIDES: tuple[SideName, SideName] = ("old", "new")
Source = str | Path  # a commit of the repository (sha), or a tree already on this host (directory)
Sides = Mapping[SideName, Source]


class Backend(Protocol):
    """Where builds and test runs happen. Sides are data: `prepare(repo, {"old": sha, "new": sha})`
    for the builder, `{"old": sha, "agent": Path(patched tree), "expert": sha}` for the evaluator."""

    name: str
    spec: BuildSpec  # replaced (and the trees prepared again) to build in another build type
    submodules: Sources  # where submodule histories come from

    @property
    def installed(self) -> list[str]:
        """Debian packages installed beyond the base image (docker backend)."""
        ...

    @property
    def logs(self) -> Path:
        """Where configure/build logs are written (an earlier attempt's go into a subfolder)."""
        ...

    def prepare(self, repo_path: Path, sides: Sides) -> None: ...
    def build(self, side: SideName) -> list[StepResult]: ...
    def tests(self, side: SideName) -> list[TestCase]: ...
    def binaries_identical(self, tests: list[str]) -> bool: ...
    def run_test(self, side: SideName, test: TestCase, limits: Limits) -> RunResult: ...
    def tree_root(self, side: SideName) -> str: ...
    def tests_json(self, side: SideName) -> str | None: ...
    def cleanup(self) -> None: ...
    def commit(self, image: str, record: dict[str, Any]) -> str: ...
    def push(self, image: str, registry: str) -> str: ...
    def read_record(self) -> dict[str, Any]: ...
    def instructions_unsupported(self) -> str | None: ...
    def valgrind_unsupported(self) -> str | None: ...
    def toolchain(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class SideFailure:
    side: SideName
    step: StepResult  # the step that failed (the last one run on that side)


def build_sides(
    backend: Backend,
    sides: Sequence[SideName],
    *,
    on_built: Callable[[SideName, list[StepResult]], None] | None = None,
    phase: Callable[[str, int, int], None] | None = None,
) -> SideFailure | None:
    """Configure and build every side in order; stop at the first failure and return it."""
    for i, side in enumerate(sides):
        if phase is not None:
            phase(f"build {side}", i, len(sides))
        steps = backend.build(side)
        if on_built is not None:
            on_built(side, steps)
        if not steps[-1].ok:
            return SideFailure(side, steps[-1])
    return None


def export_source(repo_path: Path, source: Source, dest: Path, submodules: Sources | None = None) -> None:
    """Write a side's tree into `dest`: a commit through `export_tree`, a host tree by copying."""
    if isinstance(source, Path):
        shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
    else:
        export_tree(repo_path, source, dest, submodules)


def tar_tree(root: Path) -> bytes:
    """A directory as tar bytes (names relative to `root`, symlinks kept as links)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buf.getvalue()


def _first_line(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.splitlines()[0] if proc.returncode == 0 and proc.stdout else ""


def export_tree(repo_path: Path, sha: str, dest: Path, submodules: Sources | None = None) -> None:
    """Write the tree of `sha` into `dest` with its submodules at their recorded revisions (git
    archive: works on bare and blobless mirrors; see `submodules` for where they come from, and
    `fetchcontent` for the FetchContent dependencies it carries)."""
    dest.mkdir(parents=True, exist_ok=True)
    data = archive(repo_path, sha, submodules)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")  # requires-python >= 3.11.4: extraction filters


@dataclass
class LocalBackend:
    workspace: Path
    spec: BuildSpec
    env_overrides: dict[str, str]
    sandbox: bool = True
    output_limit: int = 64 * 1024
    ccache_basedir: bool = False
    same_path: bool = False  # every side built and run at <workspace>/current (mount namespace)
    submodules: Sources = field(default_factory=Sources)
    name: str = "local"
    installed: list[str] = field(default_factory=list)  # nothing is installed on the host
    jailed: bool = False  # every step under bubblewrap (module docstring)
    readonly_tests: bool = False  # jailed: the tree is read-only while its tests run
    readonly_ccache: frozenset[SideName] = frozenset()  # jailed: these sides only read the ccache

    def side_dir(self, side: SideName) -> Path:
        return self.workspace / side

    @property
    def current(self) -> Path:
        return self.workspace / "current"

    @property
    def ccache(self) -> Path:
        return self.workspace / "ccache"

    def _mount(self, side: SideName) -> tuple[Path, Path] | None:
        return (self.side_dir(side), self.current) if self.same_path or self.jailed else None

    def _view(self, side: SideName) -> Path:
        """Where the side's tree is seen by its builds and tests."""
        return self.current if self.same_path or self.jailed else self.side_dir(side)

    def _jail(self, side: SideName, *, building: bool, cwd: str | None = None) -> Jail | None:
        """The jail of one step: `cwd`, a test's working directory, becomes a writable view of
        itself when the tree is read-only (`sandbox.Jail.views`)."""
        if not self.jailed:
            return None
        tree = ((self.side_dir(side), self.current),)
        if not building and self.readonly_tests:
            # `include(CTest)` makes `ctest`, even `--show-only`, write Testing/Temporary/LastTest.log
            # in the build tree: a fresh tmpfs there per run, or a read-only tree lists no tests
            testing = Path("build") / "Testing"
            scratch = (self.current / testing,) if (self.side_dir(side) / testing).is_dir() else ()
            # tests that write next to themselves (spdlog's `test_logs/`): their own files, per run
            views = (Path(cwd),) if cwd and self.current in Path(cwd).parents else ()
            return Jail(ro=tree, scratch=scratch, views=views)
        if not building:
            return Jail(rw=tree)
        cache = ((self.ccache, self.ccache),)
        if side in self.readonly_ccache:
            return Jail(rw=tree, ro=cache)
        return Jail(rw=tree + cache)

    @property
    def logs(self) -> Path:
        return self.workspace / "logs"

    def prepare(self, repo_path: Path, sides: Sides) -> None:
        """Export every side's tree into the workspace. A host tree given as a side may live in the
        workspace already (the evaluator patches one there): it is kept, not wiped."""
        keep = {s for s in sides.values() if isinstance(s, Path) and self.workspace in s.parents}
        if self.workspace.exists():
            for entry in self.workspace.iterdir():
                if any(entry == k or entry in k.parents for k in keep):
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.current.mkdir(exist_ok=True)
        for side, source in sides.items():
            dest = self.side_dir(side) / "src"
            if isinstance(source, Path) and source.resolve() == dest.resolve():
                continue
            export_source(repo_path, source, dest, self.submodules)

    def _env(self, side: SideName = "") -> dict[str, str]:
        basedir = self.workspace if self.ccache_basedir else None
        if not self.jailed:
            return tool_env(self.ccache, basedir)
        cc = {k: v for k, v in tool_env(self.ccache, basedir).items() if k.startswith("CCACHE_")}
        if side in self.readonly_ccache:  # hits from the trusted trees' objects, never a write
            cc.update(CCACHE_READONLY="1", CCACHE_TEMPDIR=JAIL_TMP)
        return jail_env(cc)

    def build(self, side: SideName) -> list[StepResult]:
        env = self._env(side)
        jail = self._jail(side, building=True)
        if self.spec.benchmarks:  # CMake's file API answers it at configure (engine/benchmarks.py)
            write_query(self.side_dir(side) / "build")
        if jail is not None:
            (self.side_dir(side) / "build").mkdir(parents=True, exist_ok=True)
            self.ccache.mkdir(parents=True, exist_ok=True)
            hand_over(self.side_dir(side), self.ccache)
        steps = self._configure_build(side, env, jail)
        switched = [o for o in benchmark_options(self.side_dir(side) / "src") if o.endswith("=ON")]
        if not steps[-1].ok and self.spec.benchmarks and switched:
            # the benchmarks may need what this host lacks (or not compile): once more without them
            steps += self._configure_build(side, env, jail, benchmarks=False)
        return steps

    def _configure_build(
        self, side: SideName, env: dict[str, str], jail: Jail | None, *, benchmarks: bool = True
    ) -> list[StepResult]:
        d, mount = self._view(side), self._mount(side)
        tag = "" if benchmarks else "-no-benchmarks"
        log = self.logs / f"{side}-configure{tag}.log"
        steps = [
            configure(
                d / "src",
                d / "build",
                self.spec,
                env=env,
                log=log,
                mount=mount,
                jail=jail,
                benchmarks=benchmarks,
            )
        ]
        if steps[-1].ok:
            steps.append(
                build(
                    d / "build",
                    self.spec,
                    env=env,
                    log=self.logs / f"{side}-build{tag}.log",
                    mount=mount,
                    jail=jail,
                )
            )
        return steps

    def tests(self, side: SideName) -> list[TestCase]:
        env = jail_env() if self.jailed else host_env()
        return discover_tests(
            self._view(side) / "build",
            env=env,
            mount=self._mount(side),
            jail=self._jail(side, building=False),
        )

    def host_build_dir(self, side: SideName) -> Path:
        """The side's build tree on this host (its CMake file API reply is read here)."""
        return self.side_dir(side) / "build"

    def host_source_dir(self, side: SideName) -> Path:
        return self.side_dir(side) / "src"

    def tree_root(self, side: SideName) -> str:
        """The side's tree as its builds and tests see it."""
        return str(self._view(side))

    def tests_json(self, side: SideName) -> str | None:
        """The raw `ctest --show-only=json-v1` of a side (the evaluator compares meanings)."""
        env = jail_env() if self.jailed else host_env()
        return ctest_json(
            self._view(side) / "build",
            env=env,
            mount=self._mount(side),
            jail=self._jail(side, building=False),
        )

    def _artifacts(self, side: SideName, tests: list[str]) -> dict[str, str] | None:
        """Hash of each test executable and shared library in the build tree, paths normalised."""
        root = self.side_dir(side)
        build_dir = root / "build"
        seen_build = self._view(side) / "build"  # how test commands name the build tree
        by_name = {t.name: t for t in self.tests(side)}
        files: set[Path] = set()
        for name in tests:
            t = by_name.get(name)
            if t is None or not t.command:
                return None
            exe = Path(t.command[0])
            if not exe.is_absolute() or seen_build not in exe.parents:
                return None  # a script or system tool: cannot prove it unchanged
            files.add(build_dir / exe.relative_to(seen_build))
        files |= {p for p in build_dir.rglob("*.so*") if p.is_file()}
        old_prefix = str(self.side_dir("old")).encode()
        new_prefix = str(self.side_dir("new")).encode()
        out: dict[str, str] = {}
        for f in sorted(files):
            data = f.read_bytes() if f.is_file() else b""
            if side == "old" and not self.same_path:
                data = data.replace(old_prefix, new_prefix)
            out[str(f.relative_to(root))] = hashlib.sha256(data).hexdigest()
        return out

    def binaries_identical(self, tests: list[str]) -> bool:
        old = self._artifacts("old", tests)
        new = self._artifacts("new", tests)
        return old is not None and old == new

    def run_test(self, side: SideName, test: TestCase, limits: Limits) -> RunResult:
        jail = self._jail(side, building=False, cwd=test.cwd)
        if jail is not None:
            env = jail_env(self.env_overrides, test.env)
        else:
            env = host_env(self.env_overrides, test.env)
        try:
            return run(
                test.command,
                cwd=test.cwd,
                env=env,
                limits=limits,
                output_limit=self.output_limit,
                sandbox=self.sandbox or jail is not None,
                mount=self._mount(side) if jail is None else None,
                jail=jail,
                timed=True,
            )
        except OSError as exc:
            raise InfraFailure(f"cannot run {test.name}: {exc}") from exc

    def cleanup(self) -> None:
        shutil.rmtree(self.workspace, ignore_errors=True)

    def commit(self, image: str, record: dict[str, Any]) -> str:
        raise NotImplementedError("instance images need the docker backend")

    def push(self, image: str, registry: str) -> str:
        raise NotImplementedError("instance images need the docker backend")

    def read_record(self) -> dict[str, Any]:
        raise NotImplementedError("instance images need the docker backend")

    def instructions_unsupported(self) -> str | None:
        return instructions_unsupported()

    def valgrind_unsupported(self) -> str | None:
        return valgrind_unsupported()

    def toolchain(self) -> dict[str, str]:
        """Compiler and CMake versions on this host (first line of `--version`)."""
        cxx = os.environ.get("CXX") or "c++"
        return {"compiler": _first_line([cxx, "--version"]), "cmake": _first_line(["cmake", "--version"])}
