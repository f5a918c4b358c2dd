"""Instance records on disk (`<out>/instances/<id>.json`): import the published CppPerf-DB files
unchanged, export them again (round trip), export a SWE-bench-like JSONL, and filter.

A record is an `InstanceRecord` (shared/domain.py): the published sections (shared/published.py)
plus our `cppperf` section. A published file is decoded as a `PublishedEntry`; for it our section
says where it came from (`imported_from`) and derives the verdict from the published fields, so the
published keys stay what they were and `export --format cppperf-db` writes them back. Records are
read and written through the Structs (`decode_record`, `record_text`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from cppperf.shared.domain import (
    DecisionRule,
    InstanceMeta,
    InstanceRecord,
    StatsRecord,
    Verdict,
    decode_record,
    record_text,
)
from cppperf.shared.engine.images import instance_image_name
from cppperf.shared.errors import BadInput
from cppperf.shared.files import write_atomic
from cppperf.shared.messages import check_instance_id
from cppperf.shared.messages import instance_id as make_instance_id
from cppperf.shared.published import PublishedEntry

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


def decode_published(data: Any) -> PublishedEntry:
    """A published file's JSON as its Struct (shared/published.py); RecordError when it is not one."""
    validate_published(data)
    try:
        return msgspec.convert(data, PublishedEntry)
    except msgspec.ValidationError as exc:
        raise RecordError(str(exc)) from exc


def decode(data: Any, where: str) -> InstanceRecord:
    """An instance record's JSON (text or parsed) as its Struct; RecordError naming `where`."""
    try:
        return decode_record(data)
    except ValueError as exc:  # not JSON, or not an instance record (msgspec.ValidationError)
        raise RecordError(f"{where}: not an instance record: {exc}") from exc


def is_significant(record: InstanceRecord) -> bool:
    return record.cppperf.verdict == Verdict.IMPROVED


IMPORT_RESAMPLES = 1000  # the 95 % percentile CI of tests whose decision needs it
IMPORT_SEED = 0
IMPORT_STATISTICS = f"mwu-bh-hl-bootstrap{IMPORT_RESAMPLES}-seed{IMPORT_SEED}"  # recompute when it changes


def recompute_tests(published: PublishedEntry) -> list[StatsRecord]:
    """Our statistics (MWU both ways, BH, Hodges-Lehmann ratio) from the published per-test raw
    times, with the published thresholds. The bootstrap CI is computed for the tests whose
    decision depends on it (adjusted p and median change both qualify); the others keep an
    unknown CI, which never excludes 1."""
    from cppperf.shared.engine.stats import compare_batch, compare_test, decide

    raw = published.raw_timing_data
    alpha = float((raw.min_p_value if raw else None) or 0.05)
    threshold = float((raw.min_exec_time_improvement if raw else None) or 0.05)
    by_name = {
        t.test_name: (t.old_times, t.new_times)
        for t in published.tests.tests
        if t.old_times and t.new_times and len(t.old_times) >= 2 and len(t.new_times) >= 2
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


def to_record(published: PublishedEntry | dict[str, Any], source: str) -> InstanceRecord:
    """The published file plus our section, whose verdicts are recomputed from the raw timings
    (so `improved` never stands beside significant regressions); the published counts stay as
    they were in the published fields. RecordError when `published` is not a CppPerf-DB entry."""
    entry = published if isinstance(published, PublishedEntry) else decode_published(published)
    from cppperf.shared.engine.stats import verdict  # scipy: imported when a record is

    tests = recompute_tests(entry)  # an empty list: not-improved under every rule
    meta = InstanceMeta(
        record_version=1,
        instance_id=make_instance_id(entry.metadata.repository_name, entry.commit_info.new_sha),
        imported_from=source,
        statistics=IMPORT_STATISTICS,
        verdict=verdict(tests, rule=DecisionRule.OURS),
        decision_rule=DecisionRule.OURS,
        verdict_paper_rule=verdict(tests, rule=DecisionRule.PAPER),
        improved_tests=[t.name for t in tests if t.improved],
        regressed_tests=[t.name for t in tests if t.regressed],
        tests=tests,
        failure_category=None,
        builder="cppperf-db",
    )
    return InstanceRecord(**_published_fields(entry), cppperf=meta)


def _published_fields(entry: PublishedEntry) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in PublishedEntry.__struct_fields__}


def to_published(record: InstanceRecord) -> PublishedEntry:
    """The record without our section: the published entry, key for key."""
    return PublishedEntry(**_published_fields(record))


