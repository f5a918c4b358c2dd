"""Make a backend from settings: the local one, or the docker one on the image of a commit's era.

`source` is `(repo_path, sha, commit_date)`: the docker backend picks its base image from the
commit's date and CMake minimum; `from_image` reuses an instance image instead (reproduce).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from cppperf.shared.engine.backend import Backend, LocalBackend
from cppperf.shared.engine.cgroups import missing_caps
from cppperf.shared.engine.cmake import BuildSpec
from cppperf.shared.engine.leases import core_plan
from cppperf.shared.engine.sandbox import jail_problem, mount_namespace_available
from cppperf.shared.engine.submodules import Sources
from cppperf.shared.errors import ConfigError, InfraFailure
from cppperf.shared.logging import get_logger
from cppperf.shared.settings import BuilderSettings, default_mirror_dir

log = get_logger(__name__)


def build_spec(settings: BuilderSettings) -> BuildSpec:
    """Build type from the profile; builds on the build cores (never on a timing core)."""
    return BuildSpec(
        build_type=settings.effective_build_type(),
        jobs=settings.jobs,
        configure_timeout=settings.configure_timeout,
        build_timeout=settings.build_timeout,
        memory_mb=settings.memory_limit_mb,
        processes=settings.max_processes,
        cpus=core_plan(settings).build if settings.pin_cpu else (),
        benchmarks=settings.benchmarks,
    )


def submodule_sources(settings: BuilderSettings) -> Sources:
    cache = Path(settings.submodule_cache) if settings.submodule_cache else default_mirror_dir()
    return Sources(mirrors=dict(settings.submodule_mirrors), cache_dir=cache, fetch=settings.submodule_fetch)


def docker_client(settings: BuilderSettings) -> Any:
    import docker

    try:
        client = (
            docker.DockerClient(base_url=settings.docker_host) if settings.docker_host else docker.from_env()
        )
        client.ping()
    except Exception as exc:  # docker.errors.DockerException: no engine reachable
        raise InfraFailure(
            f"no container engine reachable ({settings.docker_host or 'DOCKER_HOST'}): {os_reason(exc)}"
        ) from exc
    return client


def os_reason(exc: BaseException) -> str:
    """The operating system's words under a library's wrapped error (docker → requests → urllib3
    wrap a FileNotFoundError into a tuple repr): `No such file or directory`, else str(exc)."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
        todo += [a for a in (e.__cause__, e.__context__, *e.args) if isinstance(a, BaseException)]
    return str(exc)


def base_image_for(client: Any, settings: BuilderSettings, commit_date: str, cmakelists: str) -> str:
    from cppperf.shared.engine.images import ERAS, base_name, era_for, image_exists

    if settings.base_release:
        release = settings.base_release
    else:
        available = [e.release for e in ERAS if image_exists(client, base_name(e.release))]
        if not available:
            raise InfraFailure("no base image: run `cppperf images bootstrap --release bookworm` first")
        release = era_for(commit_date, cmakelists, available=available).release
    name = base_name(release)
    if not image_exists(client, name):
        raise InfraFailure(f"base image {name} missing: run `cppperf images bootstrap --release {release}`")
    return name


@functools.cache
def _warn_caps_once() -> None:
    if missing := missing_caps():
        log.warning(
            "no delegated cgroup for these caps: they hold per process only (RLIMIT_AS / RLIMIT_NPROC)",
            caps=missing,
            see="README, Security model: what a machine needs",
        )


def make_backend(
    settings: BuilderSettings,
    workspace: Path,
    *,
    source: tuple[Path, str, str] | None = None,
    from_image: str | None = None,
    sandbox: bool | None = None,
    untrusted: bool = False,
) -> Backend:
    """`sandbox` overrides `builder.sandbox` for the local backend (the evaluator always sandboxes
    agents' code; containers are isolated anyway). `untrusted=True` (agents' patches): sandboxed,
    and hardened by `harden` — which raises rather than hand back a backend it cannot harden."""
    backend = _make_backend(
        settings, workspace, source=source, from_image=from_image, sandbox=True if untrusted else sandbox
    )
    if untrusted:
        harden(backend)
    return backend


def harden(backend: Backend) -> None:
    """Agents' code: local — each tree read-only in its jail while its tests run, the agent's
    build only reads the trusted ccache; docker — a uid per tree, read-only trees while tested.
    Any other backend cannot be hardened: `InfraFailure`, never a silent unhardened run."""
    if isinstance(backend, LocalBackend):
        backend.readonly_tests = True
        backend.readonly_ccache = frozenset({"agent"})
        return
    from cppperf.shared.engine.docker_backend import DockerBackend  # the docker SDK: only if needed

    if isinstance(backend, DockerBackend):
        backend.hardened = True
    else:
        raise InfraFailure(f"cannot harden a {type(backend).__name__} for agents' code: refusing to run it")


def _make_backend(
    settings: BuilderSettings,
    workspace: Path,
    *,
    source: tuple[Path, str, str] | None,
    from_image: str | None,
    sandbox: bool | None,
) -> Backend:
    if settings.backend == "local":
        # the builder mines repositories it chose: jailed when bubblewrap works, else (logged) the
        # older isolation, network namespace and rlimits only; the evaluator refuses instead
        sandboxed = settings.sandbox if sandbox is None else sandbox
        why_not = jail_problem() if sandboxed else "builder.sandbox=false"
        if why_not:
            log.warning("builds and tests run without the bubblewrap jail", reason=why_not)
        _warn_caps_once()
        return LocalBackend(
            workspace,
            build_spec(settings),
            dict(settings.thread_env),
            sandbox=sandboxed,
            output_limit=settings.output_limit,
            ccache_basedir=settings.ccache_basedir,
            same_path=not why_not or (settings.same_path and mount_namespace_available()),
            jailed=not why_not,
            submodules=submodule_sources(settings),
        )
    if settings.backend == "docker":
        from cppperf.shared.engine.docker_backend import DockerBackend
        from cppperf.shared.engine.images import cmake_texts

        client = docker_client(settings)
        base = ""
        if from_image is None:
            if source is None:
                raise ConfigError("the docker backend needs the source (repo, sha, date) or an image")
            repo_path, sha, date = source
            texts = cmake_texts(repo_path, sha)
            base = base_image_for(client, settings, date, texts[0] if texts else "")
        return DockerBackend(
            client,
            base,
            build_spec(settings),
            dict(settings.thread_env),
            workspace / "logs",
            memory_mb=settings.memory_limit_mb,
            pids=settings.max_processes,
            # build cores and timing cores: builds run on the first, each timed run on its lease
            cpuset=settings.cpuset or core_plan(settings).cpuset(),
            output_limit=settings.output_limit,
            from_image=from_image,
            ccache_basedir=settings.ccache_basedir,
            submodules=submodule_sources(settings),
        )
    raise ConfigError(f"builder.backend={settings.backend!r}: use 'local' or 'docker'")
