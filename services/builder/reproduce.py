"""Reproduce an instance from its image alone: read the record inside the image, run the timing
protocol on the trees built in it, compare the verdict with the recorded one (decided on the
recorded coverage's family when the record has one: the image holds no coverage build)."""

from __future__ import annotations

from pathlib import Path

import msgspec
from msgspec import UNSET

from cppperf.services.builder.instance import PhaseCallback, prove
from cppperf.shared.domain import Verdict, decode_record
from cppperf.shared.engine.backends import make_backend
from cppperf.shared.errors import InfraFailure
from cppperf.shared.settings import BuilderSettings


class Reproduction(msgspec.Struct, kw_only=True, frozen=True):
    """`cppperf reproduce`: the recorded verdict beside the one reproduced from the image."""

    image: str
    recorded_verdict: Verdict
    verdict: Verdict
    same_verdict: bool
    improved_tests: list[str]
    recorded_improved_tests: list[str]
    failure: str


def reproduce_image(
    image: str, settings: BuilderSettings, *, work_dir: Path, on_phase: PhaseCallback | None = None
) -> Reproduction:
    settings = msgspec.structs.replace(settings, fallback_build_type="")  # the image holds one build
    backend = make_backend(settings, work_dir / "reproduce", from_image=image)
    try:
        backend.prepare(Path("/nonexistent"), {})  # the image holds both trees, built
        try:
            record = decode_record(backend.read_record())
        except msgspec.ValidationError as exc:
            raise InfraFailure(f"the record in {image} is not an instance record: {exc}") from exc
        cov = record.cppperf.coverage  # the family that decided it decides again
        res = prove(
            record.cppperf.instance_id,
            backend,
            settings,
            sides=None,
            on_phase=on_phase,
            coverage=None if cov is UNSET else cov,
        )
    finally:
        backend.cleanup()
    recorded: Verdict = record.cppperf.verdict
    return Reproduction(
        image=image,
        recorded_verdict=recorded,
        verdict=res.verdict,
        same_verdict=recorded == res.verdict,
        improved_tests=res.improved_tests,
        recorded_improved_tests=list(record.tests.significant_improvements_tests or []),
        failure=res.failure_detail,
    )