def instance_path(out_dir: Path, iid: str) -> Path:
    return out_dir / "instances" / f"{check_instance_id(iid)}.json"


def write_record(out_dir: Path, record: InstanceRecord) -> Path:
    return write_atomic(instance_path(out_dir, record.cppperf.instance_id), record_text(record))


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
            published = decode_published(json.loads(f.read_text()))
            iid = check_instance_id(
                make_instance_id(published.metadata.repository_name, published.commit_info.new_sha)
            )
        except (OSError, ValueError, RecursionError, BadInput) as exc:  # ValueError: not UTF-8/JSON/an entry
            rep.errors[str(f)] = f"{type(exc).__name__}: {exc}"
            continue
        if _already_imported(instance_path(out_dir, iid), published, f.name):
            rep.unchanged.append(iid)
            continue
        write_record(out_dir, to_record(published, f.name))
        rep.imported.append(iid)
    return rep


def _already_imported(target: Path, published: PublishedEntry, source: str) -> bool:
    """Same published fields, from the same file, decided by the same statistics: nothing to redo."""
    if not target.is_file():
        return False
    try:
        existing = decode_record(target.read_text())
    except (OSError, ValueError):  # unreadable, not JSON, not a record: import it again
        return False
    ours = existing.cppperf
    return bool(
        ours.imported_from == source
        and ours.statistics == IMPORT_STATISTICS
        and to_published(existing) == published
    )


def iter_records(out_dir: Path, skipped: list[str] | None = None) -> Iterator[InstanceRecord]:
    """Every record in `out_dir/instances`, by file name; a file that is not one (not JSON, not
    UTF-8, not a record, a directory, unreadable) is skipped, with `path: why` added to `skipped`."""
    for f in sorted((out_dir / "instances").glob("*.json")):
        try:
            yield decode_record(f.read_text())
        except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON, not a record
            if skipped is not None:
                skipped.append(f"{f}: {exc.strerror if isinstance(exc, OSError) else exc}")


def skipped_line(skipped: list[str]) -> str:
    """One line for the files `iter_records` skipped: how many, and the first with its reason."""
    return f"warning: skipped {len(skipped)} file(s) that are not instance records (first: {skipped[0]})"


def load_record(out_dir: Path, iid: str) -> InstanceRecord:
    path = instance_path(out_dir, iid)
    if not path.is_file():
        raise RecordError(f"unknown instance {iid!r} (no {path})")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 text ({exc.reason})"
        raise RecordError(f"{path}: not an instance record: {why}") from None
    return decode(text, str(path))


@dataclass(frozen=True)
class Filters:
    repo: str | None = None
    significant_only: bool = False
    since: str | None = None
    until: str | None = None
    files: str | None = None  # "single" | "multi"

    def match(self, r: InstanceRecord) -> bool:
        ci = r.commit_info
        date = (ci.commit_date or "")[:10]
        n_files = len(ci.files_changed)
        return (
            (self.repo is None or r.metadata.repository_name == self.repo)
            and (not self.significant_only or is_significant(r))
            and (self.since is None or date >= self.since)
            and (self.until is None or date <= self.until)
            and (self.files is None or (self.files == "single") == (n_files == 1))
        )


def git_patch(record: InstanceRecord) -> str:
    """The expert patch as a git-style unified diff (the published `patch` lacks `+++` headers)."""
    ci = record.commit_info
    patch = "".join(ci.patch or [])
    if patch.startswith("diff --git"):
        return patch
    parts = []
    for f in ci.files_changed:
        name = f.filename
        body = f.patch or ""
        old = "/dev/null" if f.status == "added" else f"a/{name}"
        new = "/dev/null" if f.status == "removed" else f"b/{name}"
        parts.append(f"diff --git a/{name} b/{name}\n--- {old}\n+++ {new}\n{body.rstrip(chr(10))}\n")
    return "".join(parts)


def swebench_row(r: InstanceRecord) -> dict[str, Any]:
    ci = r.commit_info
    repo = r.metadata.repository_name
    linked = [*(r.issues or []), *(r.pull_requests or [])]
    statement = "\n".join(ci.commit_message or [])
    for item in linked:
        statement += f"\n\n#{item.number} {item.title or ''}\n{item.body or ''}".rstrip()
    return {
        "instance_id": r.cppperf.instance_id,
        "repo": repo,
        "base_commit": ci.old_sha,
        "patch": git_patch(r),
        "problem_statement": statement.strip(),
        "created_at": ci.commit_date or None,
        "improved_tests": list(r.tests.significant_improvements_tests or []),
        "image": instance_image_name(repo, ci.new_sha),
    }
