"""CMake configure/build and CTest discovery for one source tree.

Configure: `-DCMAKE_BUILD_TYPE=Release` (setting), Ninja when available, ccache as compiler
launcher when installed, `BUILD_TESTING=ON` plus the project's own `<X>_TEST`/`<X>_BUILD_TESTS`
style options found in its CMakeLists. Tests: `ctest --show-only=json-v1` gives each test's
command, working directory and environment so the protocol can run them directly.

Every step takes an optional `jail` (sandbox.Jail): configure, build and test discovery then run
under bubblewrap as the sandbox uid with only the tree (and ccache) visible — a project's CMake
code, compilers and generated `CTestTestfile.cmake` are code from the tree, trusted or not.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cppperf.shared.domain import FailureCategory
from cppperf.shared.engine.deps import MissingDeps, diagnose
from cppperf.shared.engine.fetchcontent import INIT_CACHE
from cppperf.shared.engine.sandbox import KILLED, Jail, Limits, RunResult, host_env, run

_TEST_OPTION = re.compile(
    r"option\s*\(\s*(\w*(?:BUILD_TESTS?|BUILD_TESTING|_TESTS?|_TESTING|_UNIT_TESTS|ENABLE_TESTS?|WITH_TESTS?))\b",
    re.IGNORECASE,
)


# Test switches for what no builder image has: a GPU toolchain (CUDA, HIP, SYCL, OpenCL) or
# clang's libFuzzer. Left at the project's default: switched on, they fail the configure or the
# build (`find_package(CUDA REQUIRED)`, `-fsanitize=fuzzer` under GCC) of a tree whose ordinary
# tests would have run.
_NEEDS_WHAT_WE_LACK = re.compile(r"CUDA|(?:^|_)(?:HIP|SYCL|OPENCL|GPU|FUZZ\w*)(?:_|$)", re.IGNORECASE)


def test_options_from_text(texts: list[str]) -> list[str]:
    """`-D<opt>=ON` for test switches declared with option() in the given CMake texts."""
    opts: dict[str, None] = {"BUILD_TESTING": None}
    for text in texts:
        for name in _TEST_OPTION.findall(text):
            upper = name.upper()
            if "DISABLE" in upper or "NO_" in upper or _NEEDS_WHAT_WE_LACK.search(upper):
                continue
            opts.setdefault(name, None)
    return [f"-D{o}=ON" for o in opts]


def top_cmake_texts(src: Path) -> list[str]:
    """The project's top CMakeLists.txt and cmake/*.cmake, where its switches are declared."""
    files = [src / "CMakeLists.txt"]
    if (src / "cmake").is_dir():
        files += sorted((src / "cmake").glob("*.cmake"))
    return [f.read_text(errors="replace") for f in files if f.is_file()]


def test_options(src: Path) -> list[str]:
    """Test switches declared in the project's top CMakeLists.txt and cmake/*.cmake."""
    return test_options_from_text(top_cmake_texts(src))


_BENCH_OPTION = re.compile(
    r"option\s*\(\s*(\w*(?:BUILD_BENCH\w*|_BENCHMARKS?|ENABLE_BENCH\w*|WITH_BENCH\w*|_BENCH))\b",
    re.IGNORECASE,
)
# Google Benchmark's own switches, for a tree that builds it from source (add_subdirectory,
# FetchContent): its tests need GoogleTest (or a download), never what we time
BENCHMARK_LIBRARY_OFF = ("-DBENCHMARK_ENABLE_TESTING=OFF", "-DBENCHMARK_ENABLE_GTEST_TESTS=OFF")


def benchmark_options_from_text(texts: list[str], *, on: bool = True) -> list[str]:
    """`-D<opt>=ON` for the benchmark switches declared with option() in the given CMake texts
    (`FOO_BUILD_BENCHMARKS`, `FOO_BENCHMARK`, `ENABLE_BENCHMARKS`, …; Google Benchmark's own
    `BENCHMARK_*` switches excepted) and, when the tree mentions benchmarks at all, Google
    Benchmark's own tests off. Nothing for a tree without benchmarks (its commands stay as they
    were). `on=False`: the same switches explicitly off."""
    opts: dict[str, None] = {}
    mentions = False
    for text in texts:
        mentions = mentions or "benchmark" in text.lower()
        for name in _BENCH_OPTION.findall(text):
            upper = name.upper()
            if upper.startswith("BENCHMARK_") or "DISABLE" in upper or "NO_" in upper:
                continue
            opts.setdefault(name, None)
    value = "ON" if on else "OFF"
    return [f"-D{o}={value}" for o in opts] + (list(BENCHMARK_LIBRARY_OFF) if mentions or opts else [])


