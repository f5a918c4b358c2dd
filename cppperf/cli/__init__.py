"""`cppperf`: the one command-line entry point (Typer + rich); one module per area."""

from cppperf.cli import build, classify, dataset, demo, evaluate, pipeline  # noqa: F401 - registers commands
from cppperf.cli.common import app


def main() -> None:
    app()


__all__ = ["app", "main"]
