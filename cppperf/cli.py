"""`cppperf`: the one command-line entry point (Typer + rich).

Examples:
  cppperf demo init /tmp/demo                 # a small real C++/CMake repo with perf commits
  cppperf mine --repo /tmp/demo --runs 11     # whole pipeline on embedded NATS
  cppperf filter --repo /tmp/demo --explain   # structural rules only, no bus
  cppperf build --repo /tmp/demo --sha HEAD~3 # prove one commit, no bus
  cppperf classify eval --labels dev.jsonl    # classifier quality on labelled commits
  cppperf status                              # per stage: pending, in flight, done, dead-lettered
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cppperf.funnel import Funnel, compute_funnel
from shared.errors import ConfigError, CppPerfError
from shared.logging import configure_logging
from shared.settings import Settings, load_settings

app = typer.Typer(
    help=__doc__,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
dlq_app = typer.Typer(help="Dead letters: `cppperf dlq list`, `cppperf dlq replay commit.selected`.")
demo_app = typer.Typer(help="Demo data: `cppperf demo init DIR` creates a small C++/CMake git repo.")
app.add_typer(dlq_app, name="dlq")
app.add_typer(demo_app, name="demo")
console = Console(stderr=True)
out = Console()

NatsUrl = Annotated[
    str | None,
    typer.Option(
        "--nats-url", envvar="CPPPERF_NATS_URL", help="NATS server; embedded nats-server when absent"
    ),
]
Config = Annotated[Path | None, typer.Option("--config", envvar="CPPPERF_CONFIG", help="cppperf.toml path")]


def _settings(config: Path | None, **overrides: Any) -> Settings:
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        section, _, name = key.partition("__")
        if name:
            clean.setdefault(section, {})[name] = value
        else:
            clean[key] = value
    try:
        s = load_settings(config, **clean)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    configure_logging(s.log_level)
    return s


def _fail(exc: BaseException) -> typer.Exit:
    console.print(f"[red]error:[/red] {exc}")
    return typer.Exit(1)


# ------------------------------------------------------------------------------------------ mine
def _status_table(rows: list[Any], title: str = "pipeline") -> Table:
    t = Table(title=title)
    for col in ("subject", "consumer", "published", "pending", "in flight", "done", "dead-lettered"):
        t.add_column(col, justify="left" if col in ("subject", "consumer") else "right")
    for r in rows:
        t.add_row(
            r.subject,
            r.consumer,
            str(r.published),
            str(r.pending),
            str(r.in_flight),
            str(r.done),
            str(r.dead_lettered),
        )
    return t


def _funnel_table(f: Funnel, per: dict[str, Funnel]) -> Table:
    t = Table(title="funnel")
    cols = ["repo", "scanned", "structural", "classified", "positive", "built", "improved", "rejected builds"]
    for c in cols:
        t.add_column(c, justify="left" if c == "repo" else "right")
    for name, x in [*sorted(per.items()), ("TOTAL", f)]:
        t.add_row(
            name,
            str(x.scanned),
            str(x.selected),
            str(x.classified),
            str(x.positive),
            str(x.built),
            str(x.improved),
            str(x.rejected_builds),
        )
    return t


async def _mine(
    settings: Settings, url: str, specs: list[str], as_json: bool, search: bool
) -> dict[str, Any]:
    from cppperf.runtime import CONSUMING_SERVICES, run_services
    from services.crawler.app import submit
    from shared.bus import wait_drained

    async with run_services(settings, url, list(CONSUMING_SERVICES)) as running:
        ctx = running.ctx
        report = await submit(ctx, specs, validate=settings.mining.validate_latest)
        if search:
            from services.crawler.app import crawl_search
            from shared.github import GitHubClient

            found = await crawl_search(
                ctx, GitHubClient(settings.github), validate=settings.mining.validate_latest
            )
            report.published += found.published
            report.rejected.update(found.rejected)
        for repo, why in report.rejected.items():
            console.print(f"[yellow]rejected[/yellow] {repo}: {why}")
        if as_json:
            await wait_drained(ctx.bus)
        else:
            with Live(
                _status_table(await ctx.bus.subject_status()), console=console, refresh_per_second=4
            ) as live:
                drained = asyncio.create_task(wait_drained(ctx.bus, poll=0.5))
                while not drained.done():
                    live.update(_status_table(await ctx.bus.subject_status()))
                    await asyncio.sleep(0.5)
                await drained
                live.update(_status_table(await ctx.bus.subject_status()))
        total, per, reasons = await compute_funnel(ctx.store)
        instances = await ctx.store.all("instances")
        if not as_json:
            out.print(_funnel_table(total, per))
            for reason, n in reasons.items():
                out.print(f"[yellow]repos rejected ({n})[/yellow]: {reason}")
            for rec in sorted(instances, key=lambda r: str(r.get("id"))):
                out.print(
                    f"{rec['id']}: {rec.get('verdict')} {rec.get('improved_tests') or ''} "
                    f"{rec.get('failure_category') or ''} → {rec.get('record_path')}"
                )
        return {
            "funnel": total.as_dict(),
            "per_repo": {k: v.as_dict() for k, v in per.items()},
            "repo_rejections": reasons,
            "submitted": report.published,
            "rejected": report.rejected,
            "instances": instances,
        }


@app.command()
def mine(
    repo: Annotated[
        list[str] | None, typer.Option("--repo", help="OWNER/NAME, git URL or local path")
    ] = None,
    search: Annotated[
        bool, typer.Option("--search", help="enumerate GitHub: C++, >= --min-stars, no forks or archived")
    ] = False,
    min_stars: Annotated[int | None, typer.Option("--min-stars")] = None,
    since: Annotated[str | None, typer.Option("--since")] = None,
    until: Annotated[str | None, typer.Option("--until")] = None,
    max_files: Annotated[int | None, typer.Option("--max-files")] = None,
    classifier: Annotated[str | None, typer.Option("--classifier", help="heuristic|openai|vllm")] = None,
    builder: Annotated[str | None, typer.Option("--builder", help="local|docker")] = None,
    runs: Annotated[
        int | None, typer.Option("--runs", help="timing rounds per side (first discarded)")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="instances are written to OUT/instances/")
    ] = None,
    no_validate: Annotated[
        bool, typer.Option("--no-validate", help="skip building the latest commit first")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as one JSON object")] = False,
    nats_url: NatsUrl = None,
    config: Config = None,
) -> None:
    """Run the whole pipeline until drained, then print the funnel.

    Example: cppperf mine --repo /tmp/demo --runs 11 --out results
    """
    if not repo and not search:
        raise typer.BadParameter("give at least one --repo, or --search", param_hint="--repo")
    s = _settings(
        config,
        nats_url=nats_url,
        out_dir=str(out_dir) if out_dir else None,
        mining__min_stars=min_stars,
        mining__since=since,
        mining__until=until,
        mining__max_files=max_files,
        mining__validate_latest=False if no_validate else None,
        classifier__backend=classifier,
        builder__backend=builder,
        builder__runs=runs,
    )
    from cppperf.runtime import nats_endpoint

    try:
        with nats_endpoint(s) as url:
            result = asyncio.run(_mine(s, url, list(repo or []), as_json, search))
    except CppPerfError as exc:
        raise _fail(exc) from exc
    if as_json:
        out.print_json(json.dumps(result, default=str))


# ------------------------------------------------------------------------------------------ serve
@app.command()
def serve(
    service: Annotated[str, typer.Argument(help="crawler|filter|classifier|builder|evaluator")],
    nats_url: NatsUrl = None,
    config: Config = None,
) -> None:
    """Run one long-running service (scale out by starting more of them).

    Example: CPPPERF_NATS_URL=nats://nats:4222 cppperf serve builder
    """
    from cppperf.runtime import ALL_SERVICES, NOT_YET, connect, nats_endpoint, run_services

    if service not in ALL_SERVICES:
        raise typer.BadParameter(f"unknown service {service!r}; one of {', '.join(ALL_SERVICES)}")
    if service in NOT_YET:
        console.print(f"{NOT_YET[service]}")
        raise typer.Exit(2)
    s = _settings(config, nats_url=nats_url)

    async def main(url: str) -> None:
        if service == "crawler":
            from services.crawler.app import submit

            async with connect(s, url) as ctx:
                report = await submit(ctx, list(s.mining.repos), validate=s.mining.validate_latest)
                if s.mining.search:
                    from services.crawler.app import crawl_search
                    from shared.github import GitHubClient

                    found = await crawl_search(ctx, GitHubClient(s.github), validate=s.mining.validate_latest)
                    report.published += found.published
                    report.rejected.update(found.rejected)
                console.print(f"published {len(report.published)}, rejected {len(report.rejected)}")
            return
        async with run_services(s, url, [service]):
            console.print(f"{service} running; Ctrl-C to stop")
            await asyncio.Event().wait()

    try:
        with nats_endpoint(s) as url:
            asyncio.run(main(url))
    except KeyboardInterrupt:
        console.print("stopped")


# ------------------------------------------------------------------------------------------ status / dlq
@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json")] = False, nats_url: NatsUrl = None, config: Config = None
) -> None:
    """Per subject: published, pending, in flight, done, dead-lettered; then the funnel."""
    from cppperf.runtime import connect, nats_endpoint

    s = _settings(config, nats_url=nats_url)

    async def main(url: str) -> dict[str, Any]:
        async with connect(s, url) as ctx:
            rows = await ctx.bus.subject_status()
            total, per, reasons = await compute_funnel(ctx.store)
            if not as_json:
                out.print(_status_table(rows, "status"))
                out.print(_funnel_table(total, per))
                for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
                    out.print(f"repos rejected ({n}): {reason}")
            return {
                "subjects": [r.as_dict() for r in rows],
                "funnel": total.as_dict(),
                "repo_rejections": reasons,
            }

    with nats_endpoint(s) as url:
        result = asyncio.run(main(url))
    if as_json:
        out.print_json(json.dumps(result))


@dlq_app.command("list")
def dlq_list(
    subject: Annotated[str | None, typer.Argument()] = None,
    nats_url: NatsUrl = None,
    config: Config = None,
) -> None:
    """List dead letters (optionally of one subject) with their reason."""
    from cppperf.runtime import connect, nats_endpoint

    s = _settings(config, nats_url=nats_url)

    async def main(url: str) -> None:
        async with connect(s, url) as ctx:
            letters = await ctx.bus.dead_letters(subject)
            t = Table(title=f"dead letters ({len(letters)})")
            for c in ("seq", "subject", "service", "attempts", "error", "failed at"):
                t.add_column(c)
            for rec in letters:
                L = rec.letter
                t.add_row(str(rec.seq), L.subject, L.service, str(L.attempts), L.error[:120], L.failed_at)
            out.print(t)

    with nats_endpoint(s) as url:
        asyncio.run(main(url))


@dlq_app.command("replay")
def dlq_replay(
    subject: Annotated[str, typer.Argument()], nats_url: NatsUrl = None, config: Config = None
) -> None:
    """Put every dead letter of SUBJECT back on it (and remove it from the DLQ)."""
    from cppperf.runtime import connect, nats_endpoint

    s = _settings(config, nats_url=nats_url)

    async def main(url: str) -> int:
        async with connect(s, url) as ctx:
            return await ctx.bus.replay(subject)

    with nats_endpoint(s) as url:
        n = asyncio.run(main(url))
    out.print(f"replayed {n} message(s) onto {subject}")


# ------------------------------------------------------------------------------------------ filter
@app.command("filter")
def filter_cmd(
    repo: Annotated[Path, typer.Option("--repo", help="local git repository")],
    since: Annotated[str | None, typer.Option("--since")] = None,
    until: Annotated[str | None, typer.Option("--until")] = None,
    max_files: Annotated[int | None, typer.Option("--max-files")] = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="also list rejected commits with the reason")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    config: Config = None,
) -> None:
    """Apply the structural rules to a local repository's history (no bus).

    Example: cppperf filter --repo ~/src/fmt --since 2022-01-01 --explain
    """
    from services.filter.rules import Rules
    from services.filter.walk import walk

    s = _settings(config, mining__since=since, mining__until=until, mining__max_files=max_files)
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        raise typer.BadParameter(f"{repo} is not a git repository", param_hint="--repo")
    result = walk(repo, Rules.from_settings(s.mining), explain=explain)
    rows: list[tuple[Any, str | None]] = [(c, None) for c in result.selected]
    rows += [(c, r.value) for c, r in result.rejections]
    rows.sort(key=lambda cr: cr[0].date)
    for c, reason in rows:
        if as_json:
            sys.stdout.write(
                json.dumps(
                    {
                        "sha": c.sha,
                        "date": c.date.isoformat(),
                        "files": c.paths,
                        "subject": c.message.splitlines()[0] if c.message else "",
                        "selected": reason is None,
                        "reason": reason,
                    }
                )
                + "\n"
            )
        else:
            mark = "[green]selected[/green]" if reason is None else f"[dim]{reason}[/dim]"
            out.print(
                f"{c.sha[:12]} {c.date.date()} {mark} {len(c.paths)} file(s) "
                f"{(c.message.splitlines() or [''])[0][:70]}"
            )
    summary = {"scanned": result.scanned, "selected": len(result.selected), "rejected": dict(result.rejected)}
    if as_json:
        sys.stdout.write(json.dumps({"summary": summary}) + "\n")
    else:
        out.print(
            f"scanned {summary['scanned']}, selected {summary['selected']}, rejected {summary['rejected']}"
        )


# ------------------------------------------------------------------------------------------ build / calibrate
def _commit_from_repo(repo: Path, sha: str, parent: str | None) -> Any:
    from services.filter.links import LinkResolver
    from services.filter.select import to_message
    from services.filter.walk import CommitHeader, commit_details, iter_commits

    full = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", sha], capture_output=True, text=True, check=False
    )
    if full.returncode != 0:
        raise typer.BadParameter(f"unknown commit {sha}", param_hint="--sha")
    full_sha = full.stdout.strip()
    header = next(iter_commits(repo, f"{full_sha}^!" if parent is None else full_sha), None)
    if header is None or header.sha != full_sha:
        raise typer.BadParameter(f"cannot read commit {sha}", param_hint="--sha")
    if parent is not None:
        p = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", parent], capture_output=True, text=True, check=False
        )
        header = CommitHeader(
            header.sha, (p.stdout.strip(),), header.date, header.author, header.message, header.changes
        )
    if not header.parents:
        raise typer.BadParameter(f"{sha} is a root commit: give --parent", param_hint="--parent")
    details = next(commit_details(repo, [header]))
    resolved = repo.resolve()
    return to_message(f"local/{resolved.name}", str(resolved), header, details, LinkResolver())


def _phase_progress() -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn("{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    tasks: dict[str, Any] = {}

    def on_phase(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total)
        progress.update(tasks[phase], completed=done, total=total)

    return progress, on_phase


def _print_instance(record: dict[str, Any]) -> None:
    c = record["cppperf"]
    t = Table(title=f"{c['instance_id']}: {c['verdict']} (paper rule: {c['verdict_paper_rule']})")
    for col in (
        "test",
        "old median ms",
        "new median ms",
        "change",
        "ratio 95% CI",
        "p (BH)",
        "ours",
        "paper",
    ):
        t.add_column(col)
    for ts in c["tests"]:
        t.add_row(
            ts["name"],
            f"{ts['median_old'] * 1e3:.2f}",
            f"{ts['median_new'] * 1e3:.2f}",
            f"{ts['median_change'] * 100:+.1f}%",
            f"{ts['ratio']:.3f} [{ts['ci_low']:.3f}, {ts['ci_high']:.3f}]",
            f"{ts['p_improve_adj']:.2g}",
            "improved" if ts["improved"] else ("regressed" if ts["regressed"] else "-"),
            "improved" if ts["paper_improved"] else ("regressed" if ts["paper_regressed"] else "-"),
        )
    out.print(t)
    if c["failure_category"]:
        out.print(f"[red]rejected ({c['failure_category']})[/red]: {c['failure_detail'][:1500]}")
    if c["missing_packages"]:
        out.print(f"missing Debian packages: {' '.join(c['missing_packages'])}")
    if c.get("rounds_saved_by_early_stop"):
        out.print(f"early stop saved {c['rounds_saved_by_early_stop']} test rounds")


@app.command()
def reproduce(
    image: Annotated[str, typer.Argument(help="instance image, e.g. cppperf/owner__name:<sha12>")],
    runs: Annotated[int | None, typer.Option("--runs")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: Config = None,
) -> None:
    """Re-run an instance's timing protocol from its image alone (docker backend) and compare.

    Example: cppperf reproduce cppperf/local__demo:441aadcc50b6 --runs 21
    """
    from services.builder.reproduce import reproduce_image

    s = _settings(
        config, out_dir=str(out_dir) if out_dir else None, builder__runs=runs, builder__backend="docker"
    )
    progress, on_phase = _phase_progress()
    try:
        with progress:
            result = reproduce_image(image, s.builder, work_dir=s.work_dir(), on_phase=on_phase)
    except CppPerfError as exc:
        raise _fail(exc) from exc
    if as_json:
        out.print_json(json.dumps(result, default=str))
    else:
        out.print(
            f"{image}: recorded verdict {result['recorded_verdict']}, reproduced {result['verdict']} "
            f"({'same' if result['same_verdict'] else 'DIFFERENT'}); improved tests {result['improved_tests']}"
        )


@app.command()
def build(
    repo: Annotated[Path, typer.Option("--repo", help="local git repository")],
    sha: Annotated[str, typer.Option("--sha", help="the commit to prove")],
    parent: Annotated[
        str | None, typer.Option("--parent", help="compare against this instead of SHA^")
    ] = None,
    runs: Annotated[int | None, typer.Option("--runs")] = None,
    builder: Annotated[str | None, typer.Option("--builder", help="local|docker")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="keep the workspace")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: Config = None,
) -> None:
    """Build and time one commit against its parent (no bus); writes OUT/instances/<id>.json.
    With --builder docker, the instance image cppperf/<owner>__<name>:<sha12> is committed.

    Example: cppperf build --repo /tmp/demo --sha HEAD~12 --runs 11
    """
    from services.builder.service import build_patch

    s = _settings(
        config,
        out_dir=str(out_dir) if out_dir else None,
        builder__runs=runs,
        builder__backend=builder,
        builder__keep=keep or None,
    )
    commit = _commit_from_repo(repo, sha, parent)
    progress, on_phase = _phase_progress()
    try:
        with progress:
            built = build_patch(
                commit,
                repo.resolve(),
                s.builder,
                work_dir=s.work_dir(),
                out_dir=Path(s.out_dir),
                on_phase=on_phase,
            )
    except CppPerfError as exc:
        raise _fail(exc) from exc
    if as_json:
        out.print_json(json.dumps(built.record["cppperf"], default=str))
    else:
        _print_instance(built.record)
        out.print(f"record: {built.path}")


@app.command()
def calibrate(
    repo: Annotated[Path, typer.Option("--repo")],
    sha: Annotated[str, typer.Option("--sha")],
    runs: Annotated[int | None, typer.Option("--runs")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: Config = None,
) -> None:
    """A/A run: SHA against itself. Any test flagged is a false positive on this machine."""
    from services.builder.backend import LocalBackend
    from services.builder.instance import prove
    from services.builder.service import build_spec

    s = _settings(config, builder__runs=runs)
    commit = _commit_from_repo(repo, sha, sha)
    settings = msgspec.structs.replace(s.builder, confirm=False)
    backend = LocalBackend(
        s.work_dir() / "calibrate",
        build_spec(settings),
        dict(settings.thread_env),
        sandbox=settings.sandbox,
        output_limit=settings.output_limit,
    )

    class _Different(LocalBackend):
        def binaries_identical(self, tests: list[str]) -> bool:
            return False  # A/A: identical on purpose; time them anyway

    backend = _Different(**{k: getattr(backend, k) for k in backend.__dataclass_fields__})
    progress, on_phase = _phase_progress()
    try:
        with progress:
            res = prove(commit, repo.resolve(), backend, settings, on_phase=on_phase)
    finally:
        backend.cleanup()
    flagged_ours = [t.name for t in res.tests if t.improved or t.regressed]
    flagged_paper = [t.name for t in res.tests if t.paper_improved or t.paper_regressed]
    result = {
        "tests": len(res.tests),
        "flagged_ours": flagged_ours,
        "flagged_paper_rule": flagged_paper,
        "verdict": res.verdict,
        "failure": res.failure_detail,
    }
    if as_json:
        out.print_json(json.dumps(result))
    else:
        out.print(
            f"A/A on {sha}: {len(res.tests)} tests; flagged by our rule: {flagged_ours or 'none'}; "
            f"by the paper's rule: {flagged_paper or 'none'}"
        )


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
    from services.classifier.service import Classifier

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
    labels: Annotated[Path, typer.Option("--labels", help="JSONL with message, diff, manual_label")],
    backend: Annotated[str | None, typer.Option("--backend")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Confusion matrix, precision/recall/F1, prefilter recall and pruned share, calls, tokens, time.

    Example: cppperf classify eval --labels ../shared/data/commit-labels/dev.jsonl
    """
    from services.classifier.evaluate import evaluate, load_labels
    from services.classifier.service import Classifier

    parent = ctx.obj or {}
    s = _settings(parent.get("config"), classifier__backend=backend or parent.get("backend"))
    try:
        rows = load_labels(labels)
    except (OSError, ValueError) as exc:
        raise _fail(exc) from exc
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


