"""CMake `FetchContent` dependencies of an exported tree, provided offline.

Builds run without network (containers with `network_mode=none`, local builds in a network
namespace), so a project that downloads its test framework at configure time
(`FetchContent_Declare(googletest GIT_REPOSITORY … GIT_TAG …)`, or `URL` of a GitHub archive)
cannot configure. The exported tree therefore carries each declared content's sources at the
declared revision under `.cppperf/fetchcontent/<name>/`, and an initial-cache script
`.cppperf/fetchcontent.cmake` that points `FETCHCONTENT_SOURCE_DIR_<NAME>` at them and sets
`FETCHCONTENT_FULLY_DISCONNECTED=ON`; configure runs with `-C` on that script.

A content's history comes from the same places as a submodule's (`submodules.Sources`): a local
mirror mapped to its repository URL (`builder.submodule_mirrors`), else the shared mirror cache
(fetched when `builder.submodule_fetch`). A declared content none of these has (or whose
repository or revision is a CMake variable, or a download that is no GitHub archive) raises
`MissingFetchContent`, naming it; the builder turns that into a `dependency` rejection. A content
declared by another content (a dependency's own `FetchContent_Declare`, often optional: fast_float's
test data, declared in its tests) that cannot be had is left out with a warning instead: the build
goes on, and configure fails (FULLY_DISCONNECTED) only if it is really needed.
"""

from __future__ import annotations

import io
import itertools
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from cppperf.shared.engine.submodules import (
    MissingSubmodule,
    Sources,
    cache_key,
    merge,
    normalise_url,
    walk,
)
from cppperf.shared.errors import BadInput, TransientError
from cppperf.shared.logging import get_logger
from cppperf.shared.mirror import ensure_local, mirror_path

log = get_logger(__name__)

DIR = ".cppperf/fetchcontent"
INIT_CACHE = ".cppperf/fetchcontent.cmake"

_DECLARE = re.compile(r"\bFetchContent_Declare\s*\(([^)]*)\)", re.IGNORECASE | re.DOTALL)
_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')
_GITHUB_ARCHIVE = re.compile(
    r"^https?://github\.com/([^/]+)/([^/]+)/archive/(?:refs/(?:tags|heads)/)?(.+?)(?:\.zip|\.tar\.gz|\.tgz)$"
)


class MissingFetchContent(MissingSubmodule):
    """A `FetchContent_Declare`d dependency that no mirror or fetch could provide."""

    def __init__(self, name: str, url: str, rev: str, tried: list[str]) -> None:
        self.path, self.url, self.sha, self.tried = name, url, rev, tried
        BadInput.__init__(
            self,
            f"FetchContent {name} ({url or 'no repository'}) at {rev or 'no revision'} cannot be had "
            f"offline; tried: {'; '.join(tried) or 'nothing'}",
        )


@dataclass(frozen=True)
class Content:
    name: str  # as declared (FETCHCONTENT_SOURCE_DIR_<NAME> is its upper case)
    url: str  # the git repository ("" when none could be told)
    rev: str  # tag, branch or commit
    problem: str = ""  # why it cannot be provided whatever the mirrors hold


_KEYS = ("GIT_REPOSITORY", "GIT_TAG", "URL", "SOURCE_DIR")


def _tokens(body: str) -> list[str]:
    """CMake arguments: whitespace-separated, quotes stripped, `#` comments dropped."""
    body = "\n".join(line if '"' in line else line.split("#", 1)[0] for line in body.splitlines())
    return [bare or quoted for quoted, bare in _TOKEN.findall(body)]


def declared(texts: list[str]) -> list[Content]:
    """The remote contents `FetchContent_Declare`d in the given CMake texts (first declaration of
    a name wins, as in CMake); local ones (`SOURCE_DIR`, a `URL` path) are left alone."""
    out: dict[str, Content] = {}
    for text in texts:
        for body in _DECLARE.findall(text):
            toks = _tokens(body)
            if not toks:
                continue
            name, args = toks[0], toks[1:]
            opts: dict[str, str] = {}
            for key, value in itertools.pairwise(args):
                if key in _KEYS:
                    opts.setdefault(key, value)
            if name.lower() in out or "SOURCE_DIR" in opts:
                continue
            git, tag, url = opts.get("GIT_REPOSITORY", ""), opts.get("GIT_TAG", ""), opts.get("URL", "")
            if git:
                content = Content(name, git, tag or "HEAD")
            elif url and re.match(r"^(https?|ftp)://", url):
                mt = _GITHUB_ARCHIVE.match(url)
                if mt:
                    content = Content(name, f"https://github.com/{mt[1]}/{mt[2]}", mt[3])
                else:
                    content = Content(name, "", "", f"its URL {url} is a download, not a GitHub archive")
            else:
                continue  # SOURCE_DIR, a local URL, or a variable cppperf cannot see through
            if "${" in content.url + content.rev:
                content = Content(name, content.url, content.rev, "its repository or tag is a CMake variable")
            out[name.lower()] = content
    return list(out.values())