def benchmark_options(src: Path, *, on: bool = True) -> list[str]:
    """Benchmark switches declared in the project's top CMakeLists.txt and cmake/*.cmake."""
    return benchmark_options_from_text(top_cmake_texts(src), on=on)


# `-Wno-error` after every flag of a compile (target options such as `-Werror` included): the rule
# variables CMake's modules only set when they are unset. Used by the builder's -Werror fallback.
NO_WERROR_ARGS = tuple(
    f"-DCMAKE_{lang}_COMPILE_OBJECT=<CMAKE_{lang}_COMPILER> <DEFINES> <INCLUDES> <FLAGS> -Wno-error "
    "-o <OBJECT> -c <SOURCE>"
    for lang in ("CXX", "C")
)
_ERROR_LINE = re.compile(r"^\S.*?:\d+(?::\d+)?: (?:fatal )?error: .*$", re.MULTILINE)


def werror_only(output: str) -> bool:
    """Whether a failed build's compiler errors are all warnings made errors (`[-Werror…]`)."""
    errors = _ERROR_LINE.findall(output)
    return bool(errors) and all("[-Werror" in line for line in errors)


@dataclass(frozen=True)
class BuildSpec:
    build_type: str = "Release"
    jobs: int = 0
    extra_args: tuple[str, ...] = ()
    configure_timeout: float = 600.0
    build_timeout: float = 3600.0
    memory_mb: int | None = None  # the whole step (memory cgroup), else per process (RLIMIT_AS)
    processes: int | None = None  # pids cgroup (else RLIMIT_NPROC) for jailed steps
    cpus: tuple[int, ...] = ()  # the build cores (never a core leased for timing); empty: any
    benchmarks: bool = False  # the tree's benchmark options on (`benchmark_options`), GB's own tests off


def _step_limits(spec: BuildSpec, timeout: float, jail: Jail | None) -> Limits:
    if jail is None:
        return Limits(timeout=timeout, memory_mb=None, cpus=spec.cpus)
    return Limits(
        timeout=timeout,
        cpu_seconds=int(timeout) + 1,
        memory_mb=spec.memory_mb,
        processes=spec.processes,
        cpus=spec.cpus,
    )


@dataclass
class StepResult:
    step: str
    ok: bool
    result: RunResult
    category: FailureCategory | None = None
    missing: MissingDeps | None = None
    log_path: Path | None = None
    argv: tuple[str, ...] = ()  # the command as run (recorded)


def tool_env(ccache_dir: Path | None, basedir: Path | None) -> dict[str, str]:
    env = host_env()  # the allow-list (sandbox.ENV_ALLOW), never the process's secrets
    if ccache_dir is not None:
        env["CCACHE_DIR"] = str(ccache_dir)
        env["CCACHE_NOHASHDIR"] = "1"
        if basedir is not None:
            env["CCACHE_BASEDIR"] = str(basedir)
    return env


def configure_argv(
    src: Path,
    build: Path,
    spec: BuildSpec,
    *,
    ninja: bool | None = None,
    ccache: bool | None = None,
    options: list[str] | None = None,
    init_cache: bool | None = None,
) -> list[str]:
    """The configure command; tools and test options default to what this host and tree have
    (the docker backend passes them: its tree is in a container). `init_cache`: the tree carries
    cppperf's FetchContent `-C` script (default: look for it under `src`)."""
    argv = ["cmake", "-S", str(src), "-B", str(build), f"-DCMAKE_BUILD_TYPE={spec.build_type}"]
    if (src / INIT_CACHE).is_file() if init_cache is None else init_cache:
        argv[1:1] = ["-C", str(src / INIT_CACHE)]
    if shutil.which("ninja") if ninja is None else ninja:
        argv += ["-G", "Ninja"]
    if shutil.which("ccache") if ccache is None else ccache:
        argv += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
    argv += test_options(src) if options is None else options
    argv += list(spec.extra_args)
    return argv


