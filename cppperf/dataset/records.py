"""Instance records on disk (`<out>/instances/<id>.json`): import the published CppPerf-DB files
unchanged, export them again (round trip), export a SWE-bench-like JSONL, and filter.

A record is the published JSON plus our `cppperf` section. For an imported file that section says
where it came from (`imported_from`) and derives the verdict from the published fields, so the
published keys stay byte-for-byte what they were and `export --format cppperf-db` writes them back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from cppperf.shared.domain import DecisionRule, StatsRecord, Verdict
from cppperf.shared.engine.images import instance_image_name
from cppperf.shared.files import write_atomic
from cppperf.shared.messages import instance_id as make_instance_id

REQUIRED = (
    ("metadata", "repository_name"),
    ("commit_info", "old_sha"),
    ("commit_info", "new_sha"),
    ("commit_info", "files_changed"),
    ("tests", "tests"),
)


class RecordError(ValueError):
    pass


def validate_published(data: Any) -> None:
    if not isinstance(data, dict):
        raise RecordError("not a JSON object")
    for section, key in REQUIRED:
        if not isinstance(data.get(section), dict) or key not in data[section]:
            raise RecordError(f"missing {section}.{key}")


def is_significant(record: dict[str, Any]) -> bool:
    ours = record.get("cppperf") or {}
    if ours.get("verdict"):
        return bool(ours["verdict"] == Verdict.IMPROVED)
    return int((record.get("tests") or {}).get("significant_improvements") or 0) > 0


IMPORT_RESAMPLES = 1000  # the 95 % percentile CI of tests whose decision needs it
IMPORT_SEED = 0
IMPORT_STATISTICS = f"mwu-bh-hl-bootstrap{IMPORT_RESAMPLES}-seed{IMPORT_SEED}"  # recompute when it changes


def recompute_tests(published: dict[str, Any]) -> list[StatsRecord]:
    """Our statistics (MWU both ways, BH, Hodges-Lehmann ratio) from the published per-test raw
    times, with the published thresholds. The bootstrap CI is computed for the tests whose
    decision depends on it (adjusted p and median change both qualify); the others keep an
    unknown CI, which never excludes 1."""
    from cppperf.shared.engine.stats import compare_batch, compare_test, decide

    raw = published.get("raw_timing_data") or {}
    alpha = float(raw.get("min_p_value") or 0.05)
    threshold = float(raw.get("min_exec_time_improvement") or 0.05)
    by_name = {
        str(t["test_name"]): (t["old_times"], t["new_times"])
        for t in (published.get("tests") or {}).get("tests") or []
        if isinstance(t, dict) and len(t.get("old_times") or []) >= 2 and len(t.get("new_times") or []) >= 2
    }
    samples = [(name, *by_name[name]) for name in sorted(by_name)]
    first = decide(compare_batch(by_name), alpha=alpha, min_improvement=threshold)
    stats = [
        compare_test(n, o, w, resamples=IMPORT_RESAMPLES, seed=IMPORT_SEED + i)
        if (t.p_improve_adj < alpha and t.median_change >= threshold)
        or (t.p_regress_adj < alpha and t.median_change <= -threshold)
        else t
        for i, ((n, o, w), t) in enumerate(zip(samples, first, strict=True))
    ]
    return decide(stats, alpha=alpha, min_improvement=threshold)


def to_record(published: dict[str, Any], source: str) -> dict[str, Any]:
    """The published file plus our section, whose verdicts are recomputed from the raw timings
    (so `improved` never stands beside significant regressions); the published counts stay as
    they were in the published fields."""
    validate_published(published)
    ci = published["commit_info"]
    repo = published["metadata"]["repository_name"]
    from cppperf.shared.engine.stats import verdict  # scipy: imported when a record is

    tests = recompute_tests(published)  # an empty list: not-improved under every rule
    return {
        **published,
        "cppperf": {
            "record_version": 1,
            "instance_id": make_instance_id(repo, ci["new_sha"]),
            "imported_from": source,
            "statistics": IMPORT_STATISTICS,
            "verdict": verdict(tests, rule=DecisionRule.OURS),
            "verdict_paper_rule": verdict(tests, rule=DecisionRule.PAPER),
            "improved_tests": [t.name for t in tests if t.improved],
            "regressed_tests": [t.name for t in tests if t.regressed],
            "tests": [msgspec.to_builtins(t) for t in tests],
            "failure_category": None,
            "builder": "cppperf-db",
        },
    }


def to_published(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "cppperf"}


def instance_path(out_dir: Path, iid: str) -> Path:
    return out_dir / "instances" / f"{iid}.json"


def write_record(out_dir: Path, record: dict[str, Any]) -> Path:
    return write_atomic(
        instance_path(out_dir, record["cppperf"]["instance_id"]), json.dumps(record, indent=1)
    )


@dataclass
class ImportReport:
    imported: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def import_files(
    paths: list[Path], out_dir: Path, on_progress: Callable[[int, int], None] | None = None
) -> ImportReport:
    rep = ImportReport()
    files: list[Path] = []
    for p in paths:
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    for i, f in enumerate(files):
        if on_progress is not None:
            on_progress(i, len(files))
        try:
            published = json.loads(f.read_text())
            validate_published(published)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecordError) as exc:
            rep.errors[str(f)] = f"{type(exc).__name__}: {exc}"
            continue
        iid = make_instance_id(published["metadata"]["repository_name"], published["commit_info"]["new_sha"])
        if _already_imported(instance_path(out_dir, iid), published, f.name):
            rep.unchanged.append(iid)
            continue
        write_record(out_dir, to_record(published, f.name))
        rep.imported.append(iid)
    return rep


def _already_imported(target: Path, published: dict[str, Any], source: str) -> bool:
    """Same published fields, from the same file, decided by the same statistics: nothing to redo."""
    if not target.is_file():
        return False
    try:
        existing = json.loads(target.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    ours = existing.get("cppperf") or {}
    return bool(
        ours.get("imported_from") == source
        and ours.get("statistics") == IMPORT_STATISTICS
        and to_published(existing) == published
    )


def iter_records(out_dir: Path) -> Iterator[dict[str, Any]]:
    for f in sorted((out_dir / "instances").glob("*.json")):
        try:
            yield json.loads(f.read_text())
        except json.JSONDecodeError:
            continue


def load_record(out_dir: Path, iid: str) -> dict[str, Any]:
    path = instance_path(out_dir, iid)
    if not path.is_file():
        raise RecordError(f"unknown instance {iid!r} (no {path})")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@dataclass(frozen=True)
class Filters:
    repo: str | None = None
    significant_only: bool = False
    since: str | None = None
    until: str | None = None
    files: str | None = None  # "single" | "multi"

    def match(self, r: dict[str, Any]) -> bool:
        ci = r["commit_info"]
        date = str(ci.get("commit_date") or "")[:10]
        n_files = len(ci.get("files_changed") or [])
        return (
            (self.repo is None or r["metadata"]["repository_name"] == self.repo)
            and (not self.significant_only or is_significant(r))
            and (self.since is None or date >= self.since)
            and (self.until is None or date <= self.until)
            and (self.files is None or (self.files == "single") == (n_files == 1))
        )


def git_patch(record: dict[str, Any]) -> str:
    """The expert patch as a git-style unified diff (the published `patch` lacks `+++` headers)."""
    ci = record["commit_info"]
    patch = "".join(ci.get("patch") or [])
    if patch.startswith("diff --git"):
        return patch
    parts = []
    for f in ci.get("files_changed") or []:
        name = f["filename"]
        body = f.get("patch") or ""
        old = "/dev/null" if f.get("status") == "added" else f"a/{name}"
        new = "/dev/null" if f.get("status") == "removed" else f"b/{name}"
        parts.append(f"diff --git a/{name} b/{name}\n--- {old}\n+++ {new}\n{body.rstrip(chr(10))}\n")
    return "".join(parts)


def swebench_row(r: dict[str, Any]) -> dict[str, Any]:
    ci = r["commit_info"]
    repo = r["metadata"]["repository_name"]
    linked = [*(r.get("issues") or []), *(r.get("pull_requests") or [])]
    statement = "\n".join(ci.get("commit_message") or [])
    for item in linked:
        statement += f"\n\n#{item.get('number', '')} {item.get('title', '')}\n{item.get('body', '')}".rstrip()
    iid = r["cppperf"]["instance_id"]
    return {
        "instance_id": iid,
        "repo": repo,
        "base_commit": ci["old_sha"],
        "patch": git_patch(r),
        "problem_statement": statement.strip(),
        "created_at": ci.get("commit_date"),
        "improved_tests": list((r.get("tests") or {}).get("significant_improvements_tests") or []),
        "image": instance_image_name(repo, ci["new_sha"]),
    }
