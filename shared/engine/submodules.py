"""Git submodules of an exported tree: found, fetched and archived at the recorded revisions.

`git archive` leaves submodules out (a gitlink is only a commit id), yet many repositories keep
their test and benchmark frameworks there (snappy: `third_party/googletest`). `archive(repo, sha)`
returns one tar of the commit's tree with every submodule, nested ones too, at the revision the
commit records. Each submodule's history comes from the first place that has the revision:

1. the clone itself (`.git/modules/<name>`, what `git submodule update` fetched);
2. a local mirror named for its URL in `builder.submodule_mirrors` (offline machines);
3. the shared mirror cache (`<mirror dir>/<owner>__<name>.git`, the same layout as repository
   mirrors, so every instance of a repository shares one copy), fetched when `builder.submodule_fetch`.

A submodule none of these has raises `MissingSubmodule`, naming it and what was tried; the builder
turns that into a `dependency` rejection.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from cppperf.shared.errors import BadInput, TransientError
from cppperf.shared.mirror import ensure_local, is_remote, mirror_path

GITLINK = "160000"


class MissingSubmodule(BadInput):
    """A submodule revision that no clone, mirror or fetch could provide."""

    def __init__(self, path: str, url: str, sha: str, tried: list[str]) -> None:
        self.path, self.url, self.sha, self.tried = path, url, sha, tried
        super().__init__(
            f"submodule {path} ({url or 'no URL in .gitmodules'}) at {sha[:12]} cannot be had; "
            f"tried: {'; '.join(tried) or 'nothing'}"
        )


@dataclass(frozen=True)
class Submodule:
    name: str  # the .gitmodules section name (also its directory under .git/modules)
    path: str  # where it sits in the tree
    url: str  # absolute (relative URLs resolved against the superproject's)
    sha: str  # the revision the superproject records


@dataclass(frozen=True)
class Sources:
    """Where submodule histories may come from (see the module docstring)."""

    mirrors: dict[str, str] = field(default_factory=dict)  # URL -> local git directory
    cache_dir: Path | None = None  # shared mirror cache; None: no cache, no fetch
    fetch: bool = True
    timeout: float = 1800.0


def _git(repo: Path, *args: str, check: bool = False) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-c", "protocol.file.allow=always", "-C", str(repo), *args],
        capture_output=True,
        check=check,
    )


def normalise_url(url: str) -> str:
    """The form URLs are compared in: no trailing slash or `.git`, scp syntax as ssh://."""
    u = url.strip().rstrip("/")
    if u.endswith(".git"):
        u = u[:-4]
    if u.startswith("git@") and ":" in u:
        host, _, path = u[4:].partition(":")
        u = f"ssh://git@{host}/{path}"
    return u


def resolve_url(url: str, base: str) -> str:
    """A `.gitmodules` URL made absolute: `../x.git` is relative to the superproject's URL."""
    if not url.startswith(("./", "../")) or not base:
        return url
    parts = base.rstrip("/").split("/")
    for piece in url.split("/"):
        if piece == "..":
            parts.pop()
        elif piece not in (".", ""):
            parts.append(piece)
    return "/".join(parts)


def origin_url(repo: Path) -> str:
    proc = _git(repo, "config", "--get", "remote.origin.url")
    return proc.stdout.decode().strip() if proc.returncode == 0 else ""


def submodules_at(repo: Path, sha: str, base_url: str = "") -> list[Submodule]:
    """The submodules `sha` records: gitlinks in its tree joined with its `.gitmodules`."""
    tree = _git(repo, "ls-tree", "-r", "-z", sha)
    if tree.returncode != 0:
        raise BadInput(f"cannot list {sha[:12]}: {tree.stderr.decode(errors='replace').strip()[-300:]}")
    links: dict[str, str] = {}
    for entry in tree.stdout.decode(errors="replace").split("\0"):
        meta, _, path = entry.partition("\t")
        fields = meta.split()
        if len(fields) == 3 and fields[0] == GITLINK:
            links[path] = fields[2]
    if not links:
        return []
    config = _git(repo, "config", "--blob", f"{sha}:.gitmodules", "-z", "--get-regexp", r"^submodule\.")
    names: dict[str, str] = {}  # path -> name
    urls: dict[str, str] = {}  # name -> url
    for item in config.stdout.decode(errors="replace").split("\0"):
        key, _, value = item.partition("\n")
        if not key.startswith("submodule."):
            continue
        name, _, attr = key[len("submodule.") :].rpartition(".")
        if attr == "path":
            names[value] = name
        elif attr == "url":
            urls[name] = value
    base = base_url or origin_url(repo)
    out = []
    for path, link_sha in sorted(links.items()):
        name = names.get(path, path)
        out.append(Submodule(name, path, resolve_url(urls.get(name, ""), base), link_sha))
    return out


