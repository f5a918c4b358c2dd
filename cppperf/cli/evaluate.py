"""`evaluate`: score agents' patches locally or through evaluator services on the bus."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from msgspec import UnsetType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cppperf.cli.common import (
    EXIT_FAILURES,
    EXIT_OK,
    Config,
    OutDir,
    Runs,
    _check_nats_url,
    _fail,
    _settings,
    app,
    cli_nats,
    console,
    out,
    print_json,
    run_async,
)
from cppperf.cli.predictions import PSEUDO, pseudo_predictions
from cppperf.shared.domain import EvalVerdict
from cppperf.shared.errors import CppPerfError
from cppperf.shared.messages import check_run_id

FIELDS = ("instance_id", "model_name_or_path", "model_patch")


def _prediction_rows(path: Path) -> list[tuple[str, Any]]:
    """(where, row) for JSONL, a JSON array, or a JSON object keyed by instance id (as SWE-bench)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--predictions") from None
    if text.lstrip().startswith(("[", "{")):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None  # JSONL whose first line is an object
        except RecursionError:
            raise typer.BadParameter(f"{path}: JSON nested too deeply", param_hint="--predictions") from None
        if isinstance(doc, list):
            return [(f"{path}[{i}]", row) for i, row in enumerate(doc)]
        if isinstance(doc, dict) and not (set(FIELDS) & set(doc)):
            return [(f"{path}[{k!r}]", row) for k, row in doc.items()]
    rows: list[tuple[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"{path}:{n}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"{path}:{n}: not JSON: {exc}", param_hint="--predictions") from None
        except RecursionError:
            raise typer.BadParameter(
                f"{path}:{n}: JSON nested too deeply", param_hint="--predictions"
            ) from None
    return rows


def _load_predictions(path: Path) -> list[dict[str, str]]:
    """SWE-bench predictions: each row has instance_id, model_name_or_path, model_patch; one
    prediction per (model, instance) -- a second one is an error naming both places."""
    rows: list[dict[str, str]] = []
    seen: dict[tuple[str, str], str] = {}
    for where, row in _prediction_rows(path):
        if not isinstance(row, dict):
            raise typer.BadParameter(f"{where}: not a JSON object", param_hint="--predictions")
        missing = set(FIELDS) - set(row)
        if missing:
            raise typer.BadParameter(
                f"{where}: missing {', '.join(sorted(missing))}", param_hint="--predictions"
            )
        clean = {k: str(row[k] or "") for k in FIELDS}
        key = (clean["model_name_or_path"], clean["instance_id"])
        if key in seen:
            raise typer.BadParameter(
                f"{where}: a second prediction of {key[1]} by {key[0]} (first at {seen[key]})",
                param_hint="--predictions",
            )
        seen[key] = where
        rows.append(clean)
    if not rows:
        raise typer.BadParameter(f"{path}: no predictions", param_hint="--predictions")
    return rows


def _split_ids(value: str | None) -> set[str] | None:
    return {x.strip() for x in value.replace(",", " ").split() if x.strip()} if value else None


def _shown(value: str | UnsetType) -> str:
    """A report's field as the table shows it ("None" when the report has none)."""
    return "None" if isinstance(value, UnsetType) else value


@app.command()
def evaluate(  # noqa: PLR0912, PLR0915 - one verb, its input checks and its two ways of running
    instance: Annotated[
        str | None, typer.Option("--instance", help="instance id, e.g. owner__name-<sha12>")
    ] = None,
    patch: Annotated[
        Path | None,
        typer.Option("--patch", help="the agent's unified diff", exists=True, dir_okay=False, readable=True),
    ] = None,
    predictions: Annotated[
        str | None,
        typer.Option(
            "--predictions",
            help="SWE-bench predictions (JSONL or a JSON array), or `gold` (the expert's patch) or "
            "`empty` (an empty patch) for every instance of --out (or of --instance-ids)",
        ),
    ] = None,
    instance_ids: Annotated[
        str | None,
        typer.Option(
            "--instance-ids", help="only these instances of --predictions (comma or space separated)"
        ),
    ] = None,
    model: Annotated[str, typer.Option("--model", help="the model's name for --instance/--patch")] = "manual",
    run_id: Annotated[
        str,
        typer.Option(
            "--run-id",
            help="the run's name: OUT/runs/<run_id>/ holds its reports (1-128 of [A-Za-z0-9._-], "
            "not starting or ending with . or _)",
        ),
    ] = "default",
    max_workers: Annotated[int, typer.Option("--max-workers", min=1, help="local parallel evaluations")] = 1,
    runs: Runs = None,
    force: Annotated[bool, typer.Option("--force", help="recompute finished reports")] = False,
    trust_patches: Annotated[
        bool,
        typer.Option("--trust-patches", help="run agents' code even without the bubblewrap jail (unsafe)"),
    ] = False,
    allow_build_changes: Annotated[
        bool,
        typer.Option(
            "--allow-build-changes", help="trusted mode: patches may change build files and scripts"
        ),
    ] = False,
    out_dir: OutDir = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print reports and run reports as one JSON object")
    ] = False,
    nats_url: Annotated[
        str | None,
        typer.Option(
            "--nats-url",
            envvar="CPPPERF_NATS_URL",
            help="send requests to evaluator services on this bus",
            callback=_check_nats_url,
        ),
    ] = None,
    creds: Annotated[
        Path | None,
        typer.Option("--creds", help="with --nats-url: this agent's credentials (`cppperf agents add`)"),
    ] = None,
    config: Config = None,
) -> None:
    """Score agents' patches: applied, builds, tests pass, speed-up vs original and vs the expert, `opt`.
    Finished reports are not recomputed (a notice says so; --force redoes them). Exit 1 when an
    instance is unknown.

    \b
    Examples:
      cppperf evaluate --instance local__demo-4bda4860cd0d --patch fix.diff --model my-agent
      cppperf evaluate --predictions preds.jsonl --run-id demo --instance-ids a__b-123456789abc
      cppperf evaluate --predictions preds.jsonl --run-id demo --nats-url nats://bus:4222 --creds alice.creds
      cppperf evaluate --predictions gold --run-id validate   # the harness on the experts' patches

    Writes OUT/runs/<run_id>/<model>.<run_id>.json, SWE-bench's run report shape plus `opt`
    (`cppperf schema run-report`).
    """
    from cppperf.client import evaluate_rows
    from cppperf.dataset.records import instance_path
    from cppperf.services.evaluator.handlers import wire_report
    from cppperf.services.evaluator.pipeline import EvalRequest, run_dir, summarize
    from cppperf.services.evaluator.runreport import build_run_report, describe, report_path

    check_run_id(run_id)  # it names OUT/runs/<run_id>: refused, never rewritten
    if (predictions is None) == (instance is None):
        raise typer.BadParameter("give either --instance with --patch, or --predictions")
    if instance is not None and patch is None:
        raise typer.BadParameter("--instance needs --patch", param_hint="--patch")
    if instance_ids is not None and predictions is None:
        raise typer.BadParameter("--instance-ids filters --predictions", param_hint="--instance-ids")
    s = _settings(
        config,
        nats_url=nats_url,
        out_dir=str(out_dir) if out_dir else None,
        evaluator__runs=runs,
        evaluator__trust_patches=trust_patches or None,
        evaluator__allow_build_changes=allow_build_changes or None,
    )
    if predictions in PSEUDO:
        rows = pseudo_predictions(Path(s.out_dir), predictions, _split_ids(instance_ids))
        if not rows:
            raise typer.BadParameter(
                f"no instances in {Path(s.out_dir) / 'instances'}", param_hint="--predictions"
            )
    elif predictions is not None:
        path = Path(predictions)
        if not path.is_file():
            raise typer.BadParameter(
                f"{path} does not exist (a predictions file, or gold, or empty)", param_hint="--predictions"
            )
        rows = _load_predictions(path)
        wanted_ids = _split_ids(instance_ids)
        if wanted_ids is not None:
            absent = wanted_ids - {r["instance_id"] for r in rows}
            if absent:
                raise typer.BadParameter(
                    f"not in {predictions}: {', '.join(sorted(absent))}", param_hint="--instance-ids"
                )
            rows = [r for r in rows if r["instance_id"] in wanted_ids]
    else:
        assert instance is not None and patch is not None
        try:
            text = patch.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise typer.BadParameter(f"{patch}: {exc}", param_hint="--patch") from None
        rows = [{"instance_id": instance, "model_name_or_path": model, "model_patch": text}]
    unknown: list[str] = []
    unknown_by_model: dict[str, list[str]] = {}
    if not s.nats_url:  # over the bus the evaluators' instance store decides
        unknown = sorted(
            {r["instance_id"] for r in rows if not instance_path(Path(s.out_dir), r["instance_id"]).is_file()}
        )
        for r in rows:
            if r["instance_id"] in unknown:
                unknown_by_model.setdefault(r["model_name_or_path"], []).append(r["instance_id"])
        for iid in unknown:
            console.print(
                f"[red]unknown instance[/red] {iid} (no {instance_path(Path(s.out_dir), iid)})",
                soft_wrap=True,
            )
        rows = [r for r in rows if r["instance_id"] not in unknown]
        if not rows:
            raise typer.Exit(EXIT_FAILURES)
    if not force:
        for r in rows:
            req = EvalRequest(run_id, r["model_name_or_path"], r["instance_id"], "")
            if (run_dir(s, req) / "report.json").is_file():
                console.print(
                    f"{r['instance_id']} ({r['model_name_or_path']}): already evaluated in run {run_id}, "
                    "skipping (--force redoes it)",
                    soft_wrap=True,
                )
    progress = Progress(
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    )
    try:
        with progress, cli_nats(s) if s.nats_url else contextlib.nullcontext():
            task = progress.add_task("evaluate", total=len(rows))
            reports = evaluate_rows(
                s,
                rows,
                run_id,
                creds=str(creds) if creds else None,
                force=force,
                max_workers=max_workers,
                on_done=lambda n: progress.update(task, completed=n),
                run=lambda coro: run_async(
                    coro, waiting_for="the connection to close (evaluators finish what they started)"
                ),
            )
    except CppPerfError as exc:
        raise _fail(exc) from exc
    unknown += [_shown(r.instance_id) for r in reports if r.verdict == EvalVerdict.UNKNOWN_INSTANCE]
    models = sorted({r["model_name_or_path"] for r in rows} | set(unknown_by_model))
    summaries = [summarize(s, run_id, m) for m in models]
    run_reports = [
        build_run_report(
            s,
            run_id,
            m,
            submitted=[r["instance_id"] for r in rows if r["model_name_or_path"] == m],
            unknown=unknown_by_model.get(m, []),
        )
        for m in models
    ]
    if as_json:
        print_json(
            {
                "reports": [wire_report(r) for r in reports],
                "summaries": summaries,
                "run_reports": [msgspec.to_builtins(rr) for rr in run_reports],
                "unknown_instances": unknown,
            }
        )
        raise typer.Exit(EXIT_FAILURES if unknown else EXIT_OK)
    t = Table(title=f"run {run_id}")
    for c in ("instance", "model", "verdict", "speed-up (agent)", "speed-up (expert)", "reason"):
        t.add_column(c)
    for rep in reports:
        t.add_row(
            _shown(rep.instance_id),
            _shown(rep.model),
            str(rep.verdict),
            "-" if isinstance(rep.gm_speedup_agent, UnsetType) else f"{rep.gm_speedup_agent:.2f}×",
            "-" if isinstance(rep.gm_speedup_expert, UnsetType) else f"{rep.gm_speedup_expert:.2f}×",
            rep.reason[:60],
        )
    out.print(t)
    for rr in run_reports:
        out.print(describe(rr), highlight=False)
        out.print(f"  report: {report_path(s, run_id, rr.model)}", highlight=False)
    raise typer.Exit(EXIT_FAILURES if unknown else EXIT_OK)
