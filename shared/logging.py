"""The one structlog configuration: JSON lines when not a TTY, console rendering in a terminal.

Handlers call `clear_contextvars()` then `bind_contextvars(service=…, subject=…, item=…)`.
Values under keys that look secret (token, password, authorization) are masked, at any depth of
nested dicts, lists and tuples; any known secret (GitHub tokens, the password of a URL given to
`register_url`) and the userinfo of any URL are scrubbed from every string, including formatted
tracebacks (the scrubber runs after `format_exc_info`), so secrets never reach a log.
`safe_url` turns a URL (or a comma-separated seed list) into host:port only, for messages.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import IO, Any
from urllib.parse import unquote, urlsplit

import structlog

_SECRET_KEYS = re.compile(r"(token|password|secret|authorization|api_key)", re.IGNORECASE)
_TOKEN_PATTERN = re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})\b")
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)
_known_secrets: set[str] = set()


def register_secret(value: str) -> None:
    """Scrub this exact string from every future log event."""
    if value and len(value) >= 6:
        _known_secrets.add(value)


def register_url(url: str) -> None:
    """Scrub the user names and passwords of every server of `url` (a seed list) from logs."""
    for server in url.split(","):
        parts = urlsplit(server.strip())
        for part in (parts.password, parts.username):
            if part:
                register_secret(unquote(part))
                register_secret(part)


def safe_url(url: str) -> str:
    """`nats://user:pw@a:4222,nats://b` as `a:4222,b:4222`: hosts and ports only."""
    out = []
    for server in [u.strip() for u in url.split(",") if u.strip()]:
        parts = urlsplit(server if "://" in server else f"nats://{server}")
        out.append(f"{parts.hostname or '?'}:{parts.port or 4222}")
    return ",".join(out)


def scrub_text(text: str) -> str:
    text = _URL_USERINFO.sub(r"\g<scheme>***@", text)
    text = _TOKEN_PATTERN.sub("***", text)
    for secret in sorted(_known_secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _scrub(key: str, value: Any) -> Any:
    if key and _SECRET_KEYS.search(key) and value:
        return "***"
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, Mapping):
        return {k: _scrub(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub("", v) for v in value]
    if isinstance(value, BaseException):
        return scrub_text(str(value))
    return value


def redact_secrets(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in list(event_dict.items()):
        event_dict[key] = _scrub(key, value)
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
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            redact_secrets,  # after the traceback is formatted: its text is scrubbed too
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=file or _CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