# ------------------------------------------------------------------------------------------ not yet
def _not_yet(what: str, issue: str) -> None:
    console.print(f"`cppperf {what}` is not yet available (issue: {issue}).")
    raise typer.Exit(2)


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
    from shared import messages as msgs

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
    from services.evaluator.evaluate import EvalRequest, summarize
    from services.evaluator.evaluate import evaluate as evaluate_one

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
            from services.evaluator.evaluate import _write, run_dir

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


dataset_app = typer.Typer(
    help="Instances on disk (OUT/instances): import, export, inspect, list, report, stats."
)
app.add_typer(dataset_app, name="dataset")
OutDir = Annotated[
    Path | None, typer.Option("--out", help="the instance store directory (default settings.out_dir)")
]


def _filters(
    repo: str | None,
    significant_only: bool,
    since: str | None,
    until: str | None,
    multi_file: bool,
    single_file: bool,
) -> Any:
    from cppperf.dataset.records import Filters

    if multi_file and single_file:
        raise typer.BadParameter("--multi-file and --single-file exclude each other")
    return Filters(
        repo=repo,
        significant_only=significant_only,
        since=since,
        until=until,
        files="multi" if multi_file else ("single" if single_file else None),
    )


@dataset_app.command("import")
def dataset_import(
    sources: Annotated[list[Path], typer.Argument(help="CppPerf-DB JSON files or directories of them")],
    out_dir: OutDir = None,
    config: Config = None,
) -> None:
    """Import published CppPerf-DB files unchanged (bad files reported and skipped; idempotent).

    Example: cppperf dataset import ../shared/data/cppperf-db/entries
    """
    from cppperf.dataset.records import import_files

    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    rep = import_files(sources, Path(s.out_dir))
    for path, why in rep.errors.items():
        console.print(f"[yellow]skipped[/yellow] {path}: {why}")
    out.print(
        f"imported {len(rep.imported)}, unchanged {len(rep.unchanged)}, skipped {len(rep.errors)} "
        f"→ {Path(s.out_dir) / 'instances'}"
    )