def configure(
    src: Path,
    build: Path,
    spec: BuildSpec,
    *,
    env: dict[str, str],
    log: Path,
    mount: tuple[Path, Path] | None = None,
    jail: Jail | None = None,
    benchmarks: bool = True,
) -> StepResult:
    """`mount=(host, seen)`: the tree at `host` is seen at `seen` (a mount namespace, or the
    jail's bind); `src`/`build` are paths as seen. With `spec.benchmarks` the tree's benchmark
    switches are on, or explicitly off with `benchmarks=False` (a retry after they failed)."""
    if mount is None:
        build.mkdir(parents=True, exist_ok=True)
    real_src = src if mount is None else mount[0] / src.relative_to(mount[1])
    options = test_options(real_src) + (benchmark_options(real_src, on=benchmarks) if spec.benchmarks else [])
    argv = configure_argv(src, build, spec, options=options, init_cache=(real_src / INIT_CACHE).is_file())
    res = run(
        argv,
        env=env,
        limits=_step_limits(spec, spec.configure_timeout, jail),
        sandbox=jail is not None,
        log_file=log,
        output_limit=256 * 1024,
        mount=mount if jail is None else None,
        jail=jail,
        cwd=str(mount[1]) if mount else None,
    )
    if res.ok:
        return StepResult("configure", True, res, log_path=log, argv=tuple(argv))
    missing = None if res.timed_out or res.memory_exceeded else diagnose(res.output, build / "CMakeCache.txt")
    category = step_category("configure", res, missing=missing is not None)
    return StepResult("configure", False, res, category, missing, log, argv=tuple(argv))


def step_category(step: str, res: RunResult, *, missing: bool = False) -> FailureCategory:
    """Why a failed configure or build step failed (a pure decision over its run), for every
    backend (local and docker): a wall (timeout, the memory cgroup), a missing dependency
    (configure), the build killed from outside (SIGKILL, as a signal or as the jail's exit code
    137; the compiler driver's "Killed signal"): infra, else the project's own configure or
    compile error."""
    if res.timed_out:
        return FailureCategory.TIMEOUT
    if res.memory_exceeded:  # the run's memory cgroup: the step needs more than builder.memory_limit_mb
        return FailureCategory.RESOURCE_LIMIT
    if step == "configure":
        return FailureCategory.DEPENDENCY if missing else FailureCategory.CONFIGURE
    if res.returncode < 0 or res.returncode in KILLED or "Killed signal terminated program" in res.output:
        return FailureCategory.INFRA
    return FailureCategory.COMPILE


def build(
    build_dir: Path,
    spec: BuildSpec,
    *,
    env: dict[str, str],
    log: Path,
    mount: tuple[Path, Path] | None = None,
    jail: Jail | None = None,
) -> StepResult:
    jobs = spec.jobs or len(spec.cpus) or os.cpu_count() or 1
    argv = ("cmake", "--build", str(build_dir), "-j", str(jobs))
    res = run(
        argv,
        env=env,
        limits=_step_limits(spec, spec.build_timeout, jail),
        sandbox=jail is not None,
        log_file=log,
        output_limit=256 * 1024,
        mount=mount if jail is None else None,
        jail=jail,
        cwd=str(build_dir) if mount else None,
    )
    if res.ok:
        return StepResult("build", True, res, log_path=log, argv=argv)
    return StepResult("build", False, res, step_category("build", res), log_path=log, argv=argv)


@dataclass(frozen=True)
class TestCase:
    name: str
    command: list[str]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    disabled: bool = False
    will_fail: bool = False
    pass_regex: tuple[str, ...] = ()
    fail_regex: tuple[str, ...] = ()
    skip_return_code: int | None = None

    def passed(self, returncode: int, output: str, *, timed_out: bool = False) -> bool:
        """CTest's rules: PASS_/FAIL_REGULAR_EXPRESSION on the output, SKIP_RETURN_CODE, WILL_FAIL."""
        if timed_out:
            return False
        if self.skip_return_code is not None and returncode == self.skip_return_code:
            return True
        ok = any(_search(rx, output) for rx in self.pass_regex) if self.pass_regex else returncode == 0
        if self.fail_regex and any(_search(rx, output) for rx in self.fail_regex):
            ok = False
        return not ok if self.will_fail else ok


