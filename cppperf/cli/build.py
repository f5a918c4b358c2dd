"""`build`, `calibrate`, `reproduce`, `images`: proving one commit and the container images."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cppperf.cli.common import (
    AsJson,
    Config,
    OutDir,
    Runs,
    WholeHelpGroup,
    _fail,
    _settings,
    app,
    console,
    out,
    print_json,
    refuse_powerless,
    write_atomic,
)
from cppperf.cli.repos import check_name, git_repo
from cppperf.shared.domain import Calibration, record_text, to_json_dict
from cppperf.shared.errors import CppPerfError

# ------------------------------------------------------------------------------------------ build / calibrate
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="default (Release, our rule) | paper (Debug build, the paper's rule); both recorded",
        envvar="CPPPERF_BUILDER_PROFILE",
    ),
]
MetricOpt = Annotated[
    str | None,
    typer.Option(
        "--metric", help="what decides: cpu (default) | wall | instructions", envvar="CPPPERF_BUILDER_METRIC"
    ),
]

CoverageOpt = Annotated[
    bool | None,
    typer.Option(
        "--coverage/--no-coverage",
        help="decide on the tests that run the change (a --coverage build of the new side); "
        "the others are A/A controls",
        envvar="CPPPERF_BUILDER_COVERAGE",
    ),
]


def _commit_from_repo(repo: Path, sha: str, parent: str | None, name: str | None = None) -> Any:
    """The commit as a `CommitSelected`; bad input is a usage error (exit 2)."""
    from cppperf.api import commit_from_repo

    git_repo(repo)
    try:
        return commit_from_repo(repo, sha, parent=parent, name=name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--sha") from None


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
    t = Table(
        title=f"{c['instance_id']}: {c['verdict']} ({c.get('decision_rule', 'ours')} rule; "
        f"paper rule: {c['verdict_paper_rule']}, strict: {c.get('verdict_strict_rule', '-')})"
    )
    for col in (
        "test",
        "old median ms",
        "new median ms",
        "change",
        "ratio 95% CI",
        "p (BH)",
        "ours",
        "paper",
        "decided on",
    ):
        t.add_column(col)
    for ts in [*c["tests"], *c.get("benchmarks", [])]:  # benchmarks: per-iteration times
        ms = "{:.4g}" if ts["name"].startswith("bench:") else "{:.2f}"
        t.add_row(
            ts["name"],
            ms.format(ts["median_old"] * 1e3),
            ms.format(ts["median_new"] * 1e3),
            f"{ts['median_change'] * 100:+.1f}%",
            f"{ts['ratio']:.3f} [{ts['ci_low']:.3f}, {ts['ci_high']:.3f}]",
            f"{ts['p_improve_adj']:.2g}",
            "improved" if ts["improved"] else ("regressed" if ts["regressed"] else "-"),
            "improved" if ts["paper_improved"] else ("regressed" if ts["paper_regressed"] else "-"),
            str(c.get("decided_on", {}).get(ts["name"], "wall")),
        )
    out.print(t)
    if c.get("proven_by"):
        out.print(f"proven by: {c['proven_by']}")
    for skip in c.get("benchmarks_skipped", []):
        out.print(
            f"benchmark not timed: {skip['name']} ({skip['reason']}) {skip.get('detail', '')[:200]}",
            markup=False,
        )
    if c["failure_category"]:
        out.print(f"[red]rejected ({c['failure_category']})[/red]: {escape(c['failure_detail'][:1500])}")
        if c.get("failure_step"):
            out.print(f"failed step: {c['failure_step']}")
        for line in c.get("failure_lines", []):
            out.print(f"  | {line}", markup=False, highlight=False)
        for what in c.get("tried", []):
            out.print(f"tried: {what}", markup=False, highlight=False)
    _print_coverage(c.get("coverage"))
    if c["missing_packages"]:
        out.print(f"missing Debian packages: {' '.join(c['missing_packages'])}")
    if c.get("rounds_saved_by_early_stop"):
        out.print(f"early stop saved {c['rounds_saved_by_early_stop']} test rounds")


def _print_coverage(cov: dict[str, Any] | None) -> None:
    if not cov:
        return
    if not cov.get("used"):
        out.print(f"coverage not used (every test decided): {cov.get('reason', '')}", markup=False)
        return
    deciding, controls = cov.get("deciding", []), cov.get("controls", [])
    out.print(
        f"coverage: decided on the {len(deciding)} test{'' if len(deciding) == 1 else 's'} that run the change; "
        f"controls: {', '.join(controls) or 'none'}",
        markup=False,
    )
    if cov.get("suspect"):
        moved = ", ".join(f"{n} {how}" for n, how in cov.get("moved_controls", {}).items())
        out.print(f"[yellow]suspect measurement[/yellow]: a control moved ({moved})")


@app.command()
def reproduce(
    image: Annotated[str, typer.Argument(help="instance image, e.g. cppperf/owner__name:<sha12>")],
    runs: Runs = None,
    out_dir: OutDir = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """Re-run an instance's timing protocol from its image alone (docker backend) and compare.

    \b
    Example:
      cppperf reproduce cppperf/local__demo:4bda4860cd0d --runs 21
    """
    from cppperf.services.builder.reproduce import reproduce_image

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
        print_json(result)
    else:
        out.print(
            f"{image}: recorded verdict {result.recorded_verdict}, reproduced {result.verdict} "
            f"({'same' if result.same_verdict else 'DIFFERENT'}); improved tests {result.improved_tests}"
        )


@app.command()
def build(
    repo: Annotated[Path, typer.Option("--repo", help="local git repository")],
    sha: Annotated[str, typer.Option("--sha", help="the commit to prove")],
    parent: Annotated[
        str | None, typer.Option("--parent", help="compare against this instead of SHA^ (needed for merges)")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="owner/name (default: the GitHub origin remote)")
    ] = None,
    runs: Runs = None,
    builder: Annotated[str | None, typer.Option("--builder", help="local|docker")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="keep the workspace")] = False,
    out_dir: OutDir = None,
    profile: ProfileOpt = None,
    metric: MetricOpt = None,
    coverage: CoverageOpt = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """Build and time one commit against its parent (no bus); writes OUT/instances/<id>.json.
    With --builder docker, the instance image cppperf/<owner>__<name>:<sha12> is committed.

    \b
    Examples:
      cppperf build --repo /tmp/demo --sha HEAD~12 --runs 11
      cppperf build --repo /tmp/bvh --sha e5047b9 --profile paper   # the paper's way
      cppperf build --repo /tmp/bvh --sha 1c94c25 --coverage   # decide on the tests that run it
    """
    from cppperf.services.builder.service import build_patch

    commit = _commit_from_repo(repo, sha, parent, check_name(name))
    s = _settings(
        config,
        out_dir=str(out_dir) if out_dir else None,
        builder__runs=runs,
        builder__backend=builder,
        builder__keep=keep or None,
        builder__profile=profile,
        builder__metric=metric,
        builder__coverage=coverage,
    )
    refuse_powerless(s, runs)
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
        print_json(built.record.cppperf)
    else:
        _print_instance(to_json_dict(built.record))
        out.print(f"record: {built.path}")


@app.command()
def calibrate(
    repo: Annotated[Path, typer.Option("--repo", help="local clone holding the commit")],
    sha: Annotated[str, typer.Option("--sha", help="the commit to run against itself (A/A)")],
    runs: Runs = None,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="write the A/A record (all three rules) to this JSON file")
    ] = None,
    profile: ProfileOpt = None,
    metric: MetricOpt = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """A/A run: SHA against itself. Any test flagged is a false positive on this machine.

    \b
    Example:
      cppperf calibrate --repo /tmp/demo --sha HEAD --runs 21 --out aa.json
    """
    from cppperf.services.builder.instance import prove
    from cppperf.services.builder.record import build_record
    from cppperf.shared.engine.backends import make_backend
    from cppperf.shared.messages import instance_id

    if out_file is not None and out_file.is_dir():  # before the run, not after it
        raise typer.BadParameter(
            f"{out_file} is a folder: --out names the record's JSON file", param_hint="--out"
        )
    commit = _commit_from_repo(repo, sha, sha)
    s = _settings(config, builder__runs=runs, builder__profile=profile, builder__metric=metric)
    settings = msgspec.structs.replace(s.builder, confirm=False, backend="local")
    backend = make_backend(settings, s.work_dir() / "calibrate")
    progress, on_phase = _phase_progress()
    try:
        with progress:
            res = prove(
                instance_id(commit.repo, commit.sha),
                backend,
                settings,
                sides={"old": commit.sha, "new": commit.sha},
                repo_path=repo.resolve(),
                on_phase=on_phase,
                time_identical=True,  # A/A: identical on purpose; time them anyway
            )
    except CppPerfError as exc:
        raise _fail(exc) from exc
    finally:
        backend.cleanup()
    flagged_ours = [t.name for t in res.tests if t.improved or t.regressed]
    flagged_paper = [t.name for t in res.tests if t.paper_improved or t.paper_regressed]
    flagged_strict = [t.name for t in res.tests if t.strict_improved or t.strict_regressed]
    result = Calibration(
        tests=len(res.tests),
        flagged_ours=flagged_ours,
        flagged_paper_rule=flagged_paper,
        flagged_strict_rule=flagged_strict,
        verdict=res.verdict,
        verdict_paper_rule=res.verdict_paper,
        verdict_strict_rule=res.verdict_strict,
        failure=res.failure_detail,
    )
    if out_file is not None:
        record = build_record(commit, res, diff="", settings=settings)
        meta = msgspec.structs.replace(record.cppperf, calibration=result)
        write_atomic(out_file, record_text(msgspec.structs.replace(record, cppperf=meta)))
    if as_json:
        print_json(result)
    else:
        out.print(
            f"A/A on {sha}: {len(res.tests)} tests; flagged by our rule: {flagged_ours or 'none'}; "
            f"by the paper's rule: {flagged_paper or 'none'}; strict: {flagged_strict or 'none'}"
            + (f"; record: {out_file}" if out_file is not None else "")
        )


images_app = typer.Typer(
    cls=WholeHelpGroup, help="Container images: base images without a registry, pruning."
)
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

    \b
    Example:
      cppperf images bootstrap --release bookworm
    """
    from cppperf.shared.engine.backends import docker_client
    from cppperf.shared.engine.images import bootstrap_base

    s = _settings(config)
    try:
        with console.status(f"debootstrap {release} and import (a few minutes the first time)"):
            name = bootstrap_base(docker_client(s.builder), release, mirror=mirror, force=force)
    except CppPerfError as exc:
        raise _fail(exc) from exc
    out.print(f"base image ready: {name}")


@images_app.command("prune")
def images_prune(config: Config = None) -> None:
    """Remove dangling image layers, stopped cppperf containers and unused /work volumes."""
    from cppperf.shared.engine.backends import docker_client

    s = _settings(config)
    try:
        client = docker_client(s.builder)
        removed = 0
        for c in client.containers.list(all=True, filters={"status": "exited"}):
            if str(c.image.tags[:1]).find("cppperf/") >= 0:
                c.remove(force=True)
                removed += 1
        res = client.images.prune(filters={"dangling": True})
        # the docker backend's /work volumes a crashed run left behind (none in use is touched)
        vols = client.volumes.prune(filters={"label": "cppperf=work"})
    except CppPerfError as exc:
        raise _fail(exc) from exc
    except Exception as exc:  # docker.errors.DockerException and requests' errors: the engine failed
        raise _fail(f"container engine: {exc}") from exc
    out.print(
        f"removed {removed} container(s), {len(res.get('ImagesDeleted') or [])} dangling image(s), "
        f"{len(vols.get('VolumesDeleted') or [])} unused work volume(s)"
    )
