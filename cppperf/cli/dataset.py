"""`dataset`: import, export, list, inspect, report and stats over the instance store."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from msgspec import UNSET
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from cppperf.cli.common import (
    EXIT_FAILURES,
    EXIT_USAGE,
    Config,
    OutDir,
    Since,
    Until,
    WholeHelpGroup,
    _fail,
    _settings,
    app,
    console,
    out,
    print_json,
    write_atomic,
)
from cppperf.shared.domain import Environment, InstanceRecord, to_json_dict
from cppperf.shared.published import BuildInfo


def _records(out_dir: Path) -> list[InstanceRecord]:
    """Every record of OUT/instances; the files that are not one are named on stderr in one line
    (a corrupt record is never dropped from a listing, an export or a report without a word)."""
    from cppperf.dataset.records import iter_records, skipped_line

    skipped: list[str] = []
    records = list(iter_records(out_dir, skipped))
    if skipped:
        console.print(skipped_line(skipped), markup=False, highlight=False)
    return records


def _store_records(out_dir: Path, what: str) -> list[InstanceRecord]:
    """The records of the store under `out_dir`; a missing OUT/instances folder is a wrong --out
    (a typo), refused with one line (exit 2) instead of reading as an empty dataset."""
    store = out_dir / "instances"
    if not store.is_dir():
        raise _fail(
            f"no instance store at {store}: nothing to {what} (--out names the folder "
            "`cppperf build`, `mine` or `dataset import` wrote into)",
            EXIT_USAGE,
        )
    return _records(out_dir)


def _export_records(out_dir: Path, what: str) -> list[InstanceRecord]:
    """The records an export (`dataset export`, `report --all`) is made of, read before anything is
    written. A store that holds no instance is a wrong --out, not an empty dataset: no
    OUT/instances folder is refused (exit 2), one with no instance record in it is exit 1; the
    target is neither created nor overwritten."""
    records = _store_records(out_dir, what)
    if not records:
        raise _fail(f"no instance record in {out_dir / 'instances'}: nothing to {what}")
    return records


def _set_or_none(value: object) -> object:
    """A published key's value, None when the file lacks it (`UNSET`)."""
    return None if value is UNSET else value


dataset_app = typer.Typer(
    cls=WholeHelpGroup,
    help="Instances on disk (OUT/instances): import, export, inspect, list, report, stats.",
)
app.add_typer(dataset_app, name="dataset")
RepoFilter = Annotated[str | None, typer.Option("--repo", help="only this owner/name")]
SignificantOnly = Annotated[
    bool, typer.Option("--significant-only", help="only instances whose verdict is improved")
]
MultiFile = Annotated[bool, typer.Option("--multi-file", help="only patches touching several files")]
SingleFile = Annotated[bool, typer.Option("--single-file", help="only single-file patches")]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output on stdout")]


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
    if since and until and since > until:
        raise typer.BadParameter(f"--since {since} is after --until {until}")
    return Filters(
        repo=repo,
        significant_only=significant_only,
        since=since,
        until=until,
        files="multi" if multi_file else ("single" if single_file else None),
    )


def _summary(r: InstanceRecord) -> dict[str, Any]:
    from cppperf.dataset.records import is_significant

    ci, ours = r.commit_info, r.cppperf
    return {
        "instance_id": ours.instance_id,
        "repo": r.metadata.repository_name,
        "date": (ci.commit_date or "")[:10],
        "files": len(ci.files_changed),
        "lines_added": ci.lines_added or 0,
        "lines_removed": ci.lines_removed or 0,
        "verdict": ours.verdict,
        "significant": is_significant(r),
        "improved_tests": len(ours.improved_tests)
        if ours.improved_tests is not UNSET
        else int(r.tests.significant_improvements or 0),
    }


