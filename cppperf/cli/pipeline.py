"""`mine`, `serve`, `status`, `dlq`, `filter`: running and watching the pipeline."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from cppperf.cli.common import Config, NatsUrl, _fail, _settings, app, console, out
from cppperf.funnel import Funnel, compute_funnel
from cppperf.shared.errors import CppPerfError
from cppperf.shared.settings import Settings

dlq_app = typer.Typer(help="Dead letters: `cppperf dlq list`, `cppperf dlq replay commit.selected`.")
app.add_typer(dlq_app, name="dlq")


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
    from cppperf.services.crawler.app import submit
    from cppperf.shared.bus import wait_drained

    async with run_services(settings, url, list(CONSUMING_SERVICES)) as running:
        ctx = running.ctx
        report = await submit(ctx, specs, validate=settings.mining.validate_latest)
        if search:
            from cppperf.services.crawler.app import crawl_search
            from cppperf.shared.github import GitHubClient

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
            from cppperf.services.crawler.app import submit

            async with connect(s, url) as ctx:
                report = await submit(ctx, list(s.mining.repos), validate=s.mining.validate_latest)
                if s.mining.search:
                    from cppperf.services.crawler.app import crawl_search
                    from cppperf.shared.github import GitHubClient

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
    from cppperf.services.filter.rules import Rules
    from cppperf.services.filter.walk import walk

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
