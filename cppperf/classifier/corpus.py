"""Training and evaluation examples for the trained scorer, from three sources:

- `cppperf-db`: the published CppPerf-DB entries (`entries/*.json`), all positives (the paper's
  vote said yes and the commit was built); patches are rewritten to `git diff` form so the
  diff's format says nothing about the label.
- `labels`: hand-labelled JSONL (`message`, `diff`, `manual_label`, optional `repo`, `sha`).
- `mined`: structurally selected commits of a local clone (the filter stage's own rules), as
  negatives; the few that are performance work are label noise the model tolerates. Commits that
  are CppPerf-DB entries are left out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cppperf.services.classifier.scorer import Example
from cppperf.shared.settings import MiningSettings


def _db_diff(entry: dict[str, Any]) -> str:
    """CppPerf-DB patches start `--- path`; give them git's `diff --git`/`+++` header lines."""
    ci = entry.get("commit_info", {})
    patches = ci.get("patch") or []
    files = ci.get("files_changed") or []
    out = []
    for i, p in enumerate(patches):
        text = str(p)
        first, _, rest = text.partition("\n")
        path = first[4:].strip() if first.startswith("--- ") else (files[i] if i < len(files) else "file")
        body = rest if first.startswith("--- ") else text
        out.append(f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n{body.rstrip()}\n")
    return "".join(out)


def _db_linked(entry: dict[str, Any]) -> str:
    texts = []
    for kind in ("issues", "pull_requests"):
        for it in entry.get(kind) or []:
            if isinstance(it, dict):
                texts.append(f"{it.get('title', '')}\n{it.get('body', '') or ''}".strip())
    return "\n\n".join(t for t in texts if t)


def load_cppperf_db(directory: Path) -> list[Example]:
    entries = directory / "entries" if (directory / "entries").is_dir() else directory
    files = sorted(entries.glob("*.json"))
    if not files:
        raise ValueError(f"{directory}: no CppPerf-DB entries (*.json)")
    out = []
    for f in files:
        try:
            e = json.loads(f.read_text())
            ci = e["commit_info"]
            msg = ci.get("commit_message")
            out.append(
                Example(
                    repo=str(e["metadata"]["repository_name"]),
                    sha=str(ci["new_sha"]),
                    message="\n".join(msg) if isinstance(msg, list) else str(msg or ""),
                    issue_text=_db_linked(e),
                    diff=_db_diff(e),
                    label=True,
                    source="cppperf-db",
                )
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{f}: not a CppPerf-DB entry (missing {exc})") from exc
        except RecursionError:
            raise ValueError(f"{f}: not a CppPerf-DB entry (JSON nested too deeply)") from None
    return out


def load_labelled(path: Path, *, source: str = "labels") -> list[Example]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            raise ValueError(f"{path}:{n}: JSON nested too deeply") from None
        if "message" not in row or "manual_label" not in row:
            raise ValueError(f"{path}:{n}: needs 'message' and 'manual_label'")
        out.append(
            Example(
                repo=str(row.get("repo", "labels/unknown")),
                sha=str(row.get("sha", f"{path.name}:{n}")),
                message=str(row["message"]),
                issue_text=str(row.get("issue_text") or row.get("issue") or ""),
                diff=str(row.get("diff", "")),
                label=bool(row["manual_label"]),
                source=str(row.get("source", source)),
            )
        )
    return out


def mine_negatives(
    repo_path: Path, name: str, settings: MiningSettings, *, limit: int = 300, exclude: Iterable[str] = ()
) -> Iterator[dict[str, Any]]:
    """Up to `limit` structurally selected commits of a local clone as label rows (label false),
    a deterministic spread over the history (ordered by a hash of the sha)."""
    from cppperf.services.filter.walk import commit_details, walk
    from cppperf.shared.rules import Rules

    skip = set(exclude)
    selected = [c for c in walk(repo_path, Rules.from_settings(settings)).selected if c.sha not in skip]
    selected.sort(key=lambda c: hashlib.sha256(c.sha.encode()).hexdigest())
    picked = selected[:limit]
    by_sha = {c.sha: c for c in picked}
    for d in commit_details(repo_path, picked):
        c = by_sha[d.sha]
        yield {
            "repo": name,
            "sha": c.sha,
            "date": c.date.isoformat(),
            "message": c.message,
            "diff": d.diff,
            "manual_label": False,
            "source": "mined",
        }


def without_overlap(train: list[Example], test: Iterable[Example]) -> list[Example]:
    """Training examples minus any commit that is also in the test set (same sha), so a
    CppPerf-DB positive that is also a labelled commit never scores itself."""
    shas = {e.sha for e in test}
    return [e for e in train if e.sha not in shas]