@dataset_app.command("export")
def dataset_export(
    target: Annotated[Path, typer.Argument(help="JSONL file (jsonl) or directory (cppperf-db)")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl | cppperf-db")] = "jsonl",
    repo: Annotated[str | None, typer.Option("--repo")] = None,
    significant_only: Annotated[bool, typer.Option("--significant-only")] = False,
    since: Annotated[str | None, typer.Option("--since")] = None,
    until: Annotated[str | None, typer.Option("--until")] = None,
    multi_file: Annotated[bool, typer.Option("--multi-file")] = False,
    single_file: Annotated[bool, typer.Option("--single-file")] = False,
    out_dir: OutDir = None,
    config: Config = None,
) -> None:
    """Export instances: SWE-bench-like JSONL for agents, or files in the published format.

    Example: cppperf dataset export --format jsonl --significant-only tasks.jsonl
    """
    from cppperf.dataset.records import iter_records, swebench_row, to_published

    if fmt not in ("jsonl", "cppperf-db"):
        raise typer.BadParameter("--format is jsonl or cppperf-db")
    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    flt = _filters(repo, significant_only, since, until, multi_file, single_file)
    records = [r for r in iter_records(Path(s.out_dir)) if flt.match(r)]
    if fmt == "jsonl":
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(json.dumps(swebench_row(r)) + "\n" for r in records))
    else:
        target.mkdir(parents=True, exist_ok=True)
        for r in records:
            name = f"{r['metadata']['repository_name'].replace('/', '_')}_{r['commit_info']['new_sha']}.json"
            (target / name).write_text(json.dumps(to_published(r), indent=2))
    out.print(f"exported {len(records)} instance(s) to {target}")


