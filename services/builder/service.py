"""The builder stage's plain logic: validate a repository's latest commit, prove one patch."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec

from cppperf.services.builder.instance import PhaseCallback, prove
from cppperf.services.builder.record import build_record
from cppperf.shared.domain import InstanceRecord, Verdict, record_text, to_json_dict
from cppperf.shared.engine.backend import Backend
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.engine.deps import propose_with_llm
from cppperf.shared.engine.limits import limits_for
from cppperf.shared.errors import BadInput, RepoRejected, ServiceUnavailable
from cppperf.shared.files import write_atomic
from cppperf.shared.llm import ChatClient
from cppperf.shared.messages import CommitSelected, PatchBuilt, RepoCandidate, RepoFound, instance_id
from cppperf.shared.mirror import commit_date, rev_parse
from cppperf.shared.settings import BuilderSettings, Settings


def write_instance(out_dir: Path, record: InstanceRecord) -> Path:
    path = out_dir / "instances" / f"{record.cppperf.instance_id}.json"
    return write_atomic(path, record_text(record))


def _commit_image(backend: Backend, settings: BuilderSettings, record: InstanceRecord) -> InstanceRecord:
    """With the docker backend: commit the container as the instance image (and push it); the
    record with its `image`, `installed_packages` and `image_pushed`."""
    from cppperf.shared.engine.images import instance_image_name

    if backend.name != "docker" or not settings.commit_images or record.cppperf.verdict == Verdict.REJECTED:
        return record
    image = instance_image_name(record.metadata.repository_name, record.commit_info.new_sha)
    meta = msgspec.structs.replace(record.cppperf, image=image, installed_packages=list(backend.installed))
    record = msgspec.structs.replace(record, cppperf=meta)
    backend.commit(image, to_json_dict(record))  # the engine writes it as a record file
    if settings.registry:
        meta = msgspec.structs.replace(meta, image_pushed=backend.push(image, settings.registry))
        record = msgspec.structs.replace(record, cppperf=meta)
    return record


def keep_logs(src: Path, dest: Path) -> None:
    """Copy a workspace's logs (with the earlier attempts' folders) next to the instance records
    (workspaces are removed)."""
    if src.is_dir():
        shutil.copytree(src, dest, dirs_exist_ok=True)


@dataclass
class BuiltPatch:
    record: InstanceRecord
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
    backend = make_backend(settings, work_dir / iid, source=(repo_path, commit.sha, commit.date))
    logs_dir = out_dir / "logs" / iid
    try:
        res = prove(
            iid,
            backend,
            settings,
            sides={"old": commit.parent, "new": commit.sha},
            repo_path=repo_path,
            on_phase=on_phase,
            llm_propose=llm_propose,
        )
        work_logs = work_dir / iid / "logs"
        steps = [*res.build_steps, *(st for a in res.attempts for st in a.build_steps)]
        for step in {id(st): st for st in steps}.values():  # point the record at the kept copies
            if step.log:
                log = Path(step.log)
                rel = log.relative_to(work_logs) if work_logs in log.parents else Path(log.name)
                step.log = str(logs_dir / rel)
        record = build_record(commit, res, diff=commit.diff if diff is None else diff, settings=settings)
        record = _commit_image(backend, settings, record)
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
        improved_benchmarks=res.improved_benchmarks,
        regressed_benchmarks=res.regressed_benchmarks,
        failure_category=res.failure_category,
        failure_detail=res.failure_detail[:2000],
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
    try:
        return rev_parse(repo_path, rev)
    except BadInput as exc:
        raise RepoRejected(str(exc)) from exc


class _TestsFail(RepoRejected):
    """The latest commit built but a test failed (the Debug fallback may still save it)."""


def _validate_once(
    backend: Backend, repo_path: Path, sha: str, settings: BuilderSettings
) -> tuple[int, float, float]:
    """(tests, build seconds, test seconds) of one build of `sha`; RepoRejected when it fails."""
    try:
        backend.prepare(repo_path, {"old": sha, "new": sha})
    except BadInput as exc:  # a submodule or FetchContent dependency nobody has
        raise RepoRejected(f"latest commit {sha[:12]} cannot be exported: {exc}") from exc
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
        res = backend.run_test("new", t, limits_for(t, settings))
        if not t.passed(res.returncode, res.output, timed_out=res.timed_out):
            raise _TestsFail(f"latest commit {sha[:12]}: test {t.name} fails: {res.output[-500:]}")
    return len(tests), build_s, time.monotonic() - t0


def validate_latest(
    candidate: RepoCandidate, repo_path: Path, settings: BuilderSettings, *, work_dir: Path
) -> RepoFound:
    """Configure, build and run every test of the latest commit once; all must pass. When a test
    fails in the build type of the settings, once more in `builder.fallback_build_type` (Debug, as
    the paper built), as the builder's proof does; the message says which build type passed."""
    sha = head_sha(repo_path)
    date = commit_date(repo_path, sha)
    backend = make_backend(
        settings, work_dir / f"validate-{candidate.repo.replace('/', '__')}", source=(repo_path, sha, date)
    )
    build_type = settings.effective_build_type()
    try:
        try:
            count, build_s, test_s = _validate_once(backend, repo_path, sha, settings)
        except _TestsFail as first:
            fallback = settings.fallback_build_type
            if not fallback or fallback == build_type:
                raise
            backend.cleanup()
            backend.spec = replace(backend.spec, build_type=fallback)
            try:
                count, build_s, test_s = _validate_once(backend, repo_path, sha, settings)
            except RepoRejected as second:
                raise RepoRejected(f"{first} (in {build_type}); in {fallback} too: {second}") from second
            build_type = fallback
    finally:
        backend.cleanup()
    return RepoFound(
        repo=candidate.repo,
        url=candidate.url,
        default_branch=candidate.default_branch,
        head_sha=sha,
        validated=True,
        test_count=count,
        build_seconds=round(build_s, 2),
        test_seconds=round(test_s, 2),
        build_type=build_type,
    )
