"""What every command module shares: the Typer app, consoles, common options, settings loading,
the exit codes, and the CLI's fail-fast paths (NATS reachability, Ctrl-C).

Exit codes: 0 done; 1 finished with failures (dead letters, unknown instances, an unreachable
server, an engine error); 2 usage error (a bad flag, path, date, URL or setting).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
from collections.abc import Coroutine, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import msgspec
import typer
import typer._click as click
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from cppperf.shared import files
from cppperf.shared.errors import ConfigError
from cppperf.shared.logging import configure_logging, safe_url
from cppperf.shared.settings import Settings, check_nats_url, load_settings, parse_date

EXIT_OK = 0
EXIT_FAILURES = 1
EXIT_USAGE = 2

HELP = """Mine, prove, package and score performance-improving C++ commits.

\b
Examples:
  cppperf demo init /tmp/demo                 # a small real C++/CMake repo with perf commits
  cppperf mine --repo /tmp/demo --runs 11     # whole pipeline on embedded NATS
  cppperf filter --repo /tmp/demo --explain   # structural rules only, no bus
  cppperf build --repo /tmp/demo --sha HEAD~12 # prove the perf commit, no bus
  cppperf classify eval --labels dev.jsonl    # classifier quality on labelled commits
  cppperf status                              # per stage: pending, in flight, done, dead-lettered
  cppperf evaluate --predictions preds.jsonl --run-id demo
  cppperf dataset import /path/to/cppperf-db/entries --out results

\b
Every verb writes to and reads from one output folder (--out, default cppperf-out); the
pipeline's state (the embedded NATS store) lives in OUT/.state/.
Exit codes: 0 done; 1 finished with failures; 2 usage error.
"""


def _version() -> str:
    try:
        return version("cppperf")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def _version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"cppperf {_version()}\n")
        raise typer.Exit(EXIT_OK)


class WholeHelpGroup(TyperGroup):
    """A verb group whose `Commands:` list gives each verb's first sentence whole (wrapped at
    words), never cut with `...` at the terminal's width (click's default)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, cmd.get_short_help_str(limit=10_000))
            for name in self.list_commands(ctx)
            if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=WholeHelpGroup,
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_version_callback, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Mine, prove, package and score performance-improving C++ commits."""


# Piped output is never cut or wrapped: off a terminal, tables and lines take the width they need
# (stderr too: `cppperf … 2>&1 | cat`, CI logs).
console = Console(
    stderr=True, width=None if sys.stderr.isatty() else 100_000, soft_wrap=not sys.stderr.isatty()
)
out = Console(width=None if sys.stdout.isatty() else 100_000, soft_wrap=not sys.stdout.isatty())


# ------------------------------------------------------------------------------------------ options
def _check_nats_url(value: str | None) -> str | None:
    if value:
        try:
            check_nats_url(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def _check_date(value: str | None) -> str | None:
    if value is not None:
        try:
            parse_date(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def _check_runs(value: int | None) -> int | None:
    if value is not None and value < 4:
        raise typer.BadParameter(f"{value}: need at least 4 rounds (the first is discarded)")
    return value


# counted, not timed: an exact count is decided by `stats.compare_exact`, which needs no power
COUNTED_METRICS = ("instructions", "cachegrind")


def refuse_powerless(s: Settings, runs: int | None) -> None:
    """`--runs` too few for even a one-test instance to be decided under the chosen rule (no p
    can reach alpha): exit 2 naming the smallest that can. More tests need more rounds: that is
    the per-instance `underpowered` warning. An exact count (instructions) is never refused."""
    from cppperf.shared.engine.stats import runs_needed

    b = s.builder
    if runs is None or b.metric in COUNTED_METRICS:
        return
    rule = b.effective_rule()
    need = runs_needed(1, rule=rule, alpha=b.alpha, warmup=b.warmup)
    if runs < need:
        raise _fail(
            f"--runs {runs} cannot decide even one test: {runs - b.warmup} samples a side never reach "
            f"alpha={b.alpha} under the '{rule}' rule; use --runs {need} or more",
            EXIT_USAGE,
        )


NatsUrl = Annotated[
    str | None,
    typer.Option(
        "--nats-url",
        envvar="CPPPERF_NATS_URL",
        help="NATS server; embedded nats-server (state in OUT/.state) when absent",
        callback=_check_nats_url,
    ),
]
AdminCreds = Annotated[
    Path | None,
    typer.Option(
        "--creds",
        envvar="CPPPERF_BUS_CREDS",
        help="the admin's creds file (`cppperf agents service-keys`); user:password goes in the URL",
        exists=True,
        dir_okay=False,
    ),
]
Config = Annotated[
    Path | None,
    typer.Option("--config", envvar="CPPPERF_CONFIG", help="cppperf.toml path", exists=True, dir_okay=False),
]
OutDir = Annotated[
    Path | None,
    typer.Option("--out", envvar="CPPPERF_OUT_DIR", help="output folder (default cppperf-out)"),
]
Since = Annotated[
    str | None, typer.Option("--since", help="commit date from (YYYY-MM-DD)", callback=_check_date)
]
Until = Annotated[
    str | None, typer.Option("--until", help="commit date until (YYYY-MM-DD)", callback=_check_date)
]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable JSON on stdout instead of the table")]
Runs = Annotated[
    int | None,
    typer.Option("--runs", help="timing rounds per side (first discarded; >= 4)", callback=_check_runs),
]


# ------------------------------------------------------------------------------------------ settings
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
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from exc
    configure_logging(s.log_level)
    return s


def _fail(exc: BaseException | str, code: int = EXIT_FAILURES) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, markup=True, highlight=False)
    return typer.Exit(code)


def not_admin(exc: BaseException) -> typer.Exit:
    """An admin's verb whose JetStream call went unanswered (a refused `$JS.API` call times out:
    the credentials are not the admin's): one line, exit 1."""
    return _fail(
        f"the server did not answer a JetStream call ({exc or type(exc).__name__}): are these the admin's credentials?"
    )


