"""What the evaluator needs from an instance record (ours, or an imported CppPerf-DB file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from msgspec import UNSET

from cppperf.shared.domain import InstanceRecord, decode_record
from cppperf.shared.errors import BadInput
from cppperf.shared.messages import check_instance_id, instance_id


@dataclass(frozen=True)
class EvalInstance:
    instance_id: str
    repo: str
    url: str
    base_sha: str
    expert_sha: str
    expert_patch: str
    improved_tests: list[str] = field(default_factory=list)
    # the tests that run the expert's change (`cppperf.coverage.deciding`, when coverage decided)
    deciding_tests: list[str] = field(default_factory=list)
    improved_benchmarks: list[str] = field(default_factory=list)  # `bench:` workloads that proved it
    # tests the builder's exact metric could not count (`cppperf.left_out`): never counted here
    left_out: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    date: str = ""
    metric: str = ""  # the metric the builder proved it on (`cppperf.metric`; "" for an imported record)
    # gold validation's verdict on it (`cppperf.oracle`): "" until validated, `none` when it cannot
    # grade (the expert's patch is not opt, or a comment-only patch is)
    oracle: str = ""
    # the builder's verdict on it (`cppperf.verdict`: improved, not-improved, …); "" when unknown
    verdict: str = ""

    @property
    def multi_file(self) -> bool:
        return len(self.files) > 1


def from_record(rec: InstanceRecord) -> EvalInstance:
    """The evaluator's view of a record."""
    ci, meta, ours = rec.commit_info, rec.metadata, rec.cppperf
    repo = meta.repository_name
    cov = ours.coverage
    return EvalInstance(
        instance_id=ours.instance_id or instance_id(repo, ci.new_sha),
        repo=repo,
        url=meta.repository or f"https://github.com/{repo}.git",
        base_sha=ci.old_sha,
        expert_sha=ci.new_sha,
        expert_patch="".join(ci.patch or []),
        improved_tests=list(rec.tests.significant_improvements_tests or []),
        deciding_tests=list(cov.deciding) if cov is not UNSET and cov.used else [],
        improved_benchmarks=list(ours.improved_benchmarks),
        left_out=sorted(ours.left_out),
        files=[f.filename for f in ci.files_changed],
        date=ci.commit_date or "",
        metric=ours.metric or "",
        oracle="" if ours.oracle is UNSET or ours.oracle is None else str(ours.oracle),
        verdict=str(ours.verdict),
    )


def load_instance(instance_id: str, out_dir: Path) -> EvalInstance:
    path = out_dir / "instances" / f"{check_instance_id(instance_id)}.json"
    if not path.is_file():
        raise BadInput(f"unknown instance {instance_id!r} (no {path})")
    try:
        return from_record(decode_record(path.read_text()))
    except OSError as exc:
        raise BadInput(f"instance record {path} is unreadable: {exc.strerror or exc}") from exc
    except ValueError as exc:  # not UTF-8, not JSON, or not an instance record (msgspec.ValidationError)
        raise BadInput(f"instance record {path} is unreadable: {exc}") from exc
