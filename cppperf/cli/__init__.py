"""`cppperf`: the one command-line entry point (Typer + rich); one module per area."""

import sys

from cppperf.cli import (  # noqa: F401 - registers commands
    agents,
    build,
    bus,
    classify,
    dataset,
    demo,
    evaluate,
    health,
    pipeline,
    schema,
    validate,
)
from cppperf.cli.common import EXIT_FAILURES, EXIT_USAGE, app, console
from cppperf.shared.errors import BadInput, ConfigError, CppPerfError


def main() -> None:
    """Run the CLI; a usage error is one line (`error: … (see `cppperf X --help`)`), exit 2; so
    is bad input a verb let through (`BadInput`, `ConfigError`); any other cppperf error, and a
    file a verb could not read or write (`OSError`: its path and why), exit 1."""
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
    except CppPerfError as exc:  # a verb that did not catch its own: still one line, never a traceback
        console.print(f"error: {exc}", soft_wrap=True, markup=False, highlight=False)
        sys.exit(EXIT_USAGE if isinstance(exc, BadInput | ConfigError) else EXIT_FAILURES)
    except OSError as exc:  # a file the verb could not read or write: its path and why, in one line
        where = f"{exc.filename}: " if exc.filename else ""
        console.print(f"error: {where}{exc.strerror or exc}", soft_wrap=True, markup=False, highlight=False)
        sys.exit(EXIT_FAILURES)
    sys.exit(rc if isinstance(rc, int) else 0)


__all__ = ["app", "main"]