@dataset_app.command("list")
def dataset_list(
    repo: Annotated[str | None, typer.Option("--repo")] = None,
    significant_only: Annotated[bool, typer.Option("--significant-only")] = False,
    since: Annotated[str | None, typer.Option("--since")] = None,
    until: Annotated[str | None, typer.Option("--until")] = None,
    multi_file: Annotated[bool, typer.Option("--multi-file")] = False,
    single_file: Annotated[bool, typer.Option("--single-file")] = False,
    out_dir: OutDir = None,
    config: Config = None,
) -> None:
    """A table of instances (filters as for export)."""
    from cppperf.dataset.records import is_significant, iter_records

    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    flt = _filters(repo, significant_only, since, until, multi_file, single_file)
    t = Table(title="instances")
    for c in ("instance", "date", "files", "+/-", "verdict", "improved tests"):
        t.add_column(c)
    n = 0
    for r in iter_records(Path(s.out_dir)):
        if not flt.match(r):
            continue
        n += 1
        ci = r["commit_info"]
        t.add_row(
            r["cppperf"]["instance_id"],
            str(ci.get("commit_date", ""))[:10],
            str(len(ci["files_changed"])),
            f"+{ci.get('lines_added', 0)}/-{ci.get('lines_removed', 0)}",
            "[green]improved[/green]" if is_significant(r) else str(r["cppperf"].get("verdict")),
            str((r.get("tests") or {}).get("significant_improvements", 0)),
        )
    out.print(t)
    out.print(f"{n} instance(s)")


