"""What every command module shares: the Typer app, consoles, common options, settings loading."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from cppperf.shared.errors import ConfigError
from cppperf.shared.logging import configure_logging
from cppperf.shared.settings import Settings, load_settings

HELP = """Mine, prove, package and score performance-improving C++ commits.

\b
Examples:
  cppperf demo init /tmp/demo                 # a small real C++/CMake repo with perf commits
  cppperf mine --repo /tmp/demo --runs 11     # whole pipeline on embedded NATS
  cppperf filter --repo /tmp/demo --explain   # structural rules only, no bus
  cppperf build --repo /tmp/demo --sha HEAD~3 # prove one commit, no bus
  cppperf classify eval --labels dev.jsonl    # classifier quality on labelled commits
  cppperf status                              # per stage: pending, in flight, done, dead-lettered
  cppperf evaluate --predictions preds.jsonl --run-id demo
  cppperf dataset import ../shared/data/cppperf-db/entries
"""

app = typer.Typer(
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
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