def _search(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text, re.DOTALL) is not None  # CMake regexes: "." matches newlines
    except re.error:
        return pattern in text


def ctest_json(
    build_dir: Path,
    *,
    env: dict[str, str] | None = None,
    mount: tuple[Path, Path] | None = None,
    jail: Jail | None = None,
) -> str | None:
    """`ctest --show-only=json-v1` of a build tree (None when ctest fails), run in the tree
    (`--test-dir` needs CMake 3.20)."""
    argv = ["ctest", "--show-only=json-v1"]
    if mount is None and jail is None:
        proc = subprocess.run(argv, capture_output=True, check=False, env=env, timeout=300, cwd=build_dir)
        return proc.stdout.decode(errors="replace") if proc.returncode == 0 else None
    res = run(
        argv,
        env=env,
        sandbox=jail is not None,
        limits=Limits(timeout=300, memory_mb=None if jail is None else 4096),
        output_limit=256 * 1024 * 1024,
        mount=mount if jail is None else None,
        jail=jail,
        cwd=str(build_dir),
    )
    return res.output if res.ok else None


def discover_tests(
    build_dir: Path,
    *,
    env: dict[str, str] | None = None,
    mount: tuple[Path, Path] | None = None,
    jail: Jail | None = None,
) -> list[TestCase]:
    """Every CTest test with its command line, working directory and environment."""
    data = ctest_json(build_dir, env=env, mount=mount, jail=jail)
    return parse_ctest_json(data, str(build_dir)) if data is not None else []


def test_description(data: str | None, root: str = "") -> list[dict[str, object]]:
    """What the tests *mean*, from `ctest --show-only=json-v1`: each test's name, command,
    arguments and properties (working directory, environment, regexes, …) without the
    backtraces (file/line of the definitions), with the tree's own path `root` written as
    `<tree>`. Two trees whose descriptions differ do not run the same tests — the evaluator's
    `test-edit` check."""
    if data and root:
        data = re.sub(re.escape(json.dumps(root)[1:-1]) + r'(?=[/"])', "<tree>", data)
    parsed = json.loads(data or "{}")
    tests = [{k: v for k, v in t.items() if k != "backtrace"} for t in parsed.get("tests", [])]
    return sorted(tests, key=lambda t: json.dumps(t, sort_keys=True))


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def parse_ctest_json(data: bytes | str, build_dir: str) -> list[TestCase]:
    """Tests from `ctest --show-only=json-v1` output."""
    parsed = json.loads(data or b"{}")
    tests: list[TestCase] = []
    for t in parsed.get("tests", []):
        if not t.get("command"):
            continue
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        test_env: dict[str, str] = {}
        for item in props.get("ENVIRONMENT", []) or []:
            key, _, value = str(item).partition("=")
            test_env[key] = value
        tests.append(
            TestCase(
                name=t["name"],
                command=[str(c) for c in t["command"]],
                cwd=str(props.get("WORKING_DIRECTORY", build_dir)),
                env=test_env,
                timeout=float(props["TIMEOUT"]) if "TIMEOUT" in props else None,
                disabled=bool(props.get("DISABLED", False)),
                will_fail=bool(props.get("WILL_FAIL", False)),
                pass_regex=tuple(_as_list(props.get("PASS_REGULAR_EXPRESSION"))),
                fail_regex=tuple(_as_list(props.get("FAIL_REGULAR_EXPRESSION"))),
                skip_return_code=int(props["SKIP_RETURN_CODE"]) if "SKIP_RETURN_CODE" in props else None,
            )
        )
    return tests


def normalise(test: TestCase, res: RunResult) -> RunResult:
    """A run whose `returncode` says what CTest would say (pass/fail regexes, WILL_FAIL, skip)."""
    passed = test.passed(res.returncode, res.output, timed_out=res.timed_out)
    if passed == (res.returncode == 0 and not res.timed_out):
        return res
    return RunResult(**{**res.__dict__, "returncode": 0 if passed else (res.returncode or 1)})
