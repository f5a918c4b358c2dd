"""Run one command the way the builder measures it: sandboxed, timed, output bounded.

- Jail (`jail=Jail(...)`, bubblewrap): what every build step and test of the evaluator (and of the
  builder when bwrap works) runs in. An unprivileged uid (`SANDBOX_UID`: when we are root the
  child drops to it *before* exec'ing bwrap, so the jailed code is that uid on the host too), new
  user/pid/net/ipc/uts/cgroup namespaces, no capabilities, `no_new_privs`, no nested user
  namespaces, a seccomp filter without kernel keyrings (`seccomp.py`); a read-only system (`/usr`,
  the few `/etc` files compilers need), `/` and `/dev` read-only, fresh size-capped tmpfs `/tmp`
  and `/dev/shm` per run, only the binds the caller names (its own tree, writable or not, and a
  ccache dir), no view of other trees, the store, `runs/` or any home; an environment from an
  allow-list (`jail_env`). rlimits and the run's cgroups are set on the child before exec, so the
  jailed code cannot raise them; on timeout bwrap (pid 1 of the namespace) is killed, which kills
  every process in the namespace, and the cgroup is emptied. A `timed` run's runner is the
  jail's pid 1 (no bwrap init holding the answer pipe; not dumpable, not signallable from
  inside), reaps every orphan so their CPU time is counted, and its answer counts only when it
  exited 0. `jail_available()` says whether
  bwrap works here; callers decide what to do without it (the evaluator refuses, see README).
- Network (no jail): unshared (`bwrap --unshare-net` when installed, else `unshare --net`, with
  `--map-root-user` when not root); `sandbox=False` runs it plainly.
- rlimits: CPU seconds, file size; own process group, killed whole on timeout.
  A timeout is a value (`timed_out=True`), not an exception.
- Processes and memory: a per-run cgroup (`cgroups.RunCgroup`) where the host delegates one
  (cgroup v2 with the controllers enabled for our cgroup, or v1 `pids`/`memory` hierarchies as
  root): `pids.max` so a fork bomb hits a wall, and one memory cap for the whole run — all its
  processes together and what they write into the jail's tmpfs `/tmp` (`memory_exceeded` and a
  line in the output when the kernel killed for it; such a run has failed, exit 137 if it said 0);
  every leftover process is killed afterwards.
  Without such a cgroup: RLIMIT_NPROC (effective for non-root users only) and RLIMIT_AS per
  process.
- Pinned to one CPU when asked (`os.sched_setaffinity`).
- Output: a pipe drained by a thread that keeps the first and last `output_limit/2` bytes.
- Time: wall via `perf_counter_ns`, CPU via `os.wait4` rusage (user + sys of the process tree
  that was waited for).
"""

from __future__ import annotations

import ctypes
import fnmatch
import json
import os
import resource
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from cppperf.shared.engine.cgroups import RunCgroup
from cppperf.shared.engine.runner_script import (
    UNHANDLED_NOTE,
    InstructionCounter,
    OutputKeeper,
    cachegrind_counts,
    estimated_cycles,
    set_affinity,
    supervise,
    valgrind_argv,
    valgrind_dir,
    valgrind_logs_unhandled,
)
from cppperf.shared.engine.seccomp import filter_fd


@dataclass(frozen=True)
class Limits:
    timeout: float = 600.0
    cpu_seconds: int | None = None
    memory_mb: int | None = 4096  # the whole run (memory cgroup) where delegated, else per process
    memory_cgroup: bool = True  # False: always per process (RLIMIT_AS)
    file_size_mb: int | None = 1024
    processes: int | None = None
    network: bool = False  # False = unshare the network namespace
    cpu: int | None = None  # pin to this CPU (a timed run: the leased core)
    cpus: tuple[int, ...] = ()  # else run on these CPUs (builds: the build cores)
    instructions: bool = False  # count user-space instructions (perf_event_open)
    valgrind: bool = False  # run under Cachegrind and count its instructions (`RunResult.ir`)
    cache_sim: bool = False  # with `valgrind`: simulate the caches too (`RunResult.est_cycles`)


# SIGKILL as a signal (our own runs) or as an exit code (bubblewrap's and a shell's 128 + 9)
KILLED: Final = frozenset({-9, 137})


