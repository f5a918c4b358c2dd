"""Reproduce an instance from its image alone: read the record inside the image, run the timing
protocol on the trees built in it, compare the verdict with the recorded one (decided on the
recorded coverage's family when the record has one: the image holds no coverage build)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from cppperf.services.builder.instance import PhaseCallback, prove
from cppperf.shared.domain import Coverage, to_struct
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
        cov_rec = record["cppperf"].get("coverage")  # the family that decided it decides again
        coverage = to_struct(cov_rec, Coverage) if cov_rec else None
        res = prove(
            record["cppperf"]["instance_id"],
            backend,
            settings,
            sides=None,
            on_phase=on_phase,
            coverage=coverage,
        )
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
