"""Container images in layers (SWE-bench's idea), keyed so identical layers are shared:

    base      cppperf/base:<release>            a Debian release of the commit's era with the
                                                 toolchain (GCC, CMake, Ninja, ccache, Python)
    deps      cppperf/deps:<hash(base, packages)> base + the Debian packages the project needs
    env       cppperf/env:<hash(base, packages,   base or deps + the in-container runner at
                            runner)>              /opt/cppperf/runner.py (a runner change: a new env)
    instance  cppperf/<owner>__<name>:<sha12>    env + /work: both trees built + the record

Containers run with a read-only root (see docker_backend.py), so nothing is copied into a running
container's root: the runner is baked into the env image, the trees live on a volume at /work,
and an instance image is the env image plus a layer holding a copy of that volume.

Base images are made without a registry: `debootstrap` a minimal root file system with the
toolchain, then import it (`cppperf images bootstrap`). That is how an air-gapped cluster (and CI)
gets them.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cppperf.shared.engine.fetchcontent import archive
from cppperf.shared.engine.submodules import Sources
from cppperf.shared.errors import InfraFailure, ToolMissing

TOOLCHAIN = ["ca-certificates", "g++", "cmake", "ninja-build", "ccache", "make", "python3", "procps", "git"]


@dataclass(frozen=True)
class Era:
    release: str
    since: str  # first commit date this release serves (its release date)
    gcc: str
    cmake: tuple[int, int]


# Debian releases by date: a commit is built with the release that was current when it was made,
# unless its cmake_minimum_required needs a newer CMake.
ERAS = [
    Era("buster", "0000-00-00", "8", (3, 13)),
    Era("bullseye", "2021-08-14", "10", (3, 18)),
    Era("bookworm", "2023-06-10", "12", (3, 25)),
    Era("trixie", "2025-08-09", "14", (3, 31)),
]
_CMAKE_MIN = re.compile(r"cmake_minimum_required\s*\(\s*VERSION\s+(\d+)\.(\d+)", re.IGNORECASE)


def era_for(commit_date: str, cmakelists: str = "", *, available: list[str] | None = None) -> Era:
    """The release for a commit date (ISO), bumped to one whose CMake satisfies the project."""
    candidates = [e for e in ERAS if available is None or e.release in available] or ERAS
    era = candidates[0]
    for e in candidates:
        if commit_date[:10] >= e.since:
            era = e
    mt = _CMAKE_MIN.search(cmakelists)
    if mt:
        need = (int(mt.group(1)), int(mt.group(2)))
        for e in candidates[candidates.index(era) :]:
            if e.cmake >= need:
                return e
        return candidates[-1]
    return era


def base_name(release: str) -> str:
    return f"cppperf/base:{release}"


RUNNER = "/opt/cppperf/runner.py"


def runner_source() -> bytes:
    return resources.files("cppperf.shared.engine").joinpath("runner_script.py").read_bytes()


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def deps_name(base_id: str, packages: list[str]) -> str:
    return f"cppperf/deps:{_digest(base_id, *sorted(set(packages)))}"


def env_name(base_id: str, packages: list[str], runner: bytes | None = None) -> str:
    """The env image's name: keyed by the base, the package set and the runner's bytes."""
    runner_sha = hashlib.sha256(runner_source() if runner is None else runner).hexdigest()
    return f"cppperf/env:{_digest(base_id, *sorted(set(packages)), 'runner=' + runner_sha)}"


def instance_image_name(repo: str, sha: str) -> str:
    return f"cppperf/{repo.replace('/', '__').lower()}:{sha[:12]}"


def image_exists(client: Any, name: str) -> bool:
    try:
        client.images.get(name)
    except Exception:  # docker.errors.ImageNotFound; the SDK is typed loosely
        return False
    return True


def bootstrap_base(
    client: Any,
    release: str = "bookworm",
    *,
    mirror: str = "http://deb.debian.org/debian",
    force: bool = False,
) -> str:
    """debootstrap `release` with the toolchain, import it as cppperf/base:<release>; its name."""
    name = base_name(release)
    if image_exists(client, name) and not force:
        return name
    if subprocess.run(["which", "debootstrap"], capture_output=True, check=False).returncode != 0:
        raise ToolMissing("debootstrap is not installed (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="cppperf-rootfs-") as root:
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(TOOLCHAIN)}", release, root, mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise InfraFailure(f"debootstrap {release} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        subprocess.run(
            ["chroot", root, "useradd", "-u", "1000", "-m", "runner"], capture_output=True, check=False
        )
        # `with`: the pipe is closed and tar reaped even if the import fails (an unclosed pipe was a
        # ResourceWarning, an error under the tests' filterwarnings, on a machine's first bootstrap)
        with subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE) as tar:
            assert tar.stdout is not None
            answer = client.api.import_image_from_stream(tar.stdout, repository="cppperf/base", tag=release)
        if tar.returncode != 0:
            raise InfraFailure(f"tar of the {release} root file system failed (exit {tar.returncode})")
    image_id = _imported_id(answer)
    client.images.get(image_id).tag("cppperf/base", release)
    return name


def _imported_id(answer: Any) -> str:
    text = answer if isinstance(answer, str) else str(answer)
    mt = re.search(r"sha256:[0-9a-f]{64}", text)
    if not mt:
        raise InfraFailure(f"image import gave no id: {text[:300]}")
    return mt.group(0)


def ensure_env_image(client: Any, base: str, packages: list[str]) -> str:
    """The env image for `base` + `packages` + the runner (built once, shared by every repo that
    needs them): the packages in a deps image of their own (a runner change does not reinstall
    them), the runner in a small layer on top."""
    base_id = client.images.get(base).id
    runner = runner_source()
    name = env_name(base_id, packages, runner)
    if image_exists(client, name):
        return name
    parent = base
    if packages:
        parent = deps_name(base_id, packages)
        if not image_exists(client, parent):
            _build(
                client,
                parent,
                f"FROM {base}\n"
                "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                "--no-install-recommends "
                + " ".join(sorted(set(packages)))
                + " && rm -rf /var/lib/apt/lists/*\n",
                {},
                f"could not build env image with {' '.join(packages)}",
            )
    # COPY keeps the context's mode (0755, root's): the jailed uids can run it, not change it
    dockerfile = (
        f"FROM {parent}\nCOPY runner.py {RUNNER}\n"
        f"LABEL cppperf.runner={json.dumps(hashlib.sha256(runner).hexdigest())}\n"
    )
    _build(client, name, dockerfile, {"runner.py": runner}, "could not build the env image with the runner")
    return name


def _build(client: Any, tag: str, dockerfile: str, files: dict[str, bytes], what: str) -> None:
    try:
        client.images.build(
            fileobj=io.BytesIO(_context_tar(dockerfile, files)),
            custom_context=True,
            tag=tag,
            rm=True,
            network_mode="host",
            pull=False,
        )
    except Exception as exc:  # docker.errors.BuildError / APIError
        raise InfraFailure(f"{what}: {exc}") from exc


def _context_tar(dockerfile: str, files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in [("Dockerfile", dockerfile.encode(), 0o644)] + [
            (n, d, 0o755) for n, d in files.items()
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_bytes(files: dict[str, bytes], *, mode: int = 0o644) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def git_archive(repo: Path, sha: str, submodules: Sources | None = None) -> bytes:
    """`sha`'s tree as a tar, submodules included at their recorded revisions, FetchContent
    dependencies under `.cppperf/` (see `fetchcontent`)."""
    return archive(repo, sha, submodules)


def cmake_texts(repo: Path, sha: str) -> list[str]:
    """The top CMakeLists.txt and cmake/*.cmake of a commit, read from git."""
    names = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", sha, "CMakeLists.txt", "cmake/"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    texts = []
    for name in names:
        if name == "CMakeLists.txt" or name.endswith(".cmake"):
            out = subprocess.run(
                ["git", "-C", str(repo), "show", f"{sha}:{name}"], capture_output=True, check=False
            )
            texts.append(out.stdout.decode(errors="replace"))
    return texts
