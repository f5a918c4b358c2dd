"""`cppperf health SERVICE`: is the service really consuming? (container health checks)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cppperf.cli.common import app, out
from cppperf.shared.health import DEFAULT_MAX_AGE, check
from cppperf.shared.settings import Settings


@app.command()
def health(
    service: Annotated[str, typer.Argument(help="filter|classifier|builder|evaluator")],
    max_age: Annotated[
        float, typer.Option("--max-age", min=1.0, help="seconds a heartbeat stays valid")
    ] = DEFAULT_MAX_AGE,
    health_dir: Annotated[
        Path | None,
        typer.Option("--health-dir", envvar="CPPPERF_HEALTH_DIR", help="default /tmp/cppperf-health"),
    ] = None,
) -> None:
    """Exit 0 when SERVICE's heartbeat is fresh and says it is connected and pulling, else 1;
    prints one line saying why. Reads the heartbeat file only (no NATS connection).

    \b
    Example:
      cppperf health builder --max-age 60
    """
    ok, why = check(health_dir or Settings().health_path(), service, max_age)
    out.print(why, highlight=False, soft_wrap=True)
    raise typer.Exit(0 if ok else 1)
