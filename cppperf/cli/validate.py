"""`validate`: gold validation — can each instance grade agents (services/evaluator/gold.py)?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cppperf.cli.common import (
    EXIT_FAILURES,
    AsJson,
    Config,
    OutDir,
    Runs,
    _fail,
    _settings,
    app,
    out,
    print_json,
)
from cppperf.shared.domain import Verdict
from cppperf.shared.errors import CppPerfError


@app.command()
def validate(
    ids: Annotated[
        list[str] | None, typer.Argument(help="instance ids (default: every proven instance)")
    ] = None,
    runs: Runs = None,
    force: Annotated[bool, typer.Option("--force", help="re-evaluate even when reports exist")] = False,
    out_dir: OutDir = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """Run each instance's expert patch through the evaluator (it must score opt) and a comment-only
    patch (it must not); record the instance's `oracle` (ctest | benchmark | both | none). Exit 1 when any has none.

    \b
    Example:
      cppperf validate local__demo-4bda4860cd0d
    """
    from cppperf.dataset.records import iter_records
    from cppperf.services.evaluator.gold import validate_stored

    s = _settings(config, out_dir=str(out_dir) if out_dir else None, evaluator__runs=runs)
    if not ids:
        ids = [
            r.cppperf.instance_id
            for r in iter_records(Path(s.out_dir))
            if r.cppperf.verdict == Verdict.IMPROVED
        ]
        if not ids:
            raise _fail(f"no proven (improved) instance in {Path(s.out_dir) / 'instances'}")
    results: dict[str, dict[str, object]] = {}
    try:
        for iid in ids:
            results[iid] = validate_stored(iid, s, force=force)
    except CppPerfError as exc:
        raise _fail(exc) from exc
    graded = sum(bool(v["can_grade"]) for v in results.values())
    if as_json:
        print_json({"instances": results, "can_grade": graded, "total": len(results)})
    else:
        t = Table(title="gold validation")
        for c in ("instance", "expert patch", "null patch", "oracle"):
            t.add_column(c)
        for iid, v in results.items():
            gold, null = v["gold"], v["null"]
            assert isinstance(gold, dict) and isinstance(null, dict)
            t.add_row(iid, str(gold.get("verdict")), str(null.get("verdict", "-")), str(v["oracle"]))
        out.print(t)
        out.print(f"{graded} of {len(results)} instance(s) can grade agents")
    if graded < len(results):
        raise typer.Exit(EXIT_FAILURES)