@dataset_app.command("inspect")
def dataset_inspect(
    instance: Annotated[str, typer.Argument()], out_dir: OutDir = None, config: Config = None
) -> None:
    """Commit, files, verdict, the improved/regressed tests with change and CI, build facts."""
    from cppperf.dataset.records import RecordError, load_record
    from cppperf.dataset.report import _test_rows

    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    try:
        r = load_record(Path(s.out_dir), instance)
    except RecordError as exc:
        raise _fail(exc) from exc
    ci, ours = r["commit_info"], r["cppperf"]
    out.print(
        f"[bold]{ours['instance_id']}[/bold]  {r['metadata']['repository_name']} {ci['old_sha'][:12]} → "
        f"{ci['new_sha'][:12]}  ({str(ci.get('commit_date', ''))[:10]})"
    )
    out.print(
        f"verdict: [bold]{ours.get('verdict')}[/bold] (paper's rule: {ours.get('verdict_paper_rule')})"
        + (
            f"; {ours.get('failure_category')}: {ours.get('failure_detail', '')[:300]}"
            if ours.get("failure_category")
            else ""
        )
    )
    out.print("message: " + " ".join(ci.get("commit_message") or [])[:500])
    for f in ci.get("files_changed") or []:
        out.print(
            f"  {f.get('status', ''):9} {f['filename']} +{f.get('additions', 0)}/-{f.get('deletions', 0)}"
        )
    t = Table(title="changed tests")
    for c in ("test", "change", "speed-up 95% CI", "p", "result"):
        t.add_column(c)
    for row in _test_rows(r):
        if row["improved"] or row["regressed"]:
            ci_txt = f"[{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]" if row["ci"] else "-"
            t.add_row(
                row["name"],
                f"{(row['change'] or 0) * 100:+.1f}%",
                ci_txt,
                f"{row['p']:.2g}" if isinstance(row["p"], (int, float)) else "-",
                "improved" if row["improved"] else "regressed",
            )
    out.print(t)
    bi = r.get("build_info") or {}
    out.print(f"build: {bi.get('build_system', '')}; {' && '.join(bi.get('new_build_script') or [])[:300]}")
    env = ours.get("environment") or {}
    if env:
        out.print(
            f"environment: {env.get('cpu_model', '')}, {env.get('build_type', '')}, seed {ours.get('seed')}"
        )


