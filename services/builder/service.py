"""The builder stage's plain logic: validate a repository's latest commit, prove one patch."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.builder.backend import Backend, LocalBackend
from services.builder.cmake import BuildSpec
from services.builder.deps import propose_with_llm
from services.builder.instance import PhaseCallback, prove
from services.builder.record import build_record
from services.builder.sandbox import Limits, mount_namespace_available
from shared.errors import ConfigError, InfraFailure, RepoRejected, ServiceUnavailable
from shared.llm import ChatClient
from shared.messages import CommitSelected, PatchBuilt, RepoCandidate, RepoFound, instance_id
from shared.settings import BuilderSettings, Settings


def build_spec(settings: BuilderSettings) -> BuildSpec:
    return BuildSpec(
        build_type=settings.build_type,
        jobs=settings.jobs,
        configure_timeout=settings.configure_timeout,
        build_timeout=settings.build_timeout,
    )


def docker_client(settings: BuilderSettings) -> Any:
    import docker

    try:
        client = (
            docker.DockerClient(base_url=settings.docker_host) if settings.docker_host else docker.from_env()
        )
        client.ping()
    except Exception as exc:  # docker.errors.DockerException: no engine reachable
        raise InfraFailure(
            f"no container engine reachable ({settings.docker_host or 'DOCKER_HOST'}): {exc}"
        ) from exc
    return client


def base_image_for(client: Any, settings: BuilderSettings, commit_date: str, cmakelists: str) -> str:
    from services.builder.images import ERAS, base_name, era_for, image_exists

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


def make_backend(
    settings: BuilderSettings,
    workspace: Path,
    *,
    commit: CommitSelected | None = None,
    repo_path: Path | None = None,
    from_image: str | None = None,
) -> Backend:
    if settings.backend == "local":
        return LocalBackend(
            workspace,
            build_spec(settings),
            dict(settings.thread_env),
            sandbox=settings.sandbox,
            output_limit=settings.output_limit,
            ccache_basedir=settings.ccache_basedir,
            same_path=settings.same_path and mount_namespace_available(),
        )
    if settings.backend == "docker":
        from services.builder.docker_backend import DockerBackend
        from services.builder.images import cmake_texts

        client = docker_client(settings)
        base = ""
        if from_image is None:
            assert commit is not None and repo_path is not None
            texts = cmake_texts(repo_path, commit.sha)
            base = base_image_for(client, settings, commit.date, texts[0] if texts else "")
        cpus = sorted(os.sched_getaffinity(0))
        return DockerBackend(
            client,
            base,
            build_spec(settings),
            dict(settings.thread_env),
            workspace / "logs",
            memory_mb=settings.memory_limit_mb,
            pids=settings.max_processes,
            cpuset=settings.cpuset or str(cpus[-1]),
            output_limit=settings.output_limit,
            from_image=from_image,
            ccache_basedir=settings.ccache_basedir,
        )
    raise ConfigError(f"builder.backend={settings.backend!r}: use 'local' or 'docker'")


def write_instance(out_dir: Path, record: dict[str, Any]) -> Path:
    path = out_dir / "instances" / f"{record['cppperf']['instance_id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return path


def _commit_image(backend: Backend, settings: BuilderSettings, record: dict[str, Any]) -> str | None:
    """With the docker backend: commit the container as the instance image (and push it)."""
    from services.builder.images import instance_image_name

    if backend.name != "docker" or not settings.commit_images or record["cppperf"]["verdict"] == "rejected":
        return None
    image = instance_image_name(record["metadata"]["repository_name"], record["commit_info"]["new_sha"])
    record["cppperf"]["image"] = image
    record["cppperf"]["installed_packages"] = list(getattr(backend, "installed", []))
    backend.commit(image, record)
    if settings.registry:
        client = backend.client  # type: ignore[attr-defined]
        remote = f"{settings.registry}/{image}"
        repo, _, tag = remote.rpartition(":")
        client.images.get(image).tag(repo, tag)
        client.images.push(repo, tag=tag)
        record["cppperf"]["image_pushed"] = remote
    return image


def keep_logs(src: Path, dest: Path) -> None:
    """Copy a workspace's logs next to the instance records (workspaces are removed)."""
    if src.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, dest / f.name)


@dataclass
class BuiltPatch:
    record: dict[str, Any]
    message: PatchBuilt
    path: Path


