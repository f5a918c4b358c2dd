"""Reproduce an instance from its image alone: read the record inside the image, run the timing
protocol on the trees built in it, compare the verdict with the recorded one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from cppperf.services.builder.instance import PhaseCallback, prove
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.settings import BuilderSettings


def reproduce_image(
    image: str, settings: BuilderSettings, *, work_dir: Path, on_phase: PhaseCallback | None = None
) -> dict[str, Any]:
    settings = msgspec.structs.replace(settings, fallback_build_type="")  # the image holds one build
    backend = make_backend(settings, work_dir / "reproduce", from_image=image)
    try:
        backend.prepare(Path("/nonexistent"), {})  # the image holds both trees, built
        record = backend.read_record()
        res = prove(record["cppperf"]["instance_id"], backend, settings, sides=None, on_phase=on_phase)
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