@dataset_app.command("report")
def dataset_report(
    target: Annotated[Path, typer.Argument(help="instance id, or OUT.html with --all")],
    output: Annotated[Path | None, typer.Argument(help="OUT.html (with an instance id)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="the dataset overview")] = False,
    out_dir: OutDir = None,
    config: Config = None,
) -> None:
    """Static HTML report with inline SVG plots (no network needed to view it).

    Examples: cppperf dataset report --all overview.html; cppperf dataset report ID report.html
    """
    from cppperf.dataset.records import RecordError, iter_records, load_record
    from cppperf.dataset.report import instance_section, overview_section, page

    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    if all_:
        html_text = page("cppperf dataset", overview_section(list(iter_records(Path(s.out_dir)))))
        dest = output or target
    else:
        if output is None:
            raise typer.BadParameter("give the output file: cppperf dataset report ID OUT.html")
        try:
            html_text = page(str(target), instance_section(load_record(Path(s.out_dir), str(target))))
        except RecordError as exc:
            raise _fail(exc) from exc
        dest = output
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(html_text)
    out.print(f"wrote {dest} ({len(html_text) // 1024} KiB)")


@dataset_app.command("stats")
def dataset_stats(
    as_json: Annotated[bool, typer.Option("--json")] = False, nats_url: NatsUrl = None, config: Config = None
) -> None:
    """The pipeline funnel (scanned → structural → classified positive → built → improved) from the store."""
    from cppperf.runtime import connect, nats_endpoint

    s = _settings(config, nats_url=nats_url)

    async def main(url: str) -> tuple[Funnel, dict[str, Funnel]]:
        async with connect(s, url) as ctx:
            total, per, _ = await compute_funnel(ctx.store)
            return total, per

    with nats_endpoint(s) as url:
        total, per = asyncio.run(main(url))
    if as_json:
        out.print_json(
            json.dumps({"total": total.as_dict(), "per_repo": {k: v.as_dict() for k, v in per.items()}})
        )
    else:
        out.print(_funnel_table(total, per))


images_app = typer.Typer(help="Container images: base images without a registry, pruning.")
app.add_typer(images_app, name="images")


@images_app.command("bootstrap")
def images_bootstrap(
    release: Annotated[
        str, typer.Option("--release", help="Debian release (era): buster … trixie")
    ] = "bookworm",
    mirror: Annotated[
        str, typer.Option("--mirror", help="Debian mirror for debootstrap")
    ] = "http://deb.debian.org/debian",
    force: Annotated[bool, typer.Option("--force", help="rebuild even if present")] = False,
    config: Config = None,
) -> None:
    """debootstrap a minimal root fs with the toolchain and import it as cppperf/base:<release>.

    Example: cppperf images bootstrap --release bookworm
    """
    from services.builder.images import bootstrap_base
    from services.builder.service import docker_client

    s = _settings(config)
    try:
        with console.status(f"debootstrap {release} and import (a few minutes the first time)"):
            name = bootstrap_base(docker_client(s.builder), release, mirror=mirror, force=force)
    except CppPerfError as exc:
        raise _fail(exc) from exc
    out.print(f"base image ready: {name}")


@images_app.command("prune")
def images_prune(config: Config = None) -> None:
    """Remove dangling image layers and stopped cppperf containers."""
    from services.builder.service import docker_client

    s = _settings(config)
    client = docker_client(s.builder)
    removed = 0
    for c in client.containers.list(all=True, filters={"status": "exited"}):
        if str(c.image.tags[:1]).find("cppperf/") >= 0:
            c.remove(force=True)
            removed += 1
    res = client.images.prune(filters={"dangling": True})
    out.print(f"removed {removed} container(s), {len(res.get('ImagesDeleted') or [])} dangling image(s)")


# ------------------------------------------------------------------------------------------ demo
@demo_app.command("init")
def demo_init(path: Annotated[Path, typer.Argument(help="directory to create")]) -> None:
    """Create the demo C++/CMake git repository (perf, no-op, comment-only, regression, … commits)."""
    from cppperf.demo import create_demo_repo

    if path.exists() and any(path.iterdir()):
        raise typer.BadParameter(f"{path} exists and is not empty")
    repo = create_demo_repo(path)
    for kind, sha in repo.shas.items():
        out.print(f"{sha[:12]} {kind}")
    out.print(f"demo repository ready: {path}\ntry: cppperf mine --repo {path} --runs 11")


def main() -> None:
    app()