def build_patch(
    commit: CommitSelected,
    repo_path: Path,
    settings: BuilderSettings,
    *,
    work_dir: Path,
    out_dir: Path,
    diff: str | None = None,
    on_phase: PhaseCallback | None = None,
    llm_propose: Callable[[str], list[str]] | None = None,
) -> BuiltPatch:
    iid = instance_id(commit.repo, commit.sha)
    backend = make_backend(settings, work_dir / iid, commit=commit, repo_path=repo_path)
    logs_dir = out_dir / "logs" / iid
    try:
        res = prove(commit, repo_path, backend, settings, on_phase=on_phase, llm_propose=llm_propose)
        for step in res.build_steps:  # point the record at the kept copies
            if step.get("log"):
                step["log"] = str(logs_dir / Path(step["log"]).name)
        record = build_record(commit, res, diff=commit.diff if diff is None else diff, settings=settings)
        _commit_image(backend, settings, record)
    finally:
        keep_logs(work_dir / iid / "logs", logs_dir)
        if not settings.keep:
            backend.cleanup()
    path = write_instance(out_dir, record)
    msg = PatchBuilt(
        instance_id=iid,
        repo=commit.repo,
        sha=commit.sha,
        parent=commit.parent,
        verdict=res.verdict,
        improved_tests=res.improved_tests,
        regressed_tests=res.regressed_tests,
        failure_category=res.failure_category,
        failure_detail=res.failure_detail[:2000],
        record_path=str(path),
    )
    return BuiltPatch(record, msg, path)


def llm_dependency_proposer(settings: Settings) -> Callable[[str], list[str]] | None:
    """A synchronous proposer backed by the classifier's OpenAI-compatible endpoint, or None when
    `builder.llm_deps` is off. Runs its own short event loop (the builder works in a thread)."""
    if not settings.builder.llm_deps:
        return None
    c = settings.classifier

    def propose(log: str) -> list[str]:
        async def main() -> list[str]:
            client = ChatClient(
                c.base_urls[0], api_key=c.api_key, timeout=c.timeout, retries=c.retries, seed=c.seed
            )
            try:
                return await propose_with_llm(
                    log,
                    lambda prompt: client.complete(
                        c.models[-1], "You are a Debian packaging expert.", prompt
                    ),
                    attempts=settings.builder.llm_deps_attempts,
                )
            finally:
                await client.close()

        try:
            return asyncio.run(main())
        except ServiceUnavailable:
            return []  # the fallback is optional: no model, no proposal

    return propose


def head_sha(repo_path: Path, rev: str = "HEAD") -> str:
    out = subprocess.run(
        ["git", "-C", str(repo_path), "rev-parse", rev], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RepoRejected(f"{repo_path}: cannot resolve {rev}: {out.stderr.strip()}")
    return out.stdout.strip()


def validate_latest(
    candidate: RepoCandidate, repo_path: Path, settings: BuilderSettings, *, work_dir: Path
) -> RepoFound:
    """Configure, build and run every test of the latest commit once; all must pass."""
    sha = head_sha(repo_path)
    date = subprocess.run(
        ["git", "-C", str(repo_path), "log", "-1", "--format=%cI", sha],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    head = CommitSelected(repo=candidate.repo, url=candidate.url, sha=sha, parent=sha, date=date, message="")
    backend = make_backend(
        settings, work_dir / f"validate-{candidate.repo.replace('/', '__')}", commit=head, repo_path=repo_path
    )
    try:
        backend.prepare(repo_path, {"old": sha, "new": sha})
        t0 = time.monotonic()
        steps = backend.build("new")
        build_s = time.monotonic() - t0
        if not steps[-1].ok:
            last = steps[-1]
            detail = last.missing.describe() if last.missing else last.result.output[-800:]
            raise RepoRejected(f"latest commit {sha[:12]} does not build ({last.category}): {detail}")
        tests = [t for t in backend.tests("new") if not t.disabled]
        if not tests:
            raise RepoRejected(f"latest commit {sha[:12]} defines no CTest tests")
        t0 = time.monotonic()
        for t in tests:
            res = backend.run_test(
                "new",
                t,
                Limits(timeout=t.timeout or settings.test_timeout, memory_mb=settings.memory_limit_mb),
            )
            if not t.passed(res.returncode, res.output, timed_out=res.timed_out):
                raise RepoRejected(f"latest commit {sha[:12]}: test {t.name} fails: {res.output[-500:]}")
        test_s = time.monotonic() - t0
    finally:
        backend.cleanup()
    return RepoFound(
        repo=candidate.repo,
        url=candidate.url,
        default_branch=candidate.default_branch,
        head_sha=sha,
        validated=True,
        test_count=len(tests),
        build_seconds=round(build_s, 2),
        test_seconds=round(test_s, 2),
    )
