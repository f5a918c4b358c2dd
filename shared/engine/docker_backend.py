"""The docker backend: builds and test runs in a container (docker SDK against `DOCKER_HOST`;
podman's Docker-compatible API works too).

One container per instance, from the env image of the commit's era: `network_mode=none`, memory
and pids limits, on the host's build and timing cores (`cpuset_cpus`; builds run on the build cores, each timed
run on its leased core), removed in `cleanup()`. Sources go in with
`put_archive` (git archive), into the same-shaped trees the local backend uses (`/work/old`,
`/work/new`); every command runs through `/opt/cppperf/runner.py` as uid 1000, which times the
test inside the container. A configure that fails for missing Debian packages is retried in an
env image with those packages (again while each retry names more, up to `INSTALL_ROUNDS`).
`commit()` turns the finished container into the instance image `cppperf/<owner>__<name>:<sha12>`
with both trees built and the record at `/work/instance.json`; `from_image` reproduces an
instance from that image alone.

Security: every container drops all capabilities but the few the root-side setup needs (chown of
the trees, the runner's switch to the build uid, cleaning temp dirs); `no-new-privileges`; no
network; memory and pids limits. Configure, build, test discovery and tests run as a uid ≠ 0
with no capabilities. `hardened=True` (the evaluator, agents' code): each tree has its own uid
(`SIDE_UIDS`) and is private to it (0700) while it builds, then root's and read-only (group
read for its uid) while its tests run — but for the run's views (`_views`: CTest's
`build/Testing`, the test's working directory), which the runner opens for the run only, as
group-writable sticky directories emptied of what is not root's before and after it
(`runner_script.View`); the ccache is read-only for the agent's build; `/tmp`,
`/var/tmp` and `/dev/shm` are emptied before every run and HOME is /tmp.

Read-only root: every container runs with `read_only=True`, so not even root in it can change
the system (no wrapper over `/usr/bin/c++`, nothing planted in `/usr/local/bin` or the base
image's `/home/runner`, uid 1000's own directory, for a later run to find). Writable are only
size-limited tmpfs mounts — `/tmp` (`tmp_mb`, HOME when hardened), `/var/tmp` and `/dev/shm`
(`TMPFS_SMALL_MB`) — and `/work`, the trees: a named volume per container
(`cppperf-work-<id>`, labelled `cppperf=work`), removed in `cleanup()`. A volume, not a tmpfs:
build trees and the ccache of a real project take gigabytes, and a tmpfs counts against the
container's memory limit, which would turn big builds into `resource-limit` failures and shrink
the memory the tests are timed with. `/work` itself is root's (0755); only the trees, the
ccache and HOME below it belong to the build uids, so no uid can move another's tree away.
The runner is baked into the env image (`images.ensure_env_image`, keyed by the runner's hash);
sources go onto the volume with `put_archive`. Docker commit does not capture volumes, so
`commit()` runs a helper container of the same env image, the volume mounted read-only at /vol,
that copies it into its own (writable) root with `cp -a`, and commits the helper; a container
from an instance image gets a fresh volume that a helper of the instance image fills with
`cp -a` of the image's /work (not the engine's copy-up of an empty volume, which keeps whole
seconds of the mtimes only, so ninja would rebuild everything), and runs read-only like any
other. Helpers run with the same limits, no network and the setup's capabilities only.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from cppperf.shared.engine.backend import SideName, Sides, tar_tree
from cppperf.shared.engine.cmake import (
    BuildSpec,
    StepResult,
    TestCase,
    configure_argv,
    parse_ctest_json,
    step_category,
    test_options_from_text,
)
from cppperf.shared.engine.deps import diagnose
from cppperf.shared.engine.docker_exec import exec_answer, exec_bounded
from cppperf.shared.engine.fetchcontent import has_init_cache
from cppperf.shared.engine.images import (
    RUNNER,
    cmake_texts,
    ensure_env_image,
    git_archive,
    tar_bytes,
)
from cppperf.shared.engine.sandbox import KILLED, Limits, RunResult
from cppperf.shared.engine.submodules import Sources
from cppperf.shared.errors import InfraFailure

WORK = "/work"
UID = 1000
HOME = "/work/home"  # a home inside the per-instance tree, never a shared temp dir
RUN_MARGIN_S = 300.0  # a run's exec past its own timeout (the runner kills at it): the engine hangs
SETUP_DEADLINE_S = 3600.0  # chown, hashing, reading the record: none takes an hour
SIDE_UIDS = {"old": 1001, "expert": 1002, "new": 1001}  # hardened: every other side (agent) is UID
# root in the container may only set up: chown trees, switch to the build uid, clean temp dirs,
# and kill what a test left behind (the runner reaps as subreaper; the build uids get no caps)
CAPS = ["CHOWN", "SETUID", "SETGID", "FOWNER", "DAC_OVERRIDE", "KILL"]
TMPFS_SMALL_MB = 256  # /var/tmp and /dev/shm
WORK_LABEL = {"cppperf": "work"}  # the /work volumes
VOL = "/vol"  # where helper containers see a /work volume
INSTALL_ROUNDS = 3  # fresh containers with more packages after configures that name them
BOX_LABEL = {"cppperf": "box"}  # the containers (`cppperf.work`: the volume; `cppperf.logs`)


def oom_killed(answer: dict[str, Any]) -> bool:
    """The runner's answer: did the container's memory limit kill a process of the run? Where the
    runner cannot read the container's memory cgroup, a SIGKILL that is not the run's timeout
    is taken for it (the container's memory limit is what usually sends one)."""
    said = answer.get("oom_killed")
    if said is not None:
        return bool(said)
    return int(answer["returncode"]) in KILLED and not answer["timed_out"]


def tmpfs_options(size_mb: int) -> str:
    return f"rw,nosuid,nodev,size={size_mb}m,mode=1777"


@dataclass
class DockerBackend:
    client: Any
    base_image: str
    spec: BuildSpec
    env_overrides: dict[str, str]
    logs: Path
    memory_mb: int = 4096
    pids: int = 1024
    cpuset: str | None = None
    output_limit: int = 64 * 1024
    packages: list[str] = field(default_factory=list)
    from_image: str | None = None
    ccache_basedir: bool = False
    submodules: Sources = field(default_factory=Sources)
    hardened: bool = False  # agents' code: a uid per tree, read-only trees while tested (docstring)
    tmp_mb: int = 1024  # the /tmp tmpfs (compilers' temp files too); at most half the memory limit
    name: str = "docker"
    container: Any = None
    volume: Any = None
    image: str = ""
    installed: list[str] = field(default_factory=list)
    _sources: dict[SideName, bytes] = field(default_factory=dict)
    _test_options: list[str] = field(default_factory=lambda: ["-DBUILD_TESTING=ON"])
    _rounds: int = 0  # env images made for missing packages (at most INSTALL_ROUNDS)
    _built: bool = False  # a side has built in this container (no more fresh containers)

    # ------------------------------------------------------------------ container
    def _start(self, image: str, *, fill: bool = False) -> None:
        """A read-only container from `image` with a fresh volume at /work (`fill`: a copy of the
        image's /work) and tmpfs temp dirs."""
        small = min(TMPFS_SMALL_MB, max(16, self.memory_mb // 8))
        kwargs: dict[str, Any] = {
            "detach": True,
            "network_mode": "none",
            "mem_limit": f"{self.memory_mb}m",
            "pids_limit": self.pids,
            "cap_drop": ["ALL"],
            "cap_add": CAPS,
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {  # the container's own temp dirs: fresh, size-limited tmpfs mounts
                "/tmp": tmpfs_options(min(self.tmp_mb, max(32, self.memory_mb // 2))),  # noqa: S108
                "/var/tmp": tmpfs_options(small),  # noqa: S108
                "/dev/shm": tmpfs_options(small),  # noqa: S108
            },
            "working_dir": WORK,
            "command": ["sleep", "infinity"],
        }
        if self.cpuset:
            kwargs["cpuset_cpus"] = self.cpuset
        try:
            self.volume = self.client.volumes.create(
                name=f"cppperf-work-{uuid.uuid4().hex[:16]}", labels=WORK_LABEL
            )
            if fill:  # cp -a: owners and nanosecond mtimes (the engine's copy-up keeps seconds only)
                self._helper(image, f"cp -a {WORK}/. {VOL}/", "rw")
            kwargs["volumes"] = {self.volume.name: {"bind": WORK, "mode": "rw"}}
            # its volume and its logs directory: who a kept box belongs to, what to remove with it
            kwargs["labels"] = {**BOX_LABEL, "cppperf.work": self.volume.name, "cppperf.logs": str(self.logs)}
            self.container = self.client.containers.run(image, **kwargs)
        except Exception as exc:  # docker.errors.APIError / ImageNotFound
            self.cleanup()
            raise InfraFailure(f"cannot start a container from {image}: {exc}") from exc
        self.image = image

    def _helper(self, image: str, script: str, mode: str) -> Any:
        """Run `script` as root in a run-to-completion container of `image` with the volume at
        /vol (`mode`): a reader (ro, commit's copy) is returned exited, for the caller to commit
        and remove; a filler (rw) is removed here. InfraFailure when the script fails."""
        box = self.client.containers.run(
            image,
            ["sh", "-c", script],
            detach=True,
            network_mode="none",
            mem_limit=f"{self.memory_mb}m",
            pids_limit=self.pids,
            cap_drop=["ALL"],
            cap_add=CAPS,
            security_opt=["no-new-privileges"],
            volumes={self.volume.name: {"bind": VOL, "mode": mode}},
            labels={"cppperf": "helper"},
        )
        try:
            status = box.wait(timeout=3600)
            if int(status.get("StatusCode", 1)) != 0:
                logs = box.logs().decode(errors="replace")[-500:]
                raise InfraFailure(f"{script} failed in a helper container of {image}: {logs}")
        except Exception:
            with contextlib.suppress(Exception):
                box.remove(force=True)
            raise
        if mode == "rw":
            box.remove(force=True)
        return box

    def _exec(
        self, argv: list[str], *, user: str, deadline_s: float = SETUP_DEADLINE_S, answer: bool = True
    ) -> tuple[int, bytes]:
        """A command in the container that always returns (`docker_exec.exec_bounded`); one that
        prints its answer (`answer`: the runner, reads) runs again when the engine loses its output."""
        run = exec_answer if answer else exec_bounded
        return run(self.container, argv, user=user, deadline_s=deadline_s)

    def _root(self, argv: list[str]) -> None:
        code, out = self._exec(argv, user="0", answer=False)
        if code != 0:
            raise InfraFailure(
                f"{' '.join(argv)} failed in the container: {out.decode(errors='replace')[-500:]}"
            )

    def _own_work(self, sides: list[str]) -> None:
        """/work root's (0755); the trees and the ccache the build uid's, and HOME unless hardened
        (HOME is /tmp then: no uid keeps files on the volume between runs); hardened, `_own`
        then hands each tree to its own uid before it builds."""
        mine = [f"{WORK}/{side}" for side in sides] + [f"{WORK}/ccache"] + ([] if self.hardened else [HOME])
        self._root(["mkdir", "-p", *mine])
        self._root(["chown", "-R", f"{UID}:{UID}", *mine])
        self._root(["chown", "0:0", WORK])
        self._root(["chmod", "0755", WORK])

    def _load_sources(self) -> None:
        sides = list(self._sources) or ["old", "new"]
        self._root(["mkdir", "-p", *[f"{WORK}/{side}/src" for side in sides]])
        for side, data in self._sources.items():
            self.container.put_archive(f"{WORK}/{side}/src", data)
        self._own_work(sides)

    def prepare(self, repo_path: Path, sides: Sides) -> None:
        """Start the container and load every side: a commit by `git archive`, a host tree as tar.
        CMake test options come from the last side given as a commit (`new`, or the expert's)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.from_image is not None:
            self._start(self.from_image, fill=True)
            return
        self._sources = {
            side: tar_tree(src) if isinstance(src, Path) else git_archive(repo_path, src, self.submodules)
            for side, src in sides.items()
        }
        options_from = next((s for s in reversed(list(sides.values())) if isinstance(s, str)), None)
        if options_from is not None:
            self._test_options = test_options_from_text(cmake_texts(repo_path, options_from))
        self._start(ensure_env_image(self.client, self.base_image, self.packages))
        self._built = False  # a fresh container: no side built in it yet (a retry's prepare too)
        self._load_sources()

    def _recreate_with(self, packages: list[str]) -> None:
        self.cleanup()
        self.packages = sorted(set(self.packages) | set(packages))
        self._start(ensure_env_image(self.client, self.base_image, self.packages))
        self._load_sources()
        self.installed = list(self.packages)

    # ------------------------------------------------------------------ running things
    def _run(
        self,
        argv: list[str],
        *,
        cwd: str,
        timeout: float,
        env: dict[str, str] | None = None,
        cpu: int | None = None,
        cpus: tuple[int, ...] = (),
        instructions: bool = False,
        output_limit: int | None = None,
        uid: int = UID,
        reap: bool = False,
        valgrind: bool = False,
        cache_sim: bool = False,
        views: tuple[str, ...] = (),
        tree: str = "",
    ) -> RunResult:
        req: dict[str, Any] = {
            "op": "run",
            "argv": argv,
            "cwd": cwd,
            "env": env or {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self._home, "LC_ALL": "C"},
            "timeout": timeout,
            "output_limit": output_limit or self.output_limit,
            "cpu": cpu,
            "cpus": list(cpus),
            "instructions": instructions,
            "uid": uid,
            "fresh_tmp": self.hardened,
            "reap": reap,  # the runner as subreaper: what the test left is killed, orphans' CPU counted
            "valgrind": valgrind,
            "cache_sim": cache_sim,
        }
        if views:  # the runner makes them writable for this run only (`runner_script.View`)
            req.update(views=list(views), tree=tree)
        code, out = self._exec(
            ["python3", RUNNER, json.dumps(req)], user="0", deadline_s=timeout + RUN_MARGIN_S
        )
        try:
            ans = json.loads(out)
        except ValueError as exc:
            raise InfraFailure(f"runner failed in the container (exit {code}): {out[-500:]!r}") from exc
        return RunResult(
            returncode=int(ans["returncode"]),
            wall_s=float(ans["wall_s"]),
            cpu_s=float(ans["cpu_s"]),
            output=str(ans["output"]),
            timed_out=bool(ans["timed_out"]),
            truncated=bool(ans["truncated"]),
            max_rss_kb=int(ans.get("max_rss_kb", 0)),
            instructions=None if ans.get("instructions") is None else int(ans["instructions"]),
            ir=None if ans.get("ir") is None else int(ans["ir"]),
            memory_exceeded=oom_killed(ans),
            est_cycles=None if ans.get("est_cycles") is None else int(ans["est_cycles"]),
            valgrind_unhandled=None
            if ans.get("valgrind_unhandled") is None
            else str(ans["valgrind_unhandled"]),
        )

    @property
    def _home(self) -> str:
        return "/tmp" if self.hardened else HOME  # noqa: S108 - emptied before every hardened run

    def uid(self, side: SideName) -> int:
        return SIDE_UIDS.get(side, UID) if self.hardened else UID

    def _build_env(self, side: SideName = "") -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self._home,
            "LC_ALL": "C",
            "CCACHE_DIR": f"{WORK}/ccache",
            **({"CCACHE_BASEDIR": WORK} if self.ccache_basedir else {}),
            "CCACHE_NOHASHDIR": "1",
        }
        if self.hardened and side not in SIDE_UIDS:  # the agent reads the trusted trees' objects only
            env.update(CCACHE_READONLY="1", CCACHE_TEMPDIR="/tmp")  # noqa: S108 - emptied per run
        elif self.hardened:
            env["CCACHE_UMASK"] = "000"  # shared by the two trusted uids
        return env

    def _views(self, side: SideName, cwd: str | None = None) -> tuple[str, ...]:
        """Hardened: the directories of the side's read-only tree a run may create files in,
        each emptied before and after the run by the runner (`runner_script.View`): CTest's
        `build/Testing` (and its `Temporary`, which configure makes), where `ctest`, even
        `--show-only`, writes `LastTest.log` (a read-only one lists no tests), and a test's own
        working directory inside the tree (spdlog's tests make `test_logs/` there)."""
        if not self.hardened:
            return ()
        tree = PurePosixPath(f"{WORK}/{side}")
        views = [str(tree / "build" / "Testing"), str(tree / "build" / "Testing" / "Temporary")]
        if cwd and tree in PurePosixPath(cwd).parents:
            views.append(cwd)  # the runner checks it again: inside the tree, root's, no symlink
        return tuple(dict.fromkeys(views))

    def _own(self, side: SideName, *, building: bool) -> None:
        """Hardened: the tree private and writable to its uid while it builds, then root's and
        read-only (group-readable by its uid) while it is tested; the ccache read-only for the
        agent."""
        if not self.hardened:
            return
        tree, uid = f"{WORK}/{side}", self.uid(side)
        if building:
            self._root(["mkdir", "-p", f"{WORK}/ccache", f"{tree}/build"])
            self._root(["chown", "-R", f"{uid}:{uid}", tree])
            self._root(["chmod", "0700", tree])
            if side in SIDE_UIDS:
                self._root(["chmod", "-R", "a+rwX", f"{WORK}/ccache"])
            else:
                self._root(["chown", "-R", "0:0", f"{WORK}/ccache"])
                self._root(["chmod", "-R", "go-w,a+rX", f"{WORK}/ccache"])
        else:
            self._root(["chown", "-R", f"0:{uid}", tree])
            self._root(["chmod", "-R", "g-w,g+rX,o-rwx", tree])

    def _step(self, side: SideName, step: str, argv: list[str], timeout: float) -> StepResult:
        res = self._run(
            argv,
            cwd=f"{WORK}/{side}",
            timeout=timeout,
            env=self._build_env(side),
            cpus=self.spec.cpus,
            output_limit=256 * 1024,
            uid=self.uid(side),
            reap=self.hardened,  # a daemon the agent's configure or build starts would outlive it
        )
        log = self.logs / f"{side}-{step}.log"
        log.write_text(res.output)
        cmd = tuple(argv)
        if res.ok:
            return StepResult(step, True, res, log_path=log, argv=cmd)
        walled = res.timed_out or res.memory_exceeded
        missing = diagnose(res.output) if step == "configure" and not walled else None
        # the local backend's classification, the one function: the same failure, the same category
        category = step_category(step, res, missing=missing is not None)
        return StepResult(step, False, res, category, missing, log, argv=cmd)

    def build(self, side: SideName) -> list[StepResult]:
        src, bld = Path(f"{WORK}/{side}/src"), Path(f"{WORK}/{side}/build")
        if self.from_image is not None:  # already built in the image: an incremental no-op build
            return [
                self._step(side, "build", ["cmake", "--build", str(bld), "-j", "1"], self.spec.build_timeout)
            ]
        argv = configure_argv(
            src,
            bld,
            self.spec,
            ninja=True,
            ccache=True,
            options=self._test_options,
            init_cache=side in self._sources and has_init_cache(self._sources[side]),
        )
        self._own(side, building=True)
        steps = [self._step(side, "configure", argv, self.spec.configure_timeout)]
        # CMake stops at the first REQUIRED package it lacks, so each retry may name the next one:
        # retried while a configure names packages not installed yet, at most INSTALL_ROUNDS times,
        # and only before any side has built (a new container starts from the sources again)
        while (new := self._to_install(steps[-1])) and self._rounds < INSTALL_ROUNDS and not self._built:
            self._rounds += 1
            self._recreate_with(new)
            steps.append(self._step(side, "configure", argv, self.spec.configure_timeout))
        if steps[-1].ok:
            self._built = True
            jobs = self.spec.jobs or 2
            steps.append(
                self._step(
                    side, "build", ["cmake", "--build", str(bld), "-j", str(jobs)], self.spec.build_timeout
                )
            )
        self._own(side, building=False)
        return steps

    def _to_install(self, step: StepResult) -> list[str]:
        """The Debian packages a failed configure names that the container does not have yet."""
        if step.ok or step.missing is None:
            return []
        return [p for p in step.missing.debian if p not in self.packages]

    def tree_root(self, side: SideName) -> str:
        return f"{WORK}/{side}"

    def tests_json(self, side: SideName) -> str | None:
        """`ctest --show-only=json-v1` of a side, run as the build user (CTestTestfile.cmake is
        code the tree generated)."""
        res = self._run(  # in the build tree, not --test-dir: that needs CMake 3.20 (bullseye has 3.18)
            ["ctest", "--show-only=json-v1"],
            cwd=f"{WORK}/{side}/build",
            timeout=300,
            output_limit=256 * 1024 * 1024,
            uid=self.uid(side),
            views=self._views(side),
            tree=self.tree_root(side),
            reap=self.hardened,  # TEST_INCLUDE_FILES are code ctest runs while it lists
        )
        return res.output if res.ok else None

    def tests(self, side: SideName) -> list[TestCase]:
        data = self.tests_json(side)
        return parse_ctest_json(data, f"{WORK}/{side}/build") if data is not None else []

    def _hashes(self, side: SideName) -> dict[str, str]:
        req = {
            "op": "hash",
            "root": f"{WORK}/{side}/build",
            "replace": [f"{WORK}/old", f"{WORK}/new"] if side == "old" else ["", ""],
        }
        code, out = self._exec(["python3", RUNNER, json.dumps(req)], user="0")
        if code != 0:
            raise InfraFailure(f"hashing failed in the container: {out[-300:]!r}")
        files: dict[str, str] = json.loads(out)["files"]
        return files

    def binaries_identical(self, tests: list[str]) -> bool:
        return self._hashes("old") == self._hashes("new")

    def run_test(self, side: SideName, test: TestCase, limits: Limits) -> RunResult:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self._home,
            "LC_ALL": "C",
            **self.env_overrides,
            **test.env,
        }
        return self._run(
            test.command,
            cwd=test.cwd,
            timeout=limits.timeout,
            env=env,
            cpu=limits.cpu,
            cpus=limits.cpus,
            instructions=limits.instructions,
            valgrind=limits.valgrind,
            cache_sim=limits.cache_sim,
            uid=self.uid(side),
            reap=True,
            views=self._views(side, test.cwd),
            tree=self.tree_root(side),
        )

    def _probe(self, key: str) -> str | None:
        code, out = self._exec(["python3", RUNNER, json.dumps({"op": "probe"})], user=str(UID))
        try:
            why: str | None = json.loads(out)[key]
        except (ValueError, KeyError):
            return f"probe failed in the container (exit {code})"
        return why

    def instructions_unsupported(self) -> str | None:
        """Why the container cannot count instructions (seccomp, no PMU), or None."""
        return self._probe("instructions_unsupported")

    def valgrind_unsupported(self) -> str | None:
        """Why the container cannot run tests under Valgrind (the env images do not ship it)."""
        why = self._probe("valgrind_unsupported")
        return f"{why} in the env image {self.image} (docker backend)" if why else None

    def toolchain(self) -> dict[str, str]:
        """Compiler and CMake versions inside the container (first line of `--version`)."""
        out: dict[str, str] = {}
        for key, argv in (("compiler", ["c++", "--version"]), ("cmake", ["cmake", "--version"])):
            code, text = self._exec(argv, user=str(UID))
            out[key] = text.decode(errors="replace").splitlines()[0] if code == 0 and text else ""
        return out

    # ------------------------------------------------------------------ images
    def commit(self, image: str, record: dict[str, Any]) -> str:
        """Store the record on /work and commit the instance image: the env image plus a copy of
        /work (a volume, which `docker commit` leaves out), made by a helper container of the env
        image that copies the volume into its own root (`cp -a`: owners and mtimes kept, so a
        reproduce's build is a no-op); the running container's root stays read-only."""
        self.container.put_archive(WORK, tar_bytes({"instance.json": json.dumps(record, indent=1).encode()}))
        repo, _, tag = image.partition(":")
        helper = None
        try:
            helper = self._helper(self.image, f"mkdir -p {WORK} && cp -a {VOL}/. {WORK}/", "ro")
            helper.commit(repository=repo, tag=tag or "latest", changes=['CMD ["sleep", "infinity"]'])
        except InfraFailure:
            raise
        except Exception as exc:  # docker.errors.APIError
            raise InfraFailure(f"cannot commit the instance image {image}: {exc}") from exc
        finally:
            if helper is not None:
                with contextlib.suppress(Exception):
                    helper.remove(force=True)
        return image

    def push(self, image: str, registry: str) -> str:
        """Tag the instance image for `registry` and push it; the remote name."""
        remote = f"{registry}/{image}"
        repo, _, tag = remote.rpartition(":")
        self.client.images.get(image).tag(repo, tag)
        self.client.images.push(repo, tag=tag)
        return remote

    def read_record(self) -> dict[str, Any]:
        code, out = self._exec(["cat", f"{WORK}/instance.json"], user="0")
        if code != 0:
            raise InfraFailure("the image has no /work/instance.json")
        data: dict[str, Any] = json.loads(out)
        return data

    def cleanup(self) -> None:
        """Remove the container, then its /work volume."""
        if self.container is not None:
            with contextlib.suppress(Exception):  # already gone: nothing to clean
                self.container.remove(force=True)
            self.container = None
        if self.volume is not None:
            with contextlib.suppress(Exception):
                self.volume.remove(force=True)
            self.volume = None
