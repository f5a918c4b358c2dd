"""`mine`, `serve`, `status`, `dlq`, `filter`: running and watching the pipeline."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cppperf.cli.common import (
    EXIT_FAILURES,
    EXIT_OK,
    EXIT_USAGE,
    AsJson,
    Config,
    NatsUrl,
    OutDir,
    Runs,
    Since,
    Until,
    WholeHelpGroup,
    _fail,
    _settings,
    app,
    cli_nats,
    console,
    out,
    print_json,
    refuse_powerless,
    run_async,
)
from cppperf.cli.repos import check_name, git_repo, local_repo_id, looks_like_path
from cppperf.funnel import Funnel, compute_funnel
from cppperf.shared.buckets import INSTANCES
from cppperf.shared.errors import ConfigError, CppPerfError
from cppperf.shared.logging import configure_logging
from cppperf.shared.settings import Settings

dlq_app = typer.Typer(
    cls=WholeHelpGroup, help="Dead letters: `cppperf dlq list`, `cppperf dlq replay commit.selected`."
)
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


async def _live_view(ctx: Any, settings: Settings) -> Group:
    """The subjects' table and, under it, what the work waits for (cores, claims, the bus)."""
    from cppperf.cli.waiting import describe
    from cppperf.shared.bus import NOT_READY_ERRORS
    from cppperf.shared.claims import KvClaims
    from cppperf.shared.engine.leases import lease_dir, lease_view

    view = lease_view(lease_dir(settings.builder))  # the host's files: known with the bus away too
    table: Table | Text
    try:
        table = _status_table(await ctx.bus.subject_status())
        claims, away = await KvClaims(ctx.store).live(), ctx.bus.lost_since
    except NOT_READY_ERRORS:  # the server is away (nats-py reconnects) or JetStream electing
        if ctx.bus.nc.is_closed:
            raise
        table = Text("queues: not known while the bus is away")
        claims, away = [], ctx.bus.lost_since or time.time()
    lines = describe(view, claims, time.time(), bus_lost_since=away)
    return Group(table, Text("\n".join(lines), no_wrap=True, overflow="ignore"))


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