@dataclass(frozen=True)
class RunResult:
    returncode: int
    wall_s: float
    cpu_s: float
    output: str
    timed_out: bool
    truncated: bool
    max_rss_kb: int = 0
    instructions: int | None = None  # user-space instructions when counted and allowed
    memory_exceeded: bool = False  # the kernel killed a process of the run at its memory cgroup cap
    ir: int | None = None  # instructions Cachegrind counted (`Limits.valgrind`), every process
    est_cycles: int | None = None  # estimated cycles from its simulated cache misses (`Limits.cache_sim`)
    # Valgrind met an instruction it cannot run (its log's line and where): the metric's limit
    valgrind_unhandled: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


_LIBC = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
STAGE_PARENT = "/tmp"  # noqa: S108 - world-walkable; per-run 0755 root-owned stage dirs (_stage_binds)
RUNNER_PATH = Path(__file__).with_name("runner_script.py")
INNER_RUNNER = "/run/cppperf/runner.py"
INNER_PYTHON = "/usr/bin/python3"
SANDBOX_UID = 65534  # nobody: owns nothing on the host
# What a compiler, CMake and a test need from the host, read-only. /etc only in part: the
# alternatives links (/usr/bin/c++ → /etc/alternatives/c++) and the dynamic linker's files.
SYSTEM_RO = (
    "/usr",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
)
_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Host environment variables a jailed build may see (tool choice, locale); never tokens or keys.
ENV_ALLOW = (
    "LANG",
    "LC_*",
    "TZ",
    "CC",
    "CXX",
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "CMAKE_GENERATOR",
    "CMAKE_BUILD_PARALLEL_LEVEL",
    "PKG_CONFIG_PATH",
    "OMP_*",
)
JAIL_TMP = "/tmp"  # noqa: S108 - inside the jail: a private tmpfs, fresh for each run
JAIL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


SCRATCH_MB = 64  # each `Jail.scratch` tmpfs (CTest's own logs of one run)
VIEW_MB = 256  # each `Jail.views` tmpfs (what one test run writes into its working directory)
VIEW_MAX_ENTRIES = 4096  # a directory with more entries stays read-only (bwrap's command line)


@dataclass(frozen=True)
class Jail:
    """What one jailed run sees besides the read-only system: (host path, path inside) binds."""

    rw: tuple[tuple[Path, Path], ...] = ()
    ro: tuple[tuple[Path, Path], ...] = ()
    uid: int = SANDBOX_UID
    tmp_mb: int = 1024  # size of the private /tmp
    system: tuple[str, ...] = field(default=SYSTEM_RO)
    # directories inside a read-only bind that get a fresh tmpfs of their own (SCRATCH_MB) for the
    # run: writable while it runs, gone after it (each must exist: it is the mount point)
    scratch: tuple[Path, ...] = ()
    # directories inside a read-only bind made writable for the run (`_view_args`): a fresh,
    # capped tmpfs (VIEW_MB) holding every entry the tree has there bound back read-only, so a
    # test may create files in its working directory (logs, outputs) but change nothing the
    # build made, and nothing it writes outlives the run
    views: tuple[Path, ...] = ()


def _allowed() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if any(fnmatch.fnmatchcase(k, pat) for pat in ENV_ALLOW)}


def jail_env(*layers: Mapping[str, str]) -> dict[str, str]:
    """An environment built from the allow-list of this process's variables, then `layers`."""
    env = _allowed()
    env.update(PATH=JAIL_PATH, HOME=JAIL_TMP, TMPDIR=JAIL_TMP)
    env.setdefault("LC_ALL", "C")
    for layer in layers:
        env.update(layer)
    return env


def host_env(*layers: Mapping[str, str]) -> dict[str, str]:
    """The same allow-list for builds and tests run without the jail, with this host's PATH and
    HOME (its tools may live there): never the process's tokens, passwords or bus URL."""
    env = _allowed()
    env.update({k: os.environ[k] for k in ("PATH", "HOME", "TMPDIR") if k in os.environ})
    env.setdefault("LC_ALL", "C")
    for layer in layers:
        env.update(layer)
    return env


