"""`classify`: one decision with its evidence, or a backend scored on labelled commits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cppperf.cli.build import _commit_from_repo
from cppperf.cli.common import EXIT_USAGE, Config, _fail, _settings, app, console, out
from cppperf.shared.errors import CppPerfError

# ------------------------------------------------------------------------------------------ classify
classify_app = typer.Typer(
    help="Classify one commit, or evaluate a backend on labelled commits.", invoke_without_command=True
)
app.add_typer(classify_app, name="classify")


@classify_app.callback()
def classify_one(
    ctx: typer.Context,
    repo: Annotated[Path | None, typer.Option("--repo")] = None,
    sha: Annotated[str | None, typer.Option("--sha")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="heuristic|openai|vllm")] = None,
    config: Config = None,
) -> None:
    """cppperf classify --repo PATH --sha SHA: print the decision with its evidence."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"backend": backend, "config": config}
        return
    if repo is None or sha is None:
        raise typer.BadParameter("give --repo and --sha (or use `classify eval --labels FILE`)")
    from cppperf.services.classifier.service import Classifier

    s = _settings(config, classifier__backend=backend)
    commit = _commit_from_repo(repo, sha, None)
    clf = Classifier.create(s.classifier)

    async def main() -> Any:
        try:
            return await clf.classify(commit, commit.diff)
        finally:
            await clf.close()

    try:
        res = asyncio.run(main())
    except CppPerfError as exc:
        raise _fail(exc) from exc
    out.print(f"{commit.sha[:12]} {(commit.message.splitlines() or [''])[0][:70]}")
    out.print(
        f"label: {'POSITIVE' if res.label else 'negative'} (backend {res.backend}, phase {res.phase}, "
        f"score {res.score})"
    )
    for e in res.evidence:
        out.print(f"  - {e}")
    for v in res.votes:
        out.print(f"  - {v.model} phase {v.phase}: {v.answer} ({v.latency_ms:.0f} ms)")


@classify_app.command("eval")
def classify_eval(
    ctx: typer.Context,
    labels: Annotated[
        Path,
        typer.Option(
            "--labels",
            help="JSONL with message, diff, manual_label",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    backend: Annotated[str | None, typer.Option("--backend")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Confusion matrix, precision/recall/F1, prefilter recall and pruned share, calls, tokens, time.

    Example: cppperf classify eval --labels ../shared/data/commit-labels/dev.jsonl
    """
    from cppperf.services.classifier.evaluate import evaluate, load_labels
    from cppperf.services.classifier.service import Classifier

    parent = ctx.obj or {}
    s = _settings(parent.get("config"), classifier__backend=backend or parent.get("backend"))
    try:
        rows = load_labels(labels)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise _fail(f"{labels}: {exc}", EXIT_USAGE) from exc
    clf = Classifier.create(s.classifier)
    progress = Progress(
        TextColumn("classify"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    )

    async def main() -> Any:
        task = progress.add_task("classify", total=len(rows))
        try:
            return await evaluate(clf, rows, progress=lambda d, _t: progress.update(task, completed=d))
        finally:
            await clf.close()

    try:
        with progress:
            rep = asyncio.run(main())
    except CppPerfError as exc:
        raise _fail(exc) from exc
    if as_json:
        out.print_json(json.dumps(rep.as_dict()))
        return
    t = Table(title=f"{labels.name}: backend {rep.backend}")
    t.add_column("")
    t.add_column("predicted yes", justify="right")
    t.add_column("predicted no", justify="right")
    t.add_row("actual yes", str(rep.tp), str(rep.fn))
    t.add_row("actual no", str(rep.fp), str(rep.tn))
    out.print(t)
    out.print(f"precision {rep.precision:.3f}  recall {rep.recall:.3f}  F1 {rep.f1:.3f}")
    out.print(f"prefilter: recall {rep.prefilter_recall:.3f}, pruned {rep.prefilter_pruned_share:.1%}")
    out.print(
        f"LLM calls {rep.llm_calls}, tokens {rep.prompt_tokens}+{rep.completion_tokens}, "
        f"wall {rep.wall_seconds:.2f}s"
    )