def _log_file(s: Settings) -> Path:
    """Where a live view's logs go: OUT/.state/logs/<command>-<time>.log."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(s.out_dir) / ".state" / "logs" / f"mine-{stamp}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


async def _drained_while_served(bus: Any, url: str, *, poll: float = 0.2) -> None:
    """`wait_drained`, which waits out a bus outage (a remote server comes back); but when the
    embedded server this process started has exited, nothing will bring it back: say so at once
    in one line, then stop the services (in-flight work gets `bus.stop_grace`) and exit 1."""
    from cppperf.shared.bus import wait_drained
    from cppperf.shared.embedded import exited

    waiting = asyncio.ensure_future(wait_drained(bus, poll=poll))
    try:
        while not waiting.done():
            if (why := exited(url)) is not None:
                console.print(
                    f"error: {why}; stopping (finished work is kept: run mine again)",
                    soft_wrap=True,
                    markup=False,
                    highlight=False,
                )
                raise typer.Exit(EXIT_FAILURES)
            await asyncio.wait({waiting}, timeout=poll)
        waiting.result()
    finally:
        waiting.cancel()


async def _mine(
    settings: Settings,
    url: str,
    specs: list[str],
    repo_ids: dict[str, str],
    as_json: bool,
    search: bool,
    live_view: bool,
    force: list[str],
) -> dict[str, Any]:
    from cppperf.runtime import CONSUMING_SERVICES, run_services
    from cppperf.services.crawler.handlers import submit

    # `builder.validate_gold`: the evaluator gold-validates what the builder proves
    # (`validate.requested`); the drain waits for those validations too
    services = [*CONSUMING_SERVICES, *(["evaluator"] if settings.builder.validate_gold else [])]
    async with run_services(settings, url, services) as running:
        ctx = running.ctx
        if force:
            from cppperf.redo import redo_instances

            for iid, what in (await redo_instances(ctx, force)).items():
                if what != "requeued":
                    raise CppPerfError(f"--force {iid}: {what}")
                console.print(f"{iid}: built again (--force)", soft_wrap=True)
        report = await submit(ctx, specs, validate=settings.mining.validate_latest, repo_ids=repo_ids)
        if search:
            from githubkit.exception import GitHubException

            from cppperf.services.crawler.handlers import crawl_search
            from cppperf.shared.github import GitHubClient

            try:
                found = await crawl_search(
                    ctx, GitHubClient(settings.github), validate=settings.mining.validate_latest
                )
            except (GitHubException, OSError) as exc:
                raise CppPerfError(f"GitHub search failed ({settings.github.api_url}): {exc}") from exc
            report.published += found.published
            report.rejected.update(found.rejected)
        for repo, why in report.rejected.items():
            console.print(f"[yellow]rejected[/yellow] {repo}: {why}", soft_wrap=True)
        if not live_view:
            await _drained_while_served(ctx.bus, url)
        else:
            with Live(await _live_view(ctx, settings), console=console, refresh_per_second=4) as live:
                drained = asyncio.create_task(_drained_while_served(ctx.bus, url, poll=0.5))
                while not drained.done():
                    live.update(await _live_view(ctx, settings))
                    await asyncio.sleep(0.5)
                await drained
                live.update(_status_table(await ctx.bus.subject_status()))
        rows = await ctx.bus.subject_status()
        total, per, reasons = await compute_funnel(ctx.store)
        instances = await ctx.store.all(INSTANCES.name)
        if not as_json:
            out.print(_funnel_table(total, per))
            for reason, n in reasons.items():
                out.print(f"[yellow]repos rejected ({n})[/yellow]: {reason}")
            for rec in sorted(instances, key=lambda r: str(r.get("id"))):
                improved = ", ".join(
                    [*(rec.get("improved_tests") or []), *(rec.get("improved_benchmarks") or [])]
                )
                out.print(
                    f"{rec['id']}: {rec.get('verdict')}{f' ({improved})' if improved else ''} "
                    f"{rec.get('failure_category') or ''} → {rec.get('record_path')}",
                    highlight=False,
                )
        return {
            "funnel": total.as_dict(),
            "per_repo": {k: v.as_dict() for k, v in per.items()},
            "repo_rejections": reasons,
            "submitted": report.published,
            "rejected": report.rejected,
            "dead_lettered": sum(r.dead_lettered for r in rows),
            "instances": instances,
        }


def _repo_ids(specs: list[str], name: str | None) -> dict[str, str]:
    """Check every --repo at parse time; local clones are named by --name or their GitHub origin."""
    from cppperf.services.crawler.sources import candidate_for

    ids: dict[str, str] = {}
    local = [sp for sp in specs if looks_like_path(sp)]
    if name is not None and len(local) != 1:
        raise typer.BadParameter("--name names one local --repo", param_hint="--name")
    for spec in specs:
        if looks_like_path(spec):
            path = git_repo(spec)
            repo_id = local_repo_id(path, name)
            if not repo_id.startswith("local/"):
                ids[spec] = repo_id
            continue
        try:
            candidate_for(spec)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--repo") from None
    return ids


@app.command()
def mine(
    repo: Annotated[
        list[str] | None,
        typer.Option("--repo", metavar="REPO", help="OWNER/NAME, git URL or local path (repeatable)"),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="owner/name of the one local --repo (default: its GitHub origin remote)"),
    ] = None,
    search: Annotated[
        bool, typer.Option("--search", help="enumerate GitHub: C++, >= --min-stars, no forks or archived")
    ] = False,
    min_stars: Annotated[
        int | None,
        typer.Option(
            "--min-stars", min=0, help="with --search: fewest stars a repository needs (default 300)"
        ),
    ] = None,
    since: Since = None,
    until: Until = None,
    max_files: Annotated[
        int | None, typer.Option("--max-files", min=1, help="most files a commit may change (default 20)")
    ] = None,
    classifier: Annotated[str | None, typer.Option("--classifier", help="heuristic|openai|vllm")] = None,
    builder: Annotated[str | None, typer.Option("--builder", help="local|docker")] = None,
    runs: Runs = None,
    out_dir: OutDir = None,
    no_validate: Annotated[
        bool, typer.Option("--no-validate", help="skip building the latest commit first")
    ] = False,
    profile: Annotated[
        str | None, typer.Option("--profile", help="default | paper (Debug build, the paper's rule)")
    ] = None,
    force: Annotated[
        list[str] | None,
        typer.Option(
            "--force",
            metavar="INSTANCE_ID",
            help="build this finished instance again (repeatable; `all`: every instance of --out)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as one JSON object")] = False,
    nats_url: NatsUrl = None,
    config: Config = None,
) -> None:
    """Run the whole pipeline until drained, then print the funnel. Finished repositories and
    commits are not redone (--force INSTANCE_ID redoes one). Exit 1 when messages were
    dead-lettered or every repository was rejected.

    \b
    Examples:
      cppperf mine --repo /tmp/demo --runs 11 --out results
      cppperf mine --repo /tmp/demo --out results --force local__demo-4bda4860cd0d
    """
    if not repo and not search:
        raise typer.BadParameter("give at least one --repo, or --search", param_hint="--repo")
    specs = list(repo or [])
    repo_ids = _repo_ids(specs, check_name(name))
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
        builder__profile=profile,
    )
    refuse_powerless(s, runs)
    live_view = not as_json and console.is_terminal
    if live_view:
        log_path = _log_file(s)
        log_file = log_path.open("a")
        configure_logging(s.log_level, json=True, file=log_file)
        console.print(f"logs: {log_path}")
    try:
        with cli_nats(s) as url:
            if not s.nats_url:
                console.print(
                    f"bus: embedded NATS at {url} (another shell: cppperf status --out {s.out_dir})",
                    soft_wrap=True,
                    highlight=False,
                )
            result = run_async(
                _mine(s, url, specs, repo_ids, as_json, search, live_view, list(force or [])),
                waiting_for="in-flight work to be handed back to the bus and NATS to stop",
            )
    except CppPerfError as exc:
        raise _fail(exc) from exc
    if as_json:
        print_json(result)
    failed = result["dead_lettered"] > 0 or (specs and not result["submitted"] and not search)
    if result["dead_lettered"]:
        console.print(f"{result['dead_lettered']} message(s) dead-lettered: see `cppperf dlq list`")
    raise typer.Exit(EXIT_FAILURES if failed else EXIT_OK)


# ------------------------------------------------------------------------------------------ serve
def _cannot_jail(service: str, s: Settings) -> str:
    """Why `serve SERVICE` must not start here ('' when it may): a builder or evaluator on the
    local backend runs mined or agents' code, and does so only in the bubblewrap jail unless the
    operator opted out (CPPPERF_BUILDER_SANDBOX=false for trusted repositories,
    CPPPERF_EVALUATOR_TRUST_PATCHES=true for trusted patches)."""
    if service not in ("builder", "evaluator") or s.builder.backend != "local":
        return ""
    opted_out = not s.builder.sandbox if service == "builder" else s.evaluator.trust_patches
    if opted_out:
        return ""
    from cppperf.shared.engine.sandbox import jail_problem

    if why := jail_problem():
        opt = (
            "CPPPERF_BUILDER_SANDBOX=false"
            if service == "builder"
            else "CPPPERF_EVALUATOR_TRUST_PATCHES=true"
        )
        return f"{service} refuses to run untrusted code without the jail: {why} (install bubblewrap; {opt} only for trusted code)"
    return ""


@app.command()
def serve(
    service: Annotated[str, typer.Argument(help="crawler|filter|classifier|builder|evaluator")],
    out_dir: OutDir = None,
    nats_url: NatsUrl = None,
    config: Config = None,
) -> None:
    """Run one long-running service (scale out by starting more of them); it keeps retrying
    while NATS is unreachable.

    \b
    Example:
      CPPPERF_NATS_URL=nats://nats:4222 cppperf serve builder
    """
    from cppperf.runtime import (
        ALL_SERVICES,
        NOT_YET,
        connect,
        nats_endpoint,
        run,
        run_services,
        unless_stopped_early,
    )

    if service not in ALL_SERVICES:
        raise typer.BadParameter(f"unknown service {service!r}; one of {', '.join(ALL_SERVICES)}")
    if service in NOT_YET:
        console.print(f"{NOT_YET[service]}")
        raise typer.Exit(EXIT_USAGE)
    s = _settings(config, nats_url=nats_url, out_dir=str(out_dir) if out_dir else None)
    if why_not := _cannot_jail(service, s):
        raise _fail(ConfigError(why_not))

    async def main(url: str, stop: asyncio.Event) -> None:
        started = asyncio.Event()  # connected: from here on a stop is graceful, not a cancel
        await unless_stopped_early(body(url, stop, started), stop, started=started, grace=s.bus.stop_grace)

    async def body(url: str, stop: asyncio.Event, started: asyncio.Event) -> None:
        if service == "crawler":
            from cppperf.services.crawler.handlers import submit

            async with connect(s, url, wait=True) as ctx:
                started.set()
                report = await submit(ctx, list(s.mining.repos), validate=s.mining.validate_latest)
                if s.mining.search:
                    from cppperf.services.crawler.handlers import crawl_search
                    from cppperf.shared.github import GitHubClient

                    found = await crawl_search(ctx, GitHubClient(s.github), validate=s.mining.validate_latest)
                    report.published += found.published
                    report.rejected.update(found.rejected)
                console.print(f"published {len(report.published)}, rejected {len(report.rejected)}")
            return
        async with run_services(s, url, [service]):
            started.set()
            console.print(f"{service} running; Ctrl-C or SIGTERM stops it gracefully")
            await stop.wait()

    signals: list[signal.Signals] = []

    def announce(sig: signal.Signals) -> None:
        signals.append(sig)
        console.print(
            f"stopping… waiting for {service} to hand back in-flight messages (Ctrl-C again to force)"
        )

    try:
        with nats_endpoint(s) as url:
            run(lambda stop: main(url, stop), announce=announce)
    except CppPerfError as exc:
        raise _fail(exc) from exc
    console.print("stopped")
    if signals and signals[0] == signal.SIGINT:
        raise typer.Exit(130)  # Ctrl-C, as shells expect; SIGTERM (docker stop, kubelet) is a clean 0


# ------------------------------------------------------------------------------------------ status / dlq
@app.command()
def status(
    as_json: AsJson = False,
    out_dir: OutDir = None,
    nats_url: NatsUrl = None,
    config: Config = None,
) -> None:
    """Per subject: published, pending, in flight, done, dead-lettered; then the funnel."""
    from cppperf.runtime import connect

    s = _settings(config, nats_url=nats_url, out_dir=str(out_dir) if out_dir else None)

    async def main(url: str) -> dict[str, Any]:
        async with connect(s, url) as ctx:
            rows = await ctx.bus.subject_status()
            total, per, reasons = await compute_funnel(ctx.store)
            if not as_json:
                out.print(_status_table(rows, "status"))
                out.print(_funnel_table(total, per))
                for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
                    out.print(f"repos rejected ({n}): {reason}")
            from cppperf.cli.waiting import as_json as waits_json
            from cppperf.cli.waiting import describe
            from cppperf.shared.claims import KvClaims
            from cppperf.shared.engine.leases import lease_dir, lease_view

            view, claims = lease_view(lease_dir(s.builder)), await KvClaims(ctx.store).live()
            if not as_json:
                for line in describe(view, claims, time.time()):
                    out.print(line, highlight=False)
            return {
                "subjects": [r.as_dict() for r in rows],
                "funnel": total.as_dict(),
                "repo_rejections": reasons,
                "waiting": waits_json(view, claims),
            }

    with cli_nats(s, attach=True) as url:
        result = run_async(main(url))
    if as_json:
        print_json(result)


def _check_subject(subject: str | None) -> str | None:
    from cppperf.shared.bus import WORK_QUEUES

    if subject is not None and subject not in WORK_QUEUES:
        raise typer.BadParameter(f"unknown subject {subject!r}; one of {', '.join(WORK_QUEUES)}")
    return subject


@dlq_app.command("list")
def dlq_list(
    subject: Annotated[
        str | None, typer.Argument(help="only this subject's dead letters", callback=_check_subject)
    ] = None,
    as_json: AsJson = False,
    out_dir: OutDir = None,
    nats_url: NatsUrl = None,
    config: Config = None,
) -> None:
    """List dead letters (optionally of one subject) with their reason."""
    from cppperf.runtime import connect

    s = _settings(config, nats_url=nats_url, out_dir=str(out_dir) if out_dir else None)

    async def main(url: str) -> list[Any]:
        async with connect(s, url) as ctx:
            return await ctx.bus.dead_letters(subject)

    with cli_nats(s, attach=True) as url:
        letters = run_async(main(url))
    if as_json:
        print_json(
            [
                {
                    "seq": rec.seq,
                    "subject": rec.letter.subject,
                    "service": rec.letter.service,
                    "attempts": rec.letter.attempts,
                    "error": rec.letter.error,
                    "failed_at": rec.letter.failed_at,
                    "msg_id": rec.letter.msg_id,
                }
                for rec in letters
            ]
        )
        return
    t = Table(title=f"dead letters ({len(letters)})")
    for c in ("seq", "subject", "service", "attempts", "error", "failed at"):
        t.add_column(c)
    for rec in letters:
        L = rec.letter
        t.add_row(str(rec.seq), L.subject, L.service, str(L.attempts), L.error[:120], L.failed_at)
    out.print(t)


@dlq_app.command("replay")
def dlq_replay(
    subject: Annotated[
        str, typer.Argument(help="a work subject, e.g. commit.selected", callback=_check_subject)
    ],
    out_dir: OutDir = None,
    nats_url: NatsUrl = None,
    config: Config = None,
) -> None:
    """Put every dead letter of SUBJECT back on it (and remove it from the DLQ)."""
    from cppperf.runtime import connect

    s = _settings(config, nats_url=nats_url, out_dir=str(out_dir) if out_dir else None)

    async def main(url: str) -> int:
        async with connect(s, url) as ctx:
            return await ctx.bus.replay(subject)

    with cli_nats(s) as url:
        n = run_async(main(url))
    out.print(f"replayed {n} message(s) onto {subject}")


# ------------------------------------------------------------------------------------------ filter
@app.command("filter")
def filter_cmd(
    repo: Annotated[Path, typer.Option("--repo", help="local git repository")],
    since: Since = None,
    until: Until = None,
    max_files: Annotated[
        int | None, typer.Option("--max-files", min=1, help="most files a commit may change (default 20)")
    ] = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="also list rejected commits with the reason")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    config: Config = None,
) -> None:
    """Apply the structural rules to a local repository's history (no bus).

    \b
    Example:
      cppperf filter --repo ~/src/fmt --since 2022-01-01 --explain
    """
    from cppperf.services.filter.walk import walk
    from cppperf.shared.rules import Rules

    git_repo(repo)
    s = _settings(config, mining__since=since, mining__until=until, mining__max_files=max_files)
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
                f"{escape((c.message.splitlines() or [''])[0])}",
                highlight=False,
            )
    summary = {"scanned": result.scanned, "selected": len(result.selected), "rejected": dict(result.rejected)}
    if as_json:
        sys.stdout.write(json.dumps({"summary": summary}) + "\n")
    else:
        why = ", ".join(
            f"{n} {reason}" for reason, n in sorted(result.rejected.items(), key=lambda kv: -kv[1])
        )
        out.print(
            f"scanned {summary['scanned']}, selected {summary['selected']}, "
            f"rejected {sum(result.rejected.values())}{f' ({why})' if why else ''}",
            highlight=False,
        )
