"""The few lines of a long log that tell a user why a step failed.

A configure log is mostly `-- Looking for …`; a build log is thousands of compiler invocations; a
test log can be megabytes. A rejection shows what matters first: CMake errors with their message,
compiler and linker errors, missing files and packages, failed assertions, and falls back on the
log's last lines when none of those appear.
"""

from __future__ import annotations

import re

_MATTERS = re.compile(
    r"CMake Error|Could NOT find|Could not find|No package '|fatal error|: error|error:|\berror\b:?"
    r"|undefined reference|ld returned|No such file|not found|FAILED|\bFAIL|Failure|Assertion"
    r"|assert|Segmentation fault|Aborted|terminate called|Expected|Which is|exception",
    re.IGNORECASE,
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # compilers colour their diagnostics under Ninja
_NOISE = re.compile(  # progress lines and compiler command lines (their -Werror flags)
    r"^-- |^\[\d+/\d+\] |Looking for|Performing Test|^\S*(?:ccache|c\+\+|g\+\+|gcc|clang\+\+|cc)\s+-",
    re.IGNORECASE,
)


def first_error_lines(output: str, limit: int = 8, width: int = 300) -> list[str]:
    """Up to `limit` lines that explain a failure (a CMake error keeps its indented message)."""
    lines = _ANSI.sub("", output).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines) and len(out) < limit:
        line = lines[i]
        if _MATTERS.search(line) and not _NOISE.search(line) and line.strip()[:width] not in out:
            out.append(line.strip()[:width])
            if line.startswith("CMake Error"):  # its message follows, indented
                j = i + 1
                while j < len(lines) and len(out) < limit and (not lines[j].strip() or lines[j][:1] == " "):
                    if lines[j].strip():
                        out.append(lines[j].strip()[:width])
                    j += 1
                i = j
                continue
        i += 1
    if not out:
        out = [ln.strip()[:width] for ln in lines if ln.strip()][-limit:]
    # a compiler's own diagnosis before the build tool's "FAILED: <object>"
    return sorted(out, key=lambda ln: 1 if ln.startswith(("FAILED:", "ninja:")) else 0)
