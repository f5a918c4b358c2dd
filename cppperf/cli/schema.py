"""`schema`: the JSON schemas of the typed domain (KV values, the instance record, reports)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cppperf.cli.common import app, console, out


@app.command()
def schema(
    name: Annotated[
        str | None, typer.Argument(help="one schema (e.g. eval-report); all of them when absent")
    ] = None,
) -> None:
    """Print the JSON schema of a domain type: repo-state, commit-state, instance-state,
    evaluation-state, instance-record (OUT/instances/<id>.json, every section), published-entry (a
    CppPerf-DB file, as `dataset import` reads it), instance-meta (the record's `cppperf` section),
    eval-report, run-report (OUT/runs/<run_id>/<model>.<run_id>.json).

    \b
    Examples:
      cppperf schema instance-record > instance-record.schema.json
      cppperf schema eval-report > eval-report.schema.json
    """
    import msgspec

    from cppperf.services.evaluator.runreport import RunReport
    from cppperf.shared.domain import SCHEMA_TYPES

    types = {**SCHEMA_TYPES, "run-report": RunReport}
    if name is None:
        out.print_json(json.dumps({k: msgspec.json.schema(t) for k, t in types.items()}))
        return
    if name not in types:
        console.print(f"[red]error:[/red] unknown schema {name!r}: one of {', '.join(types)}")
        raise typer.Exit(2)
    out.print_json(json.dumps(msgspec.json.schema(types[name])))
