"""What the evaluator needs from an instance record (ours or an imported CppPerf-DB file)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cppperf.shared.errors import BadInput
from cppperf.shared.messages import instance_id


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
    files: list[str] = field(default_factory=list)
    date: str = ""
    metric: str = ""  # the metric the builder proved it on (`cppperf.metric`; "" for an imported record)
    # gold validation's verdict on it (`cppperf.oracle`): "" until validated, `none` when it cannot
    # grade (the expert's patch is not opt, or a comment-only patch is)
    oracle: str = ""

    @property
    def multi_file(self) -> bool:
        return len(self.files) > 1


def from_record(record: dict[str, Any]) -> EvalInstance:
    ci = record["commit_info"]
    meta = record["metadata"]
    ours = record.get("cppperf") or {}
    repo = meta.get("repository_name") or ""
    iid = ours.get("instance_id") or instance_id(repo, ci["new_sha"])
    return EvalInstance(
        instance_id=iid,
        repo=repo,
        url=meta.get("repository") or f"https://github.com/{repo}.git",
        base_sha=ci["old_sha"],
        expert_sha=ci["new_sha"],
        expert_patch="".join(ci.get("patch") or []),
        improved_tests=list((record.get("tests") or {}).get("significant_improvements_tests") or []),
        deciding_tests=_deciding(ours.get("coverage")),
        improved_benchmarks=[str(n) for n in ours.get("improved_benchmarks") or []],
        files=[f.get("filename", "") for f in ci.get("files_changed") or []],
        date=str(ci.get("commit_date") or ""),
        metric=str(ours.get("metric") or ""),
        oracle=str(ours.get("oracle") or ""),
    )


def _deciding(coverage: object) -> list[str]:
    if not isinstance(coverage, dict) or not coverage.get("used"):
        return []
    return [str(n) for n in coverage.get("deciding") or []]


def load_instance(instance_id: str, out_dir: Path) -> EvalInstance:
    path = out_dir / "instances" / f"{instance_id}.json"
    if not path.is_file():
        raise BadInput(f"unknown instance {instance_id!r} (no {path})")
    try:
        return from_record(json.loads(path.read_text()))
    except (KeyError, ValueError) as exc:
        raise BadInput(f"instance record {path} is unreadable: {exc}") from exc