def bwrap_argv(
    jail: Jail,
    cwd: str | None,
    *,
    stage: str | None = None,
    share_net: bool = False,
    seccomp_fd: int | None = None,
    as_pid_1: bool = False,
) -> list[str]:
    """The bwrap command line for `jail` (the command follows). `stage`: the bind sources are
    read from `<stage>/<i>` (`ro` then `rw`), where `run` mounted them (`_stage_binds`).
    `share_net` (`Limits.network=True`, never for agents' code) keeps the host's network.
    `seccomp_fd`: the filter (`seccomp.filter_fd`), inherited by bwrap. `as_pid_1`: the command
    is pid 1 of the namespace, with no bwrap init holding the host end of its pipes (the timing
    runner: pid 1 cannot be signalled from inside, and it is not dumpable, so nothing it runs
    can reach its stdout through /proc/1/fd)."""
    argv = [
        "bwrap",
        "--unshare-all",
        *(["--share-net"] if share_net else []),
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(jail.uid),
        "--gid",
        str(jail.uid),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
        *(["--as-pid-1"] if as_pid_1 else []),
    ]
    for path in jail.system:
        if os.path.lexists(path):
            argv += ["--ro-bind", path, path]
    for top in _TOP_LINKS:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(jail.tmp_mb * 1024 * 1024),
        "--tmpfs",
        JAIL_TMP,
        "--size",
        str(jail.tmp_mb * 1024 * 1024),
        "--tmpfs",
        "/dev/shm",  # noqa: S108 - inside the jail: a private tmpfs, fresh for each run
    ]
    binds = [("--ro-bind", *b) for b in jail.ro] + [("--bind", *b) for b in jail.rw]
    for i, (flag, host, inside) in enumerate(binds):
        argv += [flag, f"{stage}/{i}" if stage else str(host), str(inside)]
    argv += _view_args(jail, binds, stage)
    for inside in jail.scratch:  # over the binds: a fresh, capped tmpfs per run
        argv += ["--size", str(SCRATCH_MB * 1024 * 1024), "--tmpfs", str(inside)]
    # bwrap's own tmpfs for / and /dev have no size (half the RAM): once every mount point is
    # made they become read-only, so only the size-capped /tmp and /dev/shm and the binds take writes
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if cwd:
        argv += ["--chdir", str(cwd)]
    return [*argv, "--"]


def _view_args(jail: Jail, binds: Sequence[tuple[str, Path, Path]], stage: str | None) -> list[str]:
    """bwrap arguments for `jail.views`: per view, a tmpfs over the directory, then each entry the
    host holds there bound back read-only (a symlink re-made as the same symlink, resolved inside
    the jail; other special files left out). A view not inside a read-only bind, reached through a symlink
    (the tree's own build could plant one pointing anywhere on the host), or too large stays as
    the bind has it: read-only."""
    argv: list[str] = []
    for view in jail.views:
        found = _bound_source(view, binds, stage)
        if found is None:
            continue
        host_dir, source = found
        try:
            entries = sorted(os.scandir(host_dir), key=lambda e: e.name)
        except OSError:
            continue
        if len(entries) > VIEW_MAX_ENTRIES:
            continue
        argv += ["--size", str(VIEW_MB * 1024 * 1024), "--tmpfs", str(view)]
        for entry in entries:
            inside = str(view / entry.name)
            if entry.is_symlink():
                argv += ["--symlink", os.readlink(entry.path), inside]
            elif entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                argv += ["--ro-bind", f"{source}/{entry.name}", inside]
    return argv


def _bound_source(
    view: Path, binds: Sequence[tuple[str, Path, Path]], stage: str | None
) -> tuple[Path, str] | None:
    """The host directory behind `view` (inside the deepest bind holding it) and the path bwrap
    reads it from (under the stage when there is one); None when no bind holds it or a component
    below the bind is a symlink or not a directory."""
    best: tuple[int, Path, Path] | None = None
    for i, (flag, host, inside) in enumerate(binds):
        holds = flag == "--ro-bind" and (view == inside or inside in view.parents)
        if holds and (best is None or len(inside.parts) > len(best[2].parts)):
            best = (i, Path(host), inside)
    if best is None:
        return None
    i, host, inside = best
    rel = view.relative_to(inside)
    here = Path(host)
    for part in rel.parts:
        here = here / part
        try:
            if part in (".", "..") or not stat.S_ISDIR(os.lstat(here).st_mode):
                return None
        except OSError:
            return None
    base = f"{stage}/{i}" if stage else str(host)
    return here, "/".join([base, *rel.parts])


def hand_over(*paths: Path) -> None:
    """Make `paths` (recursively) the sandbox uid's, so jailed builds can write them (root only;
    an unprivileged caller's own files are already writable by its jailed code)."""
    if os.geteuid() != 0:
        return
    for root in paths:
        if not root.exists():
            continue
        os.chown(root, SANDBOX_UID, SANDBOX_UID, follow_symlinks=False)
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                os.chown(os.path.join(dirpath, name), SANDBOX_UID, SANDBOX_UID, follow_symlinks=False)