def print_json(data: Any) -> None:
    """One JSON document on stdout, never wrapped."""
    sys.stdout.write(json.dumps(data, default=_jsonable, indent=1) + "\n")


def _jsonable(value: object) -> object:
    """A Struct (a record, a report) as its JSON value; anything else as its text."""
    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else str(value)


def write_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write `path` whole or not at all (`shared.files.write_atomic`)."""
    files.write_atomic(path, text, mode=mode)


# ------------------------------------------------------------------------------------------ NATS
NATS_PROBE_TIMEOUT = 3.0


def probe_nats(url: str, timeout: float = NATS_PROBE_TIMEOUT) -> None:
    """Raise ConnectionError naming the URL unless some server of `url` answers with NATS' INFO
    line within `timeout` seconds. CLI verbs fail fast with this; services keep retrying."""
    errors = []
    for server in [u.strip() for u in url.split(",") if u.strip()]:
        parts = urlsplit(server)
        if parts.scheme in ("ws", "wss"):
            return  # websocket servers greet differently; let the client try
        host, port = parts.hostname or "localhost", parts.port or 4222
        try:
            with socket.create_connection((host, port), timeout=timeout) as sock:
                sock.settimeout(timeout)
                if sock.recv(4).upper() == b"INFO":
                    return
                errors.append(f"{host}:{port} is not a NATS server")
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    raise ConnectionError(f"cannot reach NATS at {safe_url(url)} ({'; '.join(errors)})")


@contextlib.contextmanager
def cli_nats(s: Settings, *, attach: bool = False) -> Iterator[str]:
    """The bus URL for a CLI verb: the configured server (checked within a few seconds: one error
    line and exit 1 when it does not answer) or an embedded nats-server with its store in OUT/.state
    (`attach`, for read-only verbs: the one a running `mine` started there, when there is one)."""
    from cppperf.runtime import nats_endpoint
    from cppperf.shared.errors import CppPerfError

    if s.nats_url:
        try:
            probe_nats(s.nats_url)
        except ConnectionError as exc:
            raise _fail(exc) from None
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(nats_endpoint(s, attach=attach))
        except CppPerfError as exc:
            raise _fail(exc) from exc
        yield url


T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T], *, waiting_for: str = "the services to stop") -> T:
    """Run `coro`; on Ctrl-C print "stopping…" and what we wait for at once, then cancel it
    cleanly (second Ctrl-C: the default, immediate interrupt). Exit 130 after a Ctrl-C."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_sigint() -> None:
            console.print(f"stopping… waiting for {waiting_for} (Ctrl-C again to force)")
            loop.remove_signal_handler(signal.SIGINT)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            task.cancel()

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGINT, on_sigint)
            loop.add_signal_handler(signal.SIGTERM, on_sigint)  # `kill`, `docker stop`: the same
        return await coro

    from nats.js.errors import APIError

    try:
        return asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        console.print("stopped")
        raise typer.Exit(130) from None
    except APIError as exc:  # JetStream refused a call: one line with its reason, never a traceback
        raise _fail(jetstream_refusal(exc)) from None


# JetStream's error codes that have a remedy worth saying (nats-server's errors.json)
_JS_REMEDIES = {
    10047: "the bus's store has no room: free disk where its store lives (OUT/.state/nats for the"
    " embedded server) or give the server more (jetstream max_file_store)",
}


def jetstream_refusal(exc: Exception) -> str:
    """One line for a JetStream API error: what the server said, its code, and a remedy if known."""
    description = getattr(exc, "description", None) or str(exc)
    err_code = getattr(exc, "err_code", None)
    line = f"the bus refused: {description} (JetStream error {err_code})"
    remedy = _JS_REMEDIES.get(err_code) if isinstance(err_code, int) else None
    return f"{line}; {remedy}" if remedy else line