def _resolve(repo: Path, rev: str) -> str | None:
    """The commit `rev` names in `repo`: a commit id, tag or branch — also `origin/<branch>`
    (a `GIT_TAG` naming the remote-tracking branch of CMake's clone, which a bare mirror holds
    as `refs/heads/<branch>`)."""
    if not repo.exists():
        return None
    tracking = rev.removeprefix("origin/")
    cands = (rev, f"refs/tags/{rev}", f"refs/heads/{rev}", f"origin/{rev}")
    for cand in cands + ((f"refs/heads/{tracking}",) if tracking != rev else ()):
        proc = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{cand}^{{commit}}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    return None


def locate(content: Content, sources: Sources) -> tuple[Path, str]:
    """(git directory, commit) holding `content` at its revision: a mapped mirror or the cache."""
    if content.problem:
        raise MissingFetchContent(content.name, content.url, content.rev, [content.problem])
    tried: list[str] = []
    wanted = normalise_url(content.url)
    mapped = [Path(p).expanduser() for u, p in sources.mirrors.items() if normalise_url(u) == wanted]
    for cand in mapped:
        sha = _resolve(cand, content.rev)
        if sha:
            return cand, sha
        tried.append(f"mirror {cand} (builder.submodule_mirrors) lacks {content.rev}")
    if not mapped:
        tried.append("no builder.submodule_mirrors entry for its URL")
    if sources.cache_dir is not None:
        cand = mirror_path(sources.cache_dir, cache_key(content.url))
        sha = _resolve(cand, content.rev)
        if sha:
            return cand, sha
        if not sources.fetch:
            tried.append(f"cache {cand} (fetching is off: builder.submodule_fetch)")
        else:
            try:
                got = ensure_local(
                    content.url, cache_key(content.url), sources.cache_dir, timeout=sources.timeout
                )
            except (TransientError, BadInput) as exc:
                last = [ln for ln in str(exc).splitlines() if ln.strip()][-1:] or ["failed"]
                tried.append(f"fetching {content.url}: {last[0].strip()[:200]}")
            else:
                sha = _resolve(got, content.rev)
                if sha:
                    return got, sha
                tried.append(f"fetched {content.url}, which lacks {content.rev}")
    raise MissingFetchContent(content.name, content.url, content.rev, tried)


def dirname(content: Content) -> str:
    return f"{DIR}/{content.name.lower()}"


def init_cache(contents: list[Content]) -> str:
    """The `-C` script: every content's source directory (relative to the script) and no network."""
    lines = ["# written by cppperf: FetchContent sources provided offline (see README)"]
    for c in contents:
        rel = c.name.lower()
        lines.append(
            f'set(FETCHCONTENT_SOURCE_DIR_{c.name.upper()} "${{CMAKE_CURRENT_LIST_DIR}}/fetchcontent/{rel}" '
            f'CACHE PATH "{c.url} at {c.rev}")'
        )
    lines.append('set(FETCHCONTENT_FULLY_DISCONNECTED ON CACHE BOOL "no network in the build")')
    return "\n".join(lines) + "\n"


def _cmake_texts(parts: list[bytes]) -> list[str]:
    texts = []
    for part in parts:
        with tarfile.open(fileobj=io.BytesIO(part)) as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and (base == "CMakeLists.txt" or base.endswith(".cmake")):
                    fh = tar.extractfile(member)
                    text = fh.read().decode(errors="replace") if fh else ""
                    if "fetchcontent_declare" in text.lower():
                        texts.append(text)
    return texts


def archive(repo: Path, sha: str, sources: Sources | None = None) -> bytes:
    """One tar of `sha`'s tree with its submodules and, under `.cppperf/`, the sources of every
    content it `FetchContent_Declare`s (nested declarations too) and the `-C` script for them."""
    sources = sources or Sources()
    parts = walk(repo, sha, sources)
    provided: list[Content] = []
    pending = [(c, False) for c in declared(_cmake_texts(parts))]  # (content, declared by a content)
    while pending:
        content, nested = pending.pop(0)
        if any(c.name.lower() == content.name.lower() for c in provided):
            continue
        try:
            where, rev = locate(content, sources)
            mine = walk(where, rev, sources, prefix=dirname(content), base_url=content.url)
        except BadInput as exc:
            if not nested:
                raise
            # a dependency's own declaration is often optional (its tests' data, its benchmarks'
            # framework): left out; if the build does need it, configure says so
            log.warning("fetchcontent_nested_left_out", content=content.name, why=str(exc)[:300])
            continue
        parts += mine
        provided.append(content)
        pending += [(c, True) for c in declared(_cmake_texts(mine))]
    if provided:
        script = init_cache(provided).encode()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(INIT_CACHE)
            info.size, info.mode = len(script), 0o644
            tar.addfile(info, io.BytesIO(script))
        parts.append(buf.getvalue())
    return merge(parts)


def has_init_cache(data: bytes) -> bool:
    """Whether an exported tree's tar carries the FetchContent `-C` script."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return any(m.name.removeprefix("./") == INIT_CACHE for m in tar)
