"""The one structlog configuration: JSON lines when not a TTY, console rendering in a terminal.

Handlers call `clear_contextvars()` then `bind_contextvars(service=…, subject=…, item=…)`.
Values under keys that look secret (token, password, authorization) are masked, and any known
GitHub token string is scrubbed from every event, so tokens never reach a log.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import IO, Any

import structlog

_SECRET_KEYS = re.compile(r"(token|password|secret|authorization|api_key)", re.IGNORECASE)
_TOKEN_PATTERN = re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})\b")
_known_secrets: set[str] = set()


def register_secret(value: str) -> None:
    """Scrub this exact string from every future log event."""
    if value and len(value) >= 6:
        _known_secrets.add(value)


def _scrub_text(text: str) -> str:
    text = _TOKEN_PATTERN.sub("***", text)
    for secret in _known_secrets:
        text = text.replace(secret, "***")
    return text


def redact_secrets(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in list(event_dict.items()):
        if _SECRET_KEYS.search(key) and value:
            event_dict[key] = "***"
        elif isinstance(value, str):
            event_dict[key] = _scrub_text(value)
    return event_dict


class _CurrentStderr:
    """Writes to whatever `sys.stderr` is at call time (test runners swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info", *, json: bool | None = None, file: IO[str] | None = None) -> None:
    """Configure structlog once for the process (safe to call again). `file`: log there instead
    of stderr (the CLI does while a live view owns the terminal)."""
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=True)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info if use_json else structlog.processors.StackInfoRenderer(),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=file or _CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