_JAIL_CHECKED: list[str] = []


def jail_problem() -> str:
    """Why jailed runs cannot happen here ('' when they can); probed once per process."""
    if not _JAIL_CHECKED:
        if not shutil.which("bwrap"):
            why = "bubblewrap (bwrap) is not installed"
        else:
            res = run(["true"], jail=Jail(), limits=Limits(timeout=30, memory_mb=None), sandbox=True)
            why = "" if res.ok else f"bwrap cannot create its namespaces here: {res.output.strip()[-300:]}"
        _JAIL_CHECKED.append(why)
    return _JAIL_CHECKED[0]


def jail_available() -> bool:
    return not jail_problem()


def _network_prefix(sandbox: bool) -> list[str]:
    if not sandbox:
        return []
    if shutil.which("bwrap"):
        return ["bwrap", "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--"]
    if shutil.which("unshare"):
        return (
            ["unshare", "--net", "--"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user", "--"]
        )
    return []


_NET_CHECKED: dict[bool, list[str]] = {}


def network_prefix(sandbox: bool = True) -> list[str]:
    """The prefix that isolates the network, verified once per process (empty if unavailable)."""
    if sandbox not in _NET_CHECKED:
        prefix = _network_prefix(sandbox)
        if prefix:
            ok = subprocess.run([*prefix, "true"], capture_output=True, check=False).returncode == 0
            prefix = prefix if ok else []
        _NET_CHECKED[sandbox] = prefix
    return _NET_CHECKED[sandbox]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _make_stage(sources: Sequence[Path]) -> str:
    """A root-owned 0755 dir in STAGE_PARENT with one empty mount point per bind source."""
    stage = tempfile.mkdtemp(prefix="cppperf-stage-", dir=STAGE_PARENT)
    os.chmod(stage, 0o755)  # noqa: S103 - walkable by the sandbox uid; it holds only mount points
    for i, src in enumerate(sources):
        target = os.path.join(stage, str(i))
        if os.path.isdir(src):
            os.mkdir(target)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    return stage


def _stage_binds(stage: str, sources: Sequence[str]) -> None:
    """In the child, as root, before dropping to the sandbox uid: a private mount namespace in
    which each bind source is mounted on `<stage>/<i>`. The sandbox uid reaches them there even
    when their real path is not walkable for it (a 0700 home, pytest's tmp); on the host the
    stage stays empty (`run` removes it afterwards)."""
    _check(_LIBC.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_LIBC.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    for i, src in enumerate(sources):
        target = f"{stage}/{i}".encode()
        _check(_LIBC.mount(src.encode(), target, None, _MS_BIND | _MS_REC, None), f"bind {src}")


def _preexec(
    limits: Limits,
    cgroup: RunCgroup | None,
    counter: InstructionCounter | None = None,
    uid: int | None = None,
    stage: tuple[str, list[str]] | None = None,
) -> None:
    os.setsid()
    if cgroup is not None:
        cgroup.join_self()
    if limits.cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    if limits.memory_mb and (cgroup is None or cgroup.memory is None):  # else the cgroup caps the run
        b = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (b, b))
    if limits.file_size_mb:
        b = limits.file_size_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (b, b))
    if limits.processes and (cgroup is None or cgroup.pids is None):
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    set_affinity({limits.cpu} if limits.cpu is not None else set(limits.cpus))
    if uid is not None and os.geteuid() == 0:  # jailed: drop root before bwrap even starts
        if stage is not None:
            _stage_binds(*stage)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if counter is not None:  # last: count from the exec on, as the run's own user
        counter.in_child()


_MOUNT_SCRIPT = 'mount --bind "$1" "$2" && cd "$3" && shift 3 && exec "$@"'


def mount_namespace_available() -> bool:
    """Can we bind-mount in a private mount namespace (root, or unprivileged user namespaces)?"""
    if not _MOUNT_CHECKED:
        with tempfile.TemporaryDirectory() as d:
            a, b = Path(d) / "a", Path(d) / "b"
            a.mkdir()
            b.mkdir()
            probe = _mount_prefix(False, (a, b, str(b)))
            ok = (
                bool(probe)
                and subprocess.run([*probe, "true"], capture_output=True, check=False).returncode == 0
            )
        _MOUNT_CHECKED.append(ok)
    return _MOUNT_CHECKED[0]