def _has_commit(repo: Path, sha: str) -> bool:
    return repo.exists() and _git(repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0


def _modules_dir(repo: Path) -> Path | None:
    """`.git/modules` of a clone (worktrees share the main clone's); None for a bare mirror."""
    proc = _git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
    if proc.returncode != 0:
        return None
    return Path(proc.stdout.decode().strip()) / "modules"


def cache_key(url: str) -> str:
    """`owner/name` of a URL (the last two path segments), as repository mirrors are named."""
    path = urlparse(normalise_url(url)).path if is_remote(url) else normalise_url(url)
    segs = [s for s in path.split("/") if s]
    return "/".join(segs[-2:]) if len(segs) >= 2 else (segs[-1] if segs else "submodule")


def _from_cache(sub: Submodule, sources: Sources, tried: list[str]) -> Path | None:
    if sources.cache_dir is None or not sub.url:
        return None
    cand = mirror_path(sources.cache_dir, cache_key(sub.url))
    if _has_commit(cand, sub.sha):
        return cand
    if not sources.fetch:
        tried.append(f"cache {cand} (fetching is off: builder.submodule_fetch)")
        return None
    try:
        got = ensure_local(sub.url, cache_key(sub.url), sources.cache_dir, timeout=sources.timeout)
    except (TransientError, BadInput) as exc:
        last = [ln for ln in str(exc).splitlines() if ln.strip()][-1:] or ["failed"]
        tried.append(f"fetching {sub.url}: {last[0].strip()[:200]}")
        return None
    if _has_commit(got, sub.sha):
        return got
    tried.append(f"fetched {sub.url}, which lacks {sub.sha[:12]}")
    return None


def locate(sub: Submodule, modules: Path | None, sources: Sources) -> Path:
    """A git directory holding `sub.sha`: the clone's, a mapped mirror, or the (fetched) cache."""
    tried: list[str] = []
    if modules is not None:
        cand = modules / sub.name
        if _has_commit(cand, sub.sha):
            return cand
        tried.append(f"the clone's {cand}")
    wanted = normalise_url(sub.url)
    mapped = [Path(p).expanduser() for u, p in sources.mirrors.items() if normalise_url(u) == wanted]
    for cand in mapped:
        if _has_commit(cand, sub.sha):
            return cand
        tried.append(f"mirror {cand} (builder.submodule_mirrors)")
    if not mapped:
        tried.append("no builder.submodule_mirrors entry for its URL")
    got = _from_cache(sub, sources, tried)
    if got is None:
        raise MissingSubmodule(sub.path, sub.url, sub.sha, tried)
    return got


def _archive_one(repo: Path, sha: str, prefix: str) -> bytes:
    args = ["archive", "--format=tar"] + ([f"--prefix={prefix}/"] if prefix else []) + [sha]
    proc = _git(repo, *args)
    if proc.returncode != 0:
        raise BadInput(f"cannot export {sha[:12]}: {proc.stderr.decode(errors='replace').strip()[-300:]}")
    return proc.stdout


def _walk(
    repo: Path, sha: str, prefix: str, base_url: str, modules: Path | None, sources: Sources
) -> Iterator[bytes]:
    yield _archive_one(repo, sha, prefix)
    for sub in submodules_at(repo, sha, base_url):
        where = locate(sub, modules, sources)
        nested = where / "modules" if (where / "modules").is_dir() else None
        full = f"{prefix}/{sub.path}" if prefix else sub.path
        yield from _walk(where, sub.sha, full, sub.url, nested, sources)


def walk(repo: Path, sha: str, sources: Sources, prefix: str = "", base_url: str = "") -> list[bytes]:
    """Tars of `sha`'s tree (under `prefix`) and of each of its submodules, nested too."""
    modules = (
        _modules_dir(repo) if not prefix else (repo / "modules" if (repo / "modules").is_dir() else None)
    )
    return list(_walk(repo, sha, prefix, base_url or origin_url(repo), modules, sources))


def merge(parts: list[bytes]) -> bytes:
    """One tar of several; the first member of a name wins (a gitlink's empty directory, then the
    submodule's files)."""
    if len(parts) == 1:
        return parts[0]
    buf = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as out:
        for part in parts:
            with tarfile.open(fileobj=io.BytesIO(part)) as tar:
                for member in tar:
                    if member.name in seen:
                        continue
                    seen.add(member.name)
                    out.addfile(member, tar.extractfile(member) if member.isfile() else None)
    return buf.getvalue()


def archive(repo: Path, sha: str, sources: Sources | None = None) -> bytes:
    """One tar of `sha`'s tree with its submodules (nested too) at their recorded revisions."""
    return merge(walk(repo, sha, sources or Sources()))