@dataset_app.command("import")
def dataset_import(
    sources: Annotated[
        list[Path],
        typer.Argument(help="CppPerf-DB JSON files or directories of them", exists=True, readable=True),
    ],
    out_dir: OutDir = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """Import published CppPerf-DB files unchanged; our verdicts are recomputed from the published
    raw timings (bad files reported and skipped, exit 1; idempotent).

    \b
    Example:
      cppperf dataset import /path/to/cppperf-db/entries
    """
    from cppperf.dataset.records import import_files

    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    with Progress(console=console, disable=as_json or not console.is_terminal, transient=True) as progress:
        task = progress.add_task("import", total=None)
        try:
            rep = import_files(
                sources, Path(s.out_dir), lambda d, t: progress.update(task, completed=d, total=t)
            )
        except OSError as exc:
            raise _fail(exc) from exc
    for path, why in rep.errors.items():
        console.print(f"[yellow]skipped[/yellow] {path}: {why}", soft_wrap=True)
    store = Path(s.out_dir) / "instances"
    if as_json:
        print_json(
            {"imported": rep.imported, "unchanged": rep.unchanged, "errors": rep.errors, "store": str(store)}
        )
    else:
        out.print(
            f"imported {len(rep.imported)}, unchanged {len(rep.unchanged)}, skipped {len(rep.errors)} → {store}"
        )
    if not (rep.imported or rep.unchanged or rep.errors):
        entries = [src / "entries" for src in sources if (src / "entries").is_dir()]
        hint = (
            f"; the published records are in its entries/: cppperf dataset import {entries[0]}"
            if entries
            else ""
        )
        console.print(
            f"nothing to import: no CppPerf-DB JSON file (*.json) in {', '.join(map(str, sources))}{hint}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    if rep.errors or not (rep.imported or rep.unchanged):
        raise typer.Exit(EXIT_FAILURES)


@dataset_app.command("export")
def dataset_export(
    target: Annotated[Path, typer.Argument(help="JSONL file (jsonl) or directory (cppperf-db)")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl | cppperf-db")] = "jsonl",
    repo: RepoFilter = None,
    significant_only: SignificantOnly = False,
    since: Since = None,
    until: Until = None,
    multi_file: MultiFile = False,
    single_file: SingleFile = False,
    out_dir: OutDir = None,
    config: Config = None,
) -> None:
    """Export instances: SWE-bench-like JSONL for agents, or files in the published format.
    Files are written whole or not at all. An --out with no instance record is an error (nothing
    is written); filters that match none write an empty export with a warning.

    \b
    Example:
      cppperf dataset export --format jsonl --significant-only tasks.jsonl
    """
    from cppperf.dataset.records import swebench_row, to_published

    if fmt not in ("jsonl", "cppperf-db"):
        raise typer.BadParameter("--format is jsonl or cppperf-db", param_hint="--format")
    if fmt == "jsonl" and target.is_dir():
        raise typer.BadParameter(f"{target} is a directory (jsonl writes a file)", param_hint="TARGET")
    if fmt == "cppperf-db" and target.exists() and not target.is_dir():
        raise typer.BadParameter(f"{target} is a file (cppperf-db writes a directory)", param_hint="TARGET")
    if not target.parent.is_dir():
        raise _fail(f"cannot write {target}: no folder {target.parent}", EXIT_USAGE)
    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    flt = _filters(repo, significant_only, since, until, multi_file, single_file)
    stored = _export_records(Path(s.out_dir), "export")
    records = [r for r in stored if flt.match(r)]
    if not records:  # asked for by the filters: written, but never without a word
        console.print(
            f"warning: none of the {len(stored)} instance(s) in {Path(s.out_dir) / 'instances'} "
            "matches the filters: the export is empty",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    try:
        if fmt == "jsonl":
            write_atomic(target, "".join(json.dumps(swebench_row(r)) + "\n" for r in records))
        else:
            target.mkdir(exist_ok=True)
            for r in records:
                name = f"{r.metadata.repository_name.replace('/', '_')}_{r.commit_info.new_sha}.json"
                write_atomic(target / name, json.dumps(to_json_dict(to_published(r)), indent=2))
    except OSError as exc:
        raise _fail(f"cannot write {target}: {exc.strerror or exc}") from exc
    out.print(f"exported {len(records)} instance(s) to {target}")


@dataset_app.command("list")
def dataset_list(
    repo: RepoFilter = None,
    significant_only: SignificantOnly = False,
    since: Since = None,
    until: Until = None,
    multi_file: MultiFile = False,
    single_file: SingleFile = False,
    out_dir: OutDir = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """A table of instances (filters as for export); --json: one JSON array."""
    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    flt = _filters(repo, significant_only, since, until, multi_file, single_file)
    rows = [_summary(r) for r in _store_records(Path(s.out_dir), "list") if flt.match(r)]
    if as_json:
        print_json(rows)
        return
    t = Table(title="instances")
    for c in ("instance", "date", "files", "+/-", "verdict", "improved tests"):
        t.add_column(c, no_wrap=True)
    for x in rows:
        t.add_row(
            x["instance_id"],
            x["date"],
            str(x["files"]),
            f"+{x['lines_added']}/-{x['lines_removed']}",
            f"[green]{x['verdict']}[/green]" if x["significant"] else str(x["verdict"]),
            str(x["improved_tests"]),
        )
    out.print(t)
    out.print(f"{len(rows)} instance(s)")


@dataset_app.command("inspect")
def dataset_inspect(
    instance: Annotated[str, typer.Argument(help="instance id, e.g. owner__name-<sha12>")],
    patch: Annotated[
        bool, typer.Option("--patch", help="print only the expert's patch (a git unified diff)")
    ] = False,
    problem: Annotated[
        bool,
        typer.Option("--problem-statement", help="print only the task text an agent is given"),
    ] = False,
    out_dir: OutDir = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """Commit, files, verdict, the improved/regressed tests with change and CI, build facts.

    \b
    Examples:
      cppperf dataset inspect local__demo-4bda4860cd0d
      cppperf dataset inspect local__demo-4bda4860cd0d --patch > gold.diff
      cppperf dataset inspect local__demo-4bda4860cd0d --problem-statement
    """
    from cppperf.dataset.records import RecordError, load_record, swebench_row
    from cppperf.dataset.report import _test_rows

    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    try:
        r = load_record(Path(s.out_dir), instance)
    except RecordError as exc:
        raise _fail(exc) from exc
    if patch or problem:
        row = swebench_row(r)
        sys.stdout.write(str(row["patch"] if patch else row["problem_statement"] + "\n"))
        return
    ci, ours = r.commit_info, r.cppperf
    changed = [row for row in _test_rows(r) if row["improved"] or row["regressed"]]
    if as_json:
        print_json(
            {
                **_summary(r),
                "old_sha": ci.old_sha,
                "new_sha": ci.new_sha,
                "verdict_paper_rule": ours.verdict_paper_rule,
                "failure_category": ours.failure_category,
                "failure_detail": ours.failure_detail,
                "message": "\n".join(ci.commit_message or []),
                "files_changed": [
                    {k: _set_or_none(getattr(f, k)) for k in ("filename", "status", "additions", "deletions")}
                    for f in ci.files_changed
                ],
                "changed_tests": changed,
            }
        )
        return
    out.print(
        f"[bold]{ours.instance_id}[/bold]  {r.metadata.repository_name} {ci.old_sha[:12]} → "
        f"{ci.new_sha[:12]}  ({(ci.commit_date or '')[:10]})"
    )
    out.print(
        f"verdict: [bold]{ours.verdict}[/bold] (paper's rule: {ours.verdict_paper_rule})"
        + (f"; {ours.failure_category}: {escape(ours.failure_detail)}" if ours.failure_category else "")
    )
    out.print("message: " + " ".join(ci.commit_message or []), markup=False, highlight=False)
    for f in ci.files_changed:
        out.print(
            f"  {f.status or '':9} {f.filename} +{f.additions or 0}/-{f.deletions or 0}",
            markup=False,
        )
    t = Table(title="changed tests")
    for c in ("test", "change", "speed-up 95% CI", "p", "result"):
        t.add_column(c)
    for row in changed:
        ci_txt = f"[{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]" if row["ci"] else "-"
        t.add_row(
            escape(row["name"]),
            f"{(row['change'] or 0) * 100:+.1f}%",
            ci_txt,
            f"{row['p']:.2g}" if isinstance(row["p"], (int, float)) else "-",
            "improved" if row["improved"] else "regressed",
        )
    out.print(t if changed else "changed tests: none (no test improved or regressed significantly)")
    bi = r.build_info or BuildInfo()
    script = " && ".join(bi.new_build_script or [])
    out.print(f"build: {bi.build_system or ''}; {script}", markup=False, highlight=False)
    env = ours.environment
    if env != Environment():  # an imported record has none
        out.print(f"environment: {env.cpu_model}, {env.build_type}, seed {ours.seed}")


@dataset_app.command("report")
def dataset_report(
    target: Annotated[Path, typer.Argument(help="instance id, or OUT.html with --all")],
    output: Annotated[Path | None, typer.Argument(help="OUT.html (with an instance id)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="the dataset overview")] = False,
    pages: Annotated[
        bool, typer.Option("--pages", help="with --all: also every instance's page, linked (OUT_instances/)")
    ] = False,
    out_dir: OutDir = None,
    config: Config = None,
) -> None:
    """Static HTML report with inline SVG plots (no network needed to view it). The overview's
    instance table sorts (click a header) and filters (repository, verdict, files, speed-up).

    \b
    Examples:
      cppperf dataset report --all overview.html --pages
      cppperf dataset report local__demo-4bda4860cd0d report.html
    """
    from cppperf.dataset.records import RecordError, load_record
    from cppperf.dataset.report import instance_section, overview_section, page

    if pages and not all_:
        raise typer.BadParameter("--pages goes with --all", param_hint="--pages")
    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    dest = (output or target) if all_ else output
    if dest is None:
        raise typer.BadParameter("give the output file: cppperf dataset report ID OUT.html")
    if not dest.parent.is_dir():
        raise _fail(f"cannot write {dest}: no folder {dest.parent}", EXIT_USAGE)
    if not all_:
        try:
            text = page(str(target), instance_section(load_record(Path(s.out_dir), str(target))))
        except RecordError as exc:
            raise _fail(exc) from exc
        _write_page(dest, text)
        out.print(f"wrote {dest} ({len(text) // 1024} KiB)")
        return
    records = _export_records(Path(s.out_dir), "report")
    folder = dest.with_name(dest.stem + "_instances")
    written = _write_instance_pages(records, folder) if pages else 0
    text = page(
        "cppperf dataset",
        overview_section(records, (lambda iid: f"{folder.name}/{iid}.html") if pages else None),
    )
    _write_page(dest, text)  # last: the overview never links a page that is not there
    more = f" and {written} instance page(s) in {folder}" if pages else ""
    out.print(f"wrote {dest} ({len(text) // 1024} KiB){more}")


def _write_page(path: Path, text: str) -> None:
    """One report file, whole or not at all, mode 0644 (a report is for people to read and serve)."""
    try:
        write_atomic(path, text, mode=0o644)
    except OSError as exc:
        raise _fail(f"cannot write {path}: {exc.strerror or exc}") from exc


def _write_instance_pages(records: list[InstanceRecord], folder: Path) -> int:
    """Every instance's page into `folder`, with a progress bar; Ctrl-C stops after the page being
    written (every file on disk is whole) and exits 130 with one line."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from cppperf.dataset.report import instance_section, page

    done = 0
    columns = (
        TextColumn("instance pages"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    try:
        with Progress(*columns, console=console, disable=not console.is_terminal, transient=True) as progress:
            task = progress.add_task("pages", total=len(records))
            for r in records:
                iid = r.cppperf.instance_id
                _write_page(folder / f"{iid}.html", page(iid, instance_section(r)))
                done += 1
                progress.advance(task)
    except KeyboardInterrupt:
        for tmp in folder.glob(".*.tmp"):  # a Ctrl-C inside write_atomic, before its own cleanup
            tmp.unlink(missing_ok=True)
        console.print(
            f"interrupted: {done} of {len(records)} instance page(s) in {folder}, no overview written",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
        raise typer.Exit(130) from None
    return done


def _counts(counts: Counter[str]) -> str:
    """`built here 2, imported 345`: a Counter as people read it (most common first)."""
    return ", ".join(f"{k} {v}" for k, v in counts.most_common())


@dataset_app.command("stats")
def dataset_stats(out_dir: OutDir = None, as_json: AsJson = False, config: Config = None) -> None:
    """The instance store (OUT/instances): instances and repositories, verdicts, single- vs
    multi-file, where they came from. The mining funnel is `cppperf status`."""
    from cppperf.dataset.records import is_significant

    s = _settings(config, out_dir=str(out_dir) if out_dir else None)
    store = Path(s.out_dir) / "instances"
    verdicts: Counter[str] = Counter()
    origin: Counter[str] = Counter()
    repos: Counter[str] = Counter()
    oracles: Counter[str] = Counter()
    n = significant = single = 0
    for r in _store_records(Path(s.out_dir), "count"):
        ours = r.cppperf
        n += 1
        verdicts[str(ours.verdict)] += 1
        origin["imported" if ours.imported_from else "built here"] += 1
        repos[r.metadata.repository_name] += 1
        significant += is_significant(r)
        single += len(r.commit_info.files_changed) == 1
        oracles[str(ours.oracle or "unvalidated")] += 1
    graders = n - oracles["none"] - oracles["unvalidated"]
    result = {
        "store": str(store),
        "instances": n,
        "repositories": len(repos),
        "significant": significant,
        "single_file": single,
        "multi_file": n - single,
        "verdicts": dict(verdicts.most_common()),
        "origin": dict(origin.most_common()),
        "per_repo": dict(repos.most_common()),
        "oracles": dict(oracles.most_common()),  # `cppperf validate`: which workload can grade agents
        "can_grade": graders,
        "can_grade_share": round(graders / n, 4) if n else 0.0,
    }
    if as_json:
        print_json(result)
        return
    out.print(f"{store}: {n} instance(s) from {len(repos)} repositories ({_counts(origin)})")
    out.print(f"significant: {significant}; single-file {single}, multi-file {n - single}")
    out.print(
        f"can grade agents (gold-validated, `cppperf validate`): {graders} of {n} "
        f"({result['can_grade_share']:.0%}); oracles: {_counts(oracles)}"
    )
    t = Table(title="verdicts")
    t.add_column("verdict")
    t.add_column("instances", justify="right")
    for v, k in verdicts.most_common():
        t.add_row(v, str(k))
    out.print(t)
