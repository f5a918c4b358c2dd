"""`evaluate`: score agents' patches locally or through evaluator services on the bus."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cppperf.cli.common import Config, _settings, app, console, out
from cppperf.shared.settings import Settings


def _load_predictions(path: Path) -> list[dict[str, str]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"{path}:{n}: not JSON: {exc}") from exc
        missing = {"instance_id", "model_name_or_path", "model_patch"} - set(row)
        if missing:
            raise typer.BadParameter(f"{path}:{n}: missing {', '.join(sorted(missing))}")
        rows.append({k: str(row[k] or "") for k in ("instance_id", "model_name_or_path", "model_patch")})
    return rows


async def _evaluate_over_bus(
    settings: Settings, url: str, rows: list[dict[str, str]], run_id: str, progress: Progress
) -> list[dict[str, Any]]:
    """Publish one request per prediction and wait for every answer on a private inbox."""
    from cppperf.runtime import connect
    from cppperf.shared import messages as msgs

    async with connect(settings, url) as ctx:
        inbox = ctx.bus.nc.new_inbox()
        answers: asyncio.Queue[msgs.EvalCompleted] = asyncio.Queue()

        async def on_answer(raw: Any) -> None:
            await answers.put(msgs.decode(raw.data, msgs.EvalCompleted))

        sub = await ctx.bus.nc.subscribe(inbox, cb=on_answer)
        wanted = {msgs.evaluation_id(run_id, r["model_name_or_path"], r["instance_id"]) for r in rows}
        for r in rows:
            req = msgs.EvalRequested(
                request_id=msgs.evaluation_id(run_id, r["model_name_or_path"], r["instance_id"]),
                run_id=run_id,
                model=r["model_name_or_path"],
                instance_id=r["instance_id"],
                patch=r["model_patch"],
                reply_to=inbox,
            )
            await ctx.bus.publish(msgs.EVAL_REQUESTED, req, msg_id=f"{req.id}#{inbox}")
        task = progress.add_task("evaluate", total=len(wanted))
        results: dict[str, dict[str, Any]] = {}
        while wanted - set(results):
            done = await answers.get()
            if done.id in wanted:
                results[done.id] = {**done.report, "verdict": done.verdict, "opt": done.opt}
                progress.update(task, completed=len(results))
        await sub.unsubscribe()
        return list(results.values())


@app.command()
def evaluate(
    instance: Annotated[
        str | None, typer.Option("--instance", help="instance id, e.g. owner__name-<sha12>")
    ] = None,
    patch: Annotated[Path | None, typer.Option("--patch", help="the agent's unified diff")] = None,
    predictions: Annotated[
        Path | None, typer.Option("--predictions", help="SWE-bench predictions JSONL")
    ] = None,
    model: Annotated[str, typer.Option("--model")] = "manual",
    run_id: Annotated[str, typer.Option("--run-id")] = "default",
    max_workers: Annotated[int, typer.Option("--max-workers", help="local parallel evaluations")] = 1,
    runs: Annotated[int | None, typer.Option("--runs", help="timing rounds")] = None,
    force: Annotated[bool, typer.Option("--force", help="recompute finished reports")] = False,
    trust_patches: Annotated[
        bool, typer.Option("--trust-patches", help="run without network isolation")
    ] = False,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="where the instances are (OUT/instances)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    nats_url: Annotated[
        str | None,
        typer.Option(
            "--nats-url", envvar="CPPPERF_NATS_URL", help="send requests to evaluator services on this bus"
        ),
    ] = None,
    config: Config = None,
) -> None:
    """Score agents' patches: applied, builds, tests pass, speed-up vs original and vs the expert, `opt`.

    Examples:
      cppperf evaluate --instance local__demo-1a2b3c4d5e6f --patch fix.diff --model my-agent
      cppperf evaluate --predictions preds.jsonl --run-id demo
      cppperf evaluate --predictions preds.jsonl --run-id demo --nats-url nats://bus:4222
    """
    from cppperf.services.evaluator.evaluate import EvalRequest, summarize
    from cppperf.services.evaluator.evaluate import evaluate as evaluate_one

    if (predictions is None) == (instance is None):
        raise typer.BadParameter("give either --instance with --patch, or --predictions")
    if instance is not None and patch is None:
        raise typer.BadParameter("--instance needs --patch", param_hint="--patch")
    s = _settings(
        config,
        nats_url=nats_url,
        out_dir=str(out_dir) if out_dir else None,
        evaluator__runs=runs,
        evaluator__trust_patches=trust_patches or None,
    )
    if predictions is not None:
        rows = _load_predictions(predictions)
    else:
        assert instance is not None and patch is not None
        rows = [{"instance_id": instance, "model_name_or_path": model, "model_patch": patch.read_text()}]
    progress = Progress(
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    )
    reports: list[dict[str, Any]]
    with progress:
        if s.nats_url:
            reports = asyncio.run(_evaluate_over_bus(s, s.nats_url, rows, run_id, progress))
            from cppperf.services.evaluator.evaluate import _write, run_dir

            for r in reports:
                req = EvalRequest(run_id, str(r["model"]), str(r["instance_id"]), "")
                _write(run_dir(s, req) / "report.json", json.dumps(r, indent=1))
        else:
            from concurrent.futures import ThreadPoolExecutor

            task = progress.add_task("evaluate", total=len(rows))
            reqs = [
                EvalRequest(run_id, r["model_name_or_path"], r["instance_id"], r["model_patch"]) for r in rows
            ]
            reports = []
            with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
                for rep in pool.map(lambda q: evaluate_one(q, s, force=force), reqs):
                    reports.append(rep)
                    progress.update(task, completed=len(reports))
    summaries = [summarize(s, run_id, m) for m in sorted({r["model_name_or_path"] for r in rows})]
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "reports": [{k: v for k, v in r.items() if k != "samples"} for r in reports],
                    "summaries": summaries,
                },
                default=str,
            )
        )
        return
    t = Table(title=f"run {run_id}")
    for c in ("instance", "model", "verdict", "speed-up (agent)", "speed-up (expert)", "reason"):
        t.add_column(c)
    for r in reports:
        t.add_row(
            str(r.get("instance_id")),
            str(r.get("model")),
            str(r["verdict"]),
            f"{r['gm_speedup_agent']:.2f}×" if "gm_speedup_agent" in r else "-",
            f"{r['gm_speedup_expert']:.2f}×" if "gm_speedup_expert" in r else "-",
            str(r.get("reason", ""))[:60],
        )
    out.print(t)
    for sm in summaries:
        o = sm["overall"]
        out.print(
            f"{sm['model']}: {o['opt']}/{o['instances']} opt ({o['opt_rate']:.0%}); "
            f"single-file {sm['single_file']['opt']}/{sm['single_file']['instances']}, "
            f"multi-file {sm['multi_file']['opt']}/{sm['multi_file']['instances']}"
        )
