"""The docker backend: builds and test runs in a container (docker SDK against `DOCKER_HOST`;
podman's Docker-compatible API works too).

One container per instance, from the env image of the commit's era: `network_mode=none`, memory
and pids limits, on the host's build and timing cores (`cpuset_cpus`; builds run on the build cores, each timed
run on its leased core), removed in `cleanup()`. Sources go in with
`put_archive` (git archive), into the same-shaped trees the local backend uses (`/work/old`,
`/work/new`); every command runs through `/opt/cppperf/runner.py` as uid 1000, which times the
test inside the container. A configure that fails for missing Debian packages is retried once in
an env image with those packages. `commit()` turns the finished container into the instance
image `cppperf/<owner>__<name>:<sha12>` with both trees built and the record at
`/work/instance.json`; `from_image` reproduces an instance from that image alone.

Security: every container drops all capabilities but the few the root-side setup needs (chown of
the trees, the runner's switch to the build uid, cleaning temp dirs); `no-new-privileges`; no
network; memory and pids limits. Configure, build, test discovery and tests run as a uid ≠ 0
with no capabilities. `hardened=True` (the evaluator, agents' code): each tree has its own uid
(`SIDE_UIDS`) and is private to it (0700) while it builds, then root's and read-only (group
read for its uid) while its tests run; the ccache is read-only for the agent's build; `/tmp`,
`/var/tmp` and `/dev/shm` are emptied before every run and HOME is /tmp. The root filesystem
stays writable for root (sources and the runner go in with put_archive, instance images are
committed from it): the jailed uids can write nothing outside their tree and the emptied temp
dirs.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from cppperf.shared.domain import FailureCategory
from cppperf.shared.engine.backend import SideName, Sides, tar_tree
from cppperf.shared.engine.cmake import (
    BuildSpec,
    StepResult,
    TestCase,
    configure_argv,
    parse_ctest_json,
    test_options_from_text,
)
from cppperf.shared.engine.deps import diagnose
from cppperf.shared.engine.fetchcontent import has_init_cache
from cppperf.shared.engine.images import cmake_texts, ensure_env_image, git_archive, tar_bytes
from cppperf.shared.engine.sandbox import Limits, RunResult
from cppperf.shared.engine.submodules import Sources
from cppperf.shared.errors import InfraFailure

RUNNER = "/opt/cppperf/runner.py"
WORK = "/work"
UID = 1000
HOME = "/work/home"  # a home inside the per-instance tree, never a shared temp dir
SIDE_UIDS = {"old": 1001, "expert": 1002, "new": 1001}  # hardened: every other side (agent) is UID
# root in the container may only set up: chown trees, switch to the build uid, clean temp dirs
CAPS = ["CHOWN", "SETUID", "SETGID", "FOWNER", "DAC_OVERRIDE"]


def runner_source() -> bytes:
    return resources.files("cppperf.shared.engine").joinpath("runner_script.py").read_bytes()


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
    name: str = "docker"
    container: Any = None
    installed: list[str] = field(default_factory=list)
    _sources: dict[SideName, bytes] = field(default_factory=dict)
    _test_options: list[str] = field(default_factory=lambda: ["-DBUILD_TESTING=ON"])

    # ------------------------------------------------------------------ container
    def _start(self, image: str) -> None:
        kwargs: dict[str, Any] = {
            "detach": True,
            "network_mode": "none",
            "mem_limit": f"{self.memory_mb}m",
            "pids_limit": self.pids,
            "cap_drop": ["ALL"],
            "cap_add": CAPS,
            "security_opt": ["no-new-privileges"],
            "working_dir": WORK,
            "command": ["sleep", "infinity"],
        }
        if self.cpuset:
            kwargs["cpuset_cpus"] = self.cpuset
        try:
            self.container = self.client.containers.run(image, **kwargs)
        except Exception as exc:  # docker.errors.APIError / ImageNotFound
            raise InfraFailure(f"cannot start a container from {image}: {exc}") from exc

    def _root(self, argv: list[str]) -> None:
        code, out = self.container.exec_run(argv, user="0")
        if code != 0:
            raise InfraFailure(
                f"{' '.join(argv)} failed in the container: {out.decode(errors='replace')[-500:]}"
            )

    def _load_sources(self) -> None:
        dirs = [f"{WORK}/{side}/src" for side in self._sources] or [f"{WORK}/old/src", f"{WORK}/new/src"]
        self._root(["mkdir", "-p", *dirs, HOME, "/opt/cppperf"])
        self.container.put_archive("/opt/cppperf", tar_bytes({"runner.py": runner_source()}, mode=0o755))
        for side, data in self._sources.items():
            self.container.put_archive(f"{WORK}/{side}/src", data)
        self._root(["chown", "-R", f"{UID}:{UID}", WORK])

    def prepare(self, repo_path: Path, sides: Sides) -> None:
        """Start the container and load every side: a commit by `git archive`, a host tree as tar.
        CMake test options come from the last side given as a commit (`new`, or the expert's)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.from_image is not None:
            self._start(self.from_image)
            return
        self._sources = {
            side: tar_tree(src) if isinstance(src, Path) else git_archive(repo_path, src, self.submodules)
            for side, src in sides.items()
        }
        options_from = next((s for s in reversed(list(sides.values())) if isinstance(s, str)), None)
        if options_from is not None:
            self._test_options = test_options_from_text(cmake_texts(repo_path, options_from))
        self._start(ensure_env_image(self.client, self.base_image, self.packages))
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
    ) -> RunResult:
        req = {
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
        }
        code, out = self.container.exec_run(["python3", RUNNER, json.dumps(req)], user="0")
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
        )
        log = self.logs / f"{side}-{step}.log"
        log.write_text(res.output)
        cmd = tuple(argv)
        if res.ok:
            return StepResult(step, True, res, log_path=log, argv=cmd)
        if res.timed_out:
            return StepResult(step, False, res, FailureCategory.TIMEOUT, log_path=log, argv=cmd)
        if step == "configure":
            missing = diagnose(res.output)
            return StepResult(
                step,
                False,
                res,
                FailureCategory.DEPENDENCY if missing else FailureCategory.CONFIGURE,
                missing,
                log,
                argv=cmd,
            )
        if res.returncode in (-9, 137):
            return StepResult(step, False, res, FailureCategory.RESOURCE_LIMIT, log_path=log, argv=cmd)
        return StepResult(step, False, res, FailureCategory.COMPILE, log_path=log, argv=cmd)

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
        last = steps[-1]
        if not last.ok and last.missing is not None and last.missing.debian and not self.installed:
            self._recreate_with(last.missing.debian)  # one retry with the packages installed
            steps.append(self._step(side, "configure", argv, self.spec.configure_timeout))
        if steps[-1].ok:
            jobs = self.spec.jobs or 2
            steps.append(
                self._step(
                    side, "build", ["cmake", "--build", str(bld), "-j", str(jobs)], self.spec.build_timeout
                )
            )
        self._own(side, building=False)
        return steps

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
        code, out = self.container.exec_run(["python3", RUNNER, json.dumps(req)], user="0")
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
            uid=self.uid(side),
        )

    def instructions_unsupported(self) -> str | None:
        """Why the container cannot count instructions (seccomp, no PMU), or None."""
        code, out = self.container.exec_run(["python3", RUNNER, json.dumps({"op": "probe"})], user=str(UID))
        try:
            why: str | None = json.loads(out)["instructions_unsupported"]
        except (ValueError, KeyError):
            return f"probe failed in the container (exit {code})"
        return why

    def toolchain(self) -> dict[str, str]:
        """Compiler and CMake versions inside the container (first line of `--version`)."""
        out: dict[str, str] = {}
        for key, argv in (("compiler", ["c++", "--version"]), ("cmake", ["cmake", "--version"])):
            code, text = self.container.exec_run(argv, user=str(UID))
            out[key] = text.decode(errors="replace").splitlines()[0] if code == 0 and text else ""
        return out

    # ------------------------------------------------------------------ images
    def commit(self, image: str, record: dict[str, Any]) -> str:
        """Store the record in the container and commit it as the instance image."""
        self.container.put_archive(WORK, tar_bytes({"instance.json": json.dumps(record, indent=1).encode()}))
        repo, _, tag = image.partition(":")
        self.container.commit(repository=repo, tag=tag or "latest")
        return image

    def push(self, image: str, registry: str) -> str:
        """Tag the instance image for `registry` and push it; the remote name."""
        remote = f"{registry}/{image}"
        repo, _, tag = remote.rpartition(":")
        self.client.images.get(image).tag(repo, tag)
        self.client.images.push(repo, tag=tag)
        return remote

    def read_record(self) -> dict[str, Any]:
        code, out = self.container.exec_run(["cat", f"{WORK}/instance.json"], user="0")
        if code != 0:
            raise InfraFailure("the image has no /work/instance.json")
        data: dict[str, Any] = json.loads(out)
        return data

    def cleanup(self) -> None:
        if self.container is not None:
            with contextlib.suppress(Exception):  # already gone: nothing to clean
                self.container.remove(force=True)
            self.container = None
