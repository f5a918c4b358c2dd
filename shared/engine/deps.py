"""Missing dependencies: read them from CMake's output and cache, map them to Debian packages.

Sources: `Could NOT find Foo`, `By not providing "FindFoo.cmake"`, `Could not find a package
configuration file provided by "Foo"`, `No package 'foo' found` (pkg-config), and `*_NOTFOUND`
entries in CMakeCache.txt. The mapping table (`deps.toml`, shipped in the package) is maintained
by hand; unknown names are reported as such. An optional LLM fallback proposes packages for names
the table lacks (bounded attempts; see `propose_with_llm`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

_PATTERNS = [
    re.compile(r"Could NOT find (\w[\w.+-]*)"),
    re.compile(r'By not providing "Find([\w.+-]+)\.cmake"'),
    re.compile(
        r"Could not find a (?:package configuration file|configuration file for package)"
        r'\s+provided by\s+"([\w.+-]+)"'
    ),
    re.compile(r"No package '([\w.+-]+)' found"),
    re.compile(r"The following required packages were not found:\s*\n\s*-\s*([\w.+-]+)"),
]
_NOTFOUND = re.compile(
    r"^([\w.+-]+?)(?:_DIR|_LIBRARY|_INCLUDE_DIR|_EXECUTABLE)?:\w+=\S*-NOTFOUND$", re.MULTILINE
)


@cache
def package_table() -> dict[str, list[str]]:
    text = resources.files("cppperf.shared.engine").joinpath("deps.toml").read_text()
    table: dict[str, list[str]] = tomllib.loads(text)["packages"]
    return {k.lower(): v for k, v in table.items()}


@dataclass(frozen=True)
class MissingDeps:
    names: list[str]
    debian: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"missing: {', '.join(self.names)}"]
        if self.debian:
            parts.append(f"install: {' '.join(self.debian)}")
        if self.unknown:
            parts.append(f"no package known for: {', '.join(self.unknown)}")
        return "; ".join(parts)


def missing_names(log: str, cache_file: Path | None = None) -> list[str]:
    names: list[str] = []
    for pat in _PATTERNS:
        names += pat.findall(log)
    if cache_file is not None and cache_file.is_file():
        for name in _NOTFOUND.findall(cache_file.read_text(errors="replace")):
            if not name.startswith("CMAKE_"):
                names.append(name)
    seen: dict[str, None] = {}
    for n in names:
        seen.setdefault(n, None)
    return list(seen)


def resolve(names: list[str]) -> MissingDeps:
    table = package_table()
    debian: list[str] = []
    unknown: list[str] = []
    for name in names:
        pkgs = table.get(name.lower()) or table.get(name.lower().removeprefix("lib"))
        if pkgs is None:
            unknown.append(name)
        else:
            debian += [p for p in pkgs if p not in debian]
    return MissingDeps(names=names, debian=debian, unknown=unknown)


def diagnose(log: str, cache_file: Path | None = None) -> MissingDeps | None:
    names = missing_names(log, cache_file)
    return resolve(names) if names else None


_DEB_NAME = re.compile(r"\b[a-z0-9][a-z0-9+.-]{1,60}\b")
LLM_DEPS_PROMPT = """A CMake configure step failed on Debian. Log excerpt:

{log}

Name the Debian packages to install so the configure succeeds. Answer with package names only,
comma separated, nothing else."""


async def propose_with_llm(
    log: str, ask: Callable[[str], Awaitable[str]], *, attempts: int = 2, known: set[str] | None = None
) -> list[str]:
    """Ask an OpenAI-compatible model for Debian packages; keep names that look like packages
    (and, when `known` is given, exist in that set). Bounded: at most `attempts` questions."""
    excerpt = "\n".join(line for line in log.splitlines() if line.strip())[-3000:]
    for _ in range(attempts):
        reply = await ask(LLM_DEPS_PROMPT.format(log=excerpt))
        names = [n for n in _DEB_NAME.findall(reply.lower()) if n.endswith(("-dev", "-bin")) or "lib" in n]
        if known is not None:
            names = [n for n in names if n in known]
        if names:
            return list(dict.fromkeys(names))
    return []
