"""`dataset`: import, export, list, inspect, report and stats over the instance store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cppperf.cli.common import Config, NatsUrl, _fail, _settings, app, console, out
from cppperf.cli.pipeline import _funnel_table
from cppperf.funnel import Funnel, compute_funnel

dataset_app = typer.Typer(
    help="Instances on disk (OUT/instances): import, export, inspect, list, report, stats."
)
app.add_typer(dataset_app, name="dataset")
OutDir = Annotated[
    Path | None, typer.Option("--out", help="the instance store directory (default settings.out_dir)")
]
RepoFilter = Annotated[str | None, typer.Option("--repo", help="only this owner/name")]
SignificantOnly = Annotated[
    bool, typer.Option("--significant-only", help="only instances with a faster test")
]
SinceFilter = Annotated[str | None, typer.Option("--since", help="commit date from (YYYY-MM-DD)")]
UntilFilter = Annotated[str | None, typer.Option("--until", help="commit date until (YYYY-MM-DD)")]
MultiFile = Annotated[bool, typer.Option("--multi-file", help="only patches touching several files")]
SingleFile = Annotated[bool, typer.Option("--single-file", help="only single-file patches")]


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
    repo: RepoFilter = None,
    significant_only: SignificantOnly = False,
    since: SinceFilter = None,
    until: UntilFilter = None,
    multi_file: MultiFile = False,
    single_file: SingleFile = False,
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
    repo: RepoFilter = None,
    significant_only: SignificantOnly = False,
    since: SinceFilter = None,
    until: UntilFilter = None,
    multi_file: MultiFile = False,
    single_file: SingleFile = False,
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