_MOUNT_CHECKED: list[bool] = []


def _mount_prefix(isolate_net: bool, mount: tuple[Path, Path, str]) -> list[str]:
    if not shutil.which("unshare"):
        return []
    flags = ["--mount", *(["--net"] if isolate_net else [])]
    if os.geteuid() != 0:
        flags.append("--map-root-user")
    src, dst, cwd = mount
    return ["unshare", *flags, "--", "sh", "-c", _MOUNT_SCRIPT, "sh", str(src), str(dst), cwd]


def run(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    limits: Limits = Limits(),
    output_limit: int = 64 * 1024,
    sandbox: bool = True,
    log_file: Path | None = None,
    mount: tuple[Path, Path] | None = None,
    jail: Jail | None = None,
    timed: bool = False,
) -> RunResult:
    """Run `argv`; never raises for the command's own failure or timeout.

    `jail` runs it under bubblewrap (module docstring; `env` should come from `jail_env`); with
    `timed` the container runner (`runner_script.py`, the system's python3, read-only in the
    jail) times it *inside* the jail, so bwrap's namespace setup (~0.1 s, noisy) never enters a
    sample — as the docker backend does.
    `mount=(src, dst)` runs it in a private mount namespace with `src` bind-mounted on `dst`
    (and `cwd` entered after the mount): the builder gives every tree the same absolute path.
    `log_file` gets the same bounded head+tail as the result, appended after the run."""
    isolate = sandbox and not limits.network
    stage: tuple[str, list[str]] | None = None
    seccomp_fd: int | None = None
    inner = jail is not None and timed and os.path.exists(INNER_PYTHON)
    if jail is not None and inner:
        req: dict[str, object] = {"op": "run", "argv": list(argv), "cwd": str(cwd) if cwd else None}
        req.update(env=dict(env or {}), timeout=limits.timeout, output_limit=output_limit)
        req.update(instructions=limits.instructions)  # counted inside: bwrap's never enter it
        req.update(reap=True)  # it is pid 1 (bwrap --as-pid-1): orphans' CPU time is counted too
        req.update(valgrind=limits.valgrind, cache_sim=limits.cache_sim)  # files stay in the jail's /tmp
        jail = replace(jail, ro=(*jail.ro, (RUNNER_PATH, Path(INNER_RUNNER))))
        argv = [INNER_PYTHON, "-I", "-S", INNER_RUNNER, json.dumps(req)]
        # the outer timeout is a backstop: the runner kills its command at `timeout` itself
        limits = Limits(
            **{
                **limits.__dict__,
                "timeout": limits.timeout + 30,
                "instructions": False,
                "valgrind": False,
                "cache_sim": False,
            }
        )
        output_limit = 8 * output_limit + 65536  # the JSON answer, escapes included
    if jail is not None:
        if os.geteuid() == 0:
            sources = [host for host, _ in (*jail.ro, *jail.rw)]
            stage = (_make_stage(sources), [str(h) for h in sources])
        where = str(cwd) if cwd else None
        seccomp_fd = filter_fd()
        full = [
            *bwrap_argv(
                jail,
                where,
                stage=stage[0] if stage else None,
                share_net=limits.network,
                seccomp_fd=seccomp_fd,
                as_pid_1=inner,
            ),
            *argv,
        ]
        cwd = "/"
    elif mount is not None:
        full = [
            *_mount_prefix(
                isolate and bool(network_prefix(True)), (mount[0], mount[1], str(cwd or mount[1]))
            ),
            *argv,
        ]
        cwd = None
    else:
        prefix = network_prefix(sandbox) if not limits.network else []
        full = [*prefix, *argv]
    cg_dir = None
    if limits.valgrind and jail is None:  # no jail's runner: on this host, in a directory of our own
        cg_dir = valgrind_dir(None)
        at = full.index(argv[0], len(full) - len(argv))
        full = [*full[:at], *valgrind_argv(list(argv), cg_dir, cache_sim=limits.cache_sim)]
    try:
        fds = (seccomp_fd,) if seccomp_fd is not None else ()
        res = _start_and_supervise(full, argv, cwd, env, limits, output_limit, log_file, jail, stage, fds)
        if cg_dir is not None:
            counts = cachegrind_counts(cg_dir)
            unhandled = valgrind_logs_unhandled(cg_dir)
            return replace(
                res,
                ir=None if counts is None else counts["Ir"],
                est_cycles=estimated_cycles(counts),
                valgrind_unhandled=unhandled,
                output=res.output + (UNHANDLED_NOTE.format(unhandled) if unhandled else ""),
            )
        return _inner_result(res, limits.memory_mb) if inner else res
    finally:
        if cg_dir is not None:
            shutil.rmtree(cg_dir, ignore_errors=True)
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        if stage is not None:  # mounted only in the (finished) child's namespace: empty here
            shutil.rmtree(stage[0], ignore_errors=True)


