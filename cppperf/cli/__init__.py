"""`cppperf`: the one command-line entry point (Typer + rich); one module per area."""

import sys

from cppperf.cli import build, classify, dataset, demo, evaluate, health, pipeline, schema  # noqa: F401 - registers commands
from cppperf.cli.common import EXIT_USAGE, app, console


def main() -> None:
    """Run the CLI; a usage error is one line (`error: … (see `cppperf X --help`)`), exit 2."""
    from typer import Abort
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

    try:
        rc = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "cppperf"
        console.print(
            f"error: {exc.format_message()} (see `{where} --help`)",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
        sys.exit(exc.exit_code)
    except ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Abort:
        console.print("aborted")
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


__all__ = ["app", "main"]
