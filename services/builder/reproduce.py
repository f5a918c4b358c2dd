"""Reproduce an instance from its image alone: read the record inside the image, run the timing
protocol on the trees built in it, compare the verdict with the recorded one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from cppperf.services.builder.instance import PhaseCallback, prove
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.messages import CommitSelected, FileChange
from cppperf.shared.settings import BuilderSettings


def reproduce_image(
    image: str, settings: BuilderSettings, *, work_dir: Path, on_phase: PhaseCallback | None = None
) -> dict[str, Any]:
    settings = msgspec.structs.replace(settings, fallback_build_type="")  # the image holds one build
    backend: Any = make_backend(settings, work_dir / "reproduce", from_image=image)
    try:
        backend.prepare(Path("/nonexistent"), {})
        record = backend.read_record()
        ci = record["commit_info"]
        commit = CommitSelected(
            repo=record["metadata"]["repository_name"],
            url=record["metadata"]["repository"],
            sha=ci["new_sha"],
            parent=ci["old_sha"],
            date=ci["commit_date"],
            message="\n".join(ci["commit_message"]),
            files=[FileChange(path=f["filename"]) for f in ci["files_changed"]],
        )
        res = prove(commit, Path("/nonexistent"), _Prepared(backend), settings, on_phase=on_phase)
    finally:
        backend.cleanup()
    recorded = record["cppperf"]["verdict"]
    return {
        "image": image,
        "recorded_verdict": recorded,
        "verdict": res.verdict,
        "same_verdict": recorded == res.verdict,
        "improved_tests": res.improved_tests,
        "recorded_improved_tests": record["tests"].get("significant_improvements_tests", []),
        "failure": res.failure_detail,
    }


class _Prepared:
    """The backend with `prepare` done already (the container runs the image)."""

    def __init__(self, backend: Any) -> None:
        self._b = backend
        self.name = backend.name

    def __getattr__(self, item: str) -> Any:
        return getattr(self._b, item)

    def prepare(self, repo_path: Path, shas: dict[str, str]) -> None:
        return None
