"""`classify`: one decision with its evidence, or a backend scored on labelled commits."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cppperf.cli.build import _commit_from_repo
from cppperf.cli.common import (
    EXIT_USAGE,
    AsJson,
    Config,
    WholeHelpGroup,
    _fail,
    _settings,
    app,
    console,
    out,
    write_atomic,
)
from cppperf.shared.errors import CppPerfError

# ------------------------------------------------------------------------------------------ classify
classify_app = typer.Typer(
    cls=WholeHelpGroup,
    help="Classify one commit, or evaluate a backend on labelled commits.",
    invoke_without_command=True,
)
app.add_typer(classify_app, name="classify")


@classify_app.callback()
def classify_one(
    ctx: typer.Context,
    repo: Annotated[Path | None, typer.Option("--repo", help="local clone holding the commit")] = None,
    sha: Annotated[
        str | None, typer.Option("--sha", help="the commit to classify (full or abbreviated sha)")
    ] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="heuristic|model|openai|vllm")] = None,
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
    out.print(f"{commit.sha[:12]} {(commit.message.splitlines() or [''])[0]}", markup=False, highlight=False)
    out.print(
        f"label: {'POSITIVE' if res.label else 'negative'} (backend {res.backend}, phase {res.phase}, "
        f"score {res.score})"
    )
    for e in res.evidence:
        out.print(f"  - {e}", markup=False)
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
    backend: Annotated[
        str | None,
        typer.Option("--backend", help="heuristic|model|openai|vllm (default: classifier.backend)"),
    ] = None,
    as_json: AsJson = False,
    db: Annotated[
        Path | None,
        typer.Option(
            "--db", help="CppPerf-DB folder: also cross-validate the trained scorer over repositories"
        ),
    ] = None,
    negatives: Annotated[
        list[Path] | None,
        typer.Option("--negatives", metavar="FILE", help="JSONL of mined negatives for --db (repeatable)"),
    ] = None,
    folds: Annotated[int, typer.Option("--folds", min=2, help="repository folds for --db")] = 5,
    phase2_share: Annotated[
        float, typer.Option("--phase2-share", min=0.0, max=1.0, help="assumed phase-2 share when no LLM runs")
    ] = 0.2,
) -> None:
    """Confusion matrix, precision/recall/F1, prefilter recall and pruned share, calls, tokens, time;
    the cascade's LLM calls per 1,000 commits against the paper's and the recall it keeps; with
    `--db`, the no-model scorers cross-validated over repositories (mean and spread over folds).

    \b
    Examples:
      cppperf classify eval --labels ../shared/data/commit-labels/dev.jsonl
      cppperf classify eval --labels dev.jsonl --db ../shared/data/cppperf-db --negatives mined.jsonl --json
    """
    from cppperf.classifier.quality import evaluate, load_labels
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
            return await evaluate(
                clf,
                rows,
                progress=lambda d, _t: progress.update(task, completed=d),
                assumed_phase2_share=phase2_share,
            )
        finally:
            await clf.close()

    try:
        with progress:
            rep = asyncio.run(main())
            if db is not None:
                rep.crossval = _crossval(labels, db, negatives or [], folds, progress).as_dict()
    except (CppPerfError, OSError, ValueError) as exc:
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
    out.print(_cost_table(rep.cascade))
    if rep.crossval is not None:
        out.print(_crossval_table(rep.crossval))
        out.print(_gate_curve_table(rep.crossval))
        out.print(_targets_line(rep.crossval["summary"]["targets"]))


def _crossval(labels: Path, db: Path, negatives: list[Path], folds: int, progress: Progress) -> Any:
    from cppperf.classifier.corpus import load_cppperf_db, load_labelled
    from cppperf.classifier.crossval import cross_validate

    pool = load_cppperf_db(db)
    for f in negatives:
        pool += load_labelled(f, source="mined")
    tests = load_labelled(labels)
    task = progress.add_task("cross-validate", total=folds)
    return cross_validate(pool, tests, k=folds, progress=lambda d, _t: progress.update(task, completed=d))


def _cost_table(c: dict[str, Any]) -> Table:
    t = Table(title="LLM cost per 1,000 commits (paper: 2 calls + phase 2 for disagreements)")
    for col in ("", "calls", "prompt tokens", "recall kept"):
        t.add_column(col, justify="right" if col else "left")
    t.add_row(
        "paper's vote", f"{c['paper_calls_per_1000']:.0f}", f"{c['paper_prompt_tokens_per_1000']:,}", "1.000"
    )
    t.add_row(
        "cascade",
        f"{c['cascade_calls_per_1000']:.0f} ({c['calls_ratio']:.2f}x)",
        f"{c['cascade_prompt_tokens_per_1000']:,}",
        f"{c['recall_kept']:.3f}",
    )
    how = "measured" if c["phase2_measured"] else "assumed"
    t.caption = (
        f"phase-2 share {c['phase2_share']:.2f} ({how}); cascade asks {c['asked_share']:.1%} of commits"
    )
    return t


def _crossval_table(cv: dict[str, Any]) -> Table:
    s = cv["summary"]
    t = Table(
        title=f"no-model scorers, {s['folds']} folds over repositories (mean ± sd over folds with positives)"
    )
    for col in ("population", "scorer", "precision", "recall", "F1", "pooled P / R / F1"):
        t.add_column(col, justify="right" if col not in ("population", "scorer") else "left")
    for pop, p in s["populations"].items():
        label = f"{pop} ({p['positives']}/{p['commits']})"
        for name, m in p["scorers"].items():
            pooled = m["pooled"]
            t.add_row(
                label,
                "rules (heuristic)" if name == "rules" else f"trained: {name}",
                *(f"{m[k]['mean']:.3f} ± {m[k]['sd']:.3f}" for k in ("precision", "recall", "f1")),
                f"{pooled['precision']:.3f} / {pooled['recall']:.3f} / {pooled['f1']:.3f}",
            )
            label = ""
    g = s["gate"]
    mined = "" if g["mined_passed_share"] is None else f", mined commits passed {g['mined_passed_share']:.1%}"
    t.caption = (
        f"cascade gate on held-out repositories: passed {g['passed_share']:.1%}, "
        f"recall kept {g['recall_kept']:.3f}{mined}"
    )
    return t


def _gate_curve_table(cv: dict[str, Any]) -> Table:
    t = Table(title="cascade gate on held-out repositories, by the recall it was set for")
    cols = ("set for", "labelled passed", "labelled recall", "mined passed", "CppPerf-DB recall")
    for col in cols:
        t.add_column(col, justify="right")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    for row in cv["summary"]["gate_curve"]:
        t.add_row(
            f"{row['gate_recall_target']:.2f}",
            pct(row["passed_share"]),
            f"{row['recall_kept']:.3f}",
            pct(row["mined_passed_share"]),
            "-" if row["cppperf_db_recall_kept"] is None else f"{row['cppperf_db_recall_kept']:.3f}",
        )
    return t


def _targets_line(t: dict[str, Any]) -> str:
    nm, c = t["no_model"], t["cascade"]

    def yes(b: bool) -> str:
        return "met" if b else "not met"

    gates = ", ".join(f"{g:.2f}" for g in c["met_at_gates"])
    met_by = [
        f"{name} on {pop}"
        for pop, scorers in nm.get("by_population", {}).items()
        for name, ok in scorers.items()
        if ok
    ]
    return (
        f"targets: no-model F1 >= {nm['f1_min']} at precision >= {nm['precision_min']} (means over folds): "
        f"trained scorer {yes(nm['model_met'])}, rules {yes(nm['heuristic_met'])} on the labelled commits; "
        f"met by {', '.join(met_by) if met_by else 'no scorer on any population'}; "
        f"cascade <= {c['calls_ratio_max']}x calls keeping >= {c['recall_min']} of positives: "
        + (f"met at gate {gates}" if gates else "not met")
    )


@classify_app.command("negatives")
def classify_negatives(
    repo: Annotated[Path, typer.Option("--repo", help="local clone (bare is fine)")],
    name: Annotated[str, typer.Option("--name", help="owner/name recorded with each commit")],
    limit: Annotated[int, typer.Option("--limit", help="at most this many commits")] = 150,
    db: Annotated[
        Path | None, typer.Option("--db", help="CppPerf-DB folder: its commits are left out")
    ] = None,
    labels: Annotated[
        list[Path] | None,
        typer.Option(
            "--labels", metavar="FILE", help="labelled JSONL: its commits are left out (repeatable)"
        ),
    ] = None,
    config: Config = None,
) -> None:
    """Structurally selected commits of a clone as negative training rows (JSONL on stdout).

    \b
    Example:
      cppperf classify negatives --repo ~/src/fmt --name fmtlib/fmt --db ../shared/data/cppperf-db > fmt.jsonl
    """
    import subprocess

    from cppperf.classifier.corpus import load_cppperf_db, load_labelled, mine_negatives

    s = _settings(config)
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        raise typer.BadParameter(f"{repo} is not a git repository", param_hint="--repo")
    try:
        skip = {e.sha for e in load_cppperf_db(db)} if db else set()
        for f in labels or []:
            skip |= {e.sha for e in load_labelled(f)}
        rows = 0
        for row in mine_negatives(repo, name, s.mining, limit=limit, exclude=skip):
            sys.stdout.write(json.dumps(row) + "\n")
            rows += 1
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        raise _fail(exc) from exc
    if not rows:  # an unreadable git directory walks as an empty history: say so rather than write nothing
        console.print(
            f"[yellow]no structurally selected commits in {repo}[/] (history empty or unreadable by git, "
            f"or nothing between mining.since {s.mining.since} and mining.until {s.mining.until})"
        )


@classify_app.command("train")
def classify_train(
    db: Annotated[Path, typer.Option("--db", help="CppPerf-DB folder (positives)")],
    negatives: Annotated[
        list[Path] | None,
        typer.Option(
            "--negatives", metavar="FILE", help="JSONL of negatives, e.g. from `classify negatives`"
        ),
    ] = None,
    labels: Annotated[
        list[Path] | None,
        typer.Option("--labels", metavar="FILE", help="hand-labelled JSONL to train on as well (repeatable)"),
    ] = None,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="default: the model shipped in the package")
    ] = None,
    gate_recall: Annotated[
        float,
        typer.Option(
            "--gate-recall", min=0.01, max=1.0, help="share of held-out positives the cascade gate keeps"
        ),
    ] = 0.95,
) -> None:
    """Train the scorer (no-model backend `model` and the cascade's gate) and write its JSON.

    Thresholds are chosen on held-out repositories inside the training data: the gate for recall,
    the label threshold for F1. Same inputs, same file.

    \b
    Example:
      cppperf classify train --db ../shared/data/cppperf-db --negatives mined.jsonl
    """
    from cppperf.classifier.corpus import load_cppperf_db, load_labelled
    from cppperf.services.classifier.scorer import MODEL_PATH, TrainConfig, train

    try:
        examples = load_cppperf_db(db)
        for f in negatives or []:
            examples += load_labelled(f, source="mined")
        for f in labels or []:
            examples += load_labelled(f)
        with console.status(f"training on {len(examples)} commits"):
            model = train(examples, TrainConfig(gate_recall=gate_recall))
        target = out_path or MODEL_PATH
        write_atomic(target, model.to_json())  # whole or not at all: it may be the shipped model
    except (OSError, ValueError) as exc:
        raise _fail(exc) from exc
    src = ", ".join(f"{k} {v}" for k, v in model.meta["sources"].items())
    out.print(
        f"wrote {target}: {len(model.weights)} weights from {model.meta['examples']} commits ({src}) in "
        f"{model.meta['repositories']} repositories; gate {model.gate_threshold:.3f}, label {model.label_threshold:.3f}"
    )
