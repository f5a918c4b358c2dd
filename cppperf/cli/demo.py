"""`demo init`: the demo C++/CMake repository."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Annotated

import typer

from cppperf.cli.common import WholeHelpGroup, _fail, app, out

demo_app = typer.Typer(
    cls=WholeHelpGroup, help="Demo data: `cppperf demo init DIR` creates a small C++/CMake git repo."
)
app.add_typer(demo_app, name="demo")


# ------------------------------------------------------------------------------------------ demo
@demo_app.command("init")
def demo_init(path: Annotated[Path, typer.Argument(help="directory to create")]) -> None:
    """Create the demo C++/CMake git repository (perf, no-op, comment-only, regression, … commits)."""
    from cppperf.demo import create_demo_repo

    if path.exists() and not path.is_dir():
        raise typer.BadParameter(f"{path} exists and is a file", param_hint="PATH")
    if path.exists() and any(path.iterdir()):
        raise typer.BadParameter(f"{path} exists and is not empty", param_hint="PATH")
    try:
        repo = create_demo_repo(path)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise _fail(f"cannot create the demo repository in {path}: {exc}") from exc
    for kind, sha in repo.shas.items():
        out.print(f"{sha[:12]} {kind}")
    perf = repo.shas.get("perf", "")
    out.print(
        f"demo repository ready: {path}\ntry: cppperf mine --repo {path} --runs 11"
        + (f"\nthe perf commit's instance id: local__{path.resolve().name}-{perf[:12]}" if perf else "")
    )