_OOM_LINE = "\ncppperf: memory limit of {} MiB for the whole run reached: the kernel killed a process\n"


def _inner_result(outer: RunResult, memory_mb: int | None) -> RunResult:
    """The runner's own measurement; the outer one when it gave none (killed by the backstop, or
    by the kernel at the memory cap). An answer counts only when the runner itself exited 0:
    text on the pipe of a runner that did not finish is never trusted."""
    if outer.returncode != 0 or outer.timed_out:
        return outer
    try:
        ans = json.loads(outer.output)
        oom = outer.memory_exceeded
        code = int(ans["returncode"])
        return RunResult(
            returncode=137 if oom and code == 0 else code,
            wall_s=float(ans["wall_s"]),
            cpu_s=float(ans["cpu_s"]),
            output=str(ans["output"]) + (_OOM_LINE.format(memory_mb) if oom else ""),
            timed_out=bool(ans["timed_out"]),
            truncated=bool(ans["truncated"]),
            max_rss_kb=int(ans.get("max_rss_kb", 0)),
            instructions=None if ans.get("instructions") is None else int(ans["instructions"]),
            memory_exceeded=oom,
            ir=None if ans.get("ir") is None else int(ans["ir"]),
            est_cycles=None if ans.get("est_cycles") is None else int(ans["est_cycles"]),
            valgrind_unhandled=None
            if ans.get("valgrind_unhandled") is None
            else str(ans["valgrind_unhandled"]),
        )
    except (ValueError, KeyError, TypeError):
        return outer


def _start_and_supervise(
    full: list[str],
    argv: Sequence[str],
    cwd: Path | str | None,
    env: Mapping[str, str] | None,
    limits: Limits,
    output_limit: int,
    log_file: Path | None,
    jail: Jail | None,
    stage: tuple[str, list[str]] | None,
    pass_fds: tuple[int, ...] = (),
) -> RunResult:
    keep = OutputKeeper(output_limit)
    cgroup = (
        RunCgroup(processes=limits.processes, memory_mb=limits.memory_mb if limits.memory_cgroup else None)
        if limits.processes or (limits.memory_mb and limits.memory_cgroup)
        else None
    )
    counter = InstructionCounter() if limits.instructions else None
    start = time.perf_counter_ns()
    try:
        proc = subprocess.Popen(
            full,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            pass_fds=pass_fds,
            preexec_fn=lambda: _preexec(  # noqa: PLW1509 - rlimits need preexec
                limits, cgroup, counter, jail.uid if jail is not None else None, stage
            ),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        if counter is not None:
            counter.close()
        if cgroup is not None:
            cgroup.kill_all_and_remove()
        return RunResult(127, 0.0, 0.0, f"cannot start {argv[0]}: {exc}", False, False)
    if counter is not None:
        counter.receive()
    status, usage, wall, timed_out = supervise(
        proc,
        keep,
        limits.timeout,
        start,
        # also what left the process group (setsid'd daemons)
        after_exit=cgroup.kill_all_and_remove if cgroup is not None else None,
    )
    oom = cgroup is not None and cgroup.oom_killed()
    output = keep.text() + (_OOM_LINE.format(limits.memory_mb) if oom else "")
    if log_file is not None:  # bounded on disk too: never more than the kept head and tail
        with log_file.open("ab") as fh:
            fh.write(output.encode())
    assert proc.stdout is not None
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if oom and proc.returncode == 0:  # a process of the run was killed: the run failed, as killed
        proc.returncode = 137
    return RunResult(
        returncode=proc.returncode,
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        output=output,
        timed_out=timed_out,
        truncated=keep.dropped > 0,
        max_rss_kb=usage.ru_maxrss,
        instructions=counter.read() if counter is not None else None,
        memory_exceeded=oom,
    )
