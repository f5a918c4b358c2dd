"""Apply a patch like SWE-bench: `git apply`, then `git apply --3way`, then `patch --fuzz`.
Returns which one applied, or why none did."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_GIT = ["git", "-c", "user.name=cppperf", "-c", "user.email=cppperf@localhost"]


@dataclass(frozen=True)
class ApplyResult:
    ok: bool
    method: str = ""
    log: str = ""


def init_tree(src: Path) -> None:
    """Make `src` a one-commit git repository so `git apply --3way` has blobs to merge with."""
    subprocess.run([*_GIT, "-C", str(src), "init", "-q"], check=True, capture_output=True)
    subprocess.run([*_GIT, "-C", str(src), "add", "-A", "-f"], check=True, capture_output=True)
    subprocess.run(
        [*_GIT, "-C", str(src), "commit", "-q", "-m", "base", "--no-verify"], check=True, capture_output=True
    )


def apply_patch(src: Path, patch_file: Path, *, timeout: float = 120) -> ApplyResult:
    attempts = [
        ("git apply", [*_GIT, "-C", str(src), "apply", "--verbose", "--whitespace=nowarn", str(patch_file)]),
        ("git apply --3way", [*_GIT, "-C", str(src), "apply", "--verbose", "--3way", str(patch_file)]),
        (
            "patch --fuzz",
            ["patch", "--batch", "--forward", "-p1", "--fuzz=3", "-d", str(src), "-i", str(patch_file)],
        ),
    ]
    log: list[str] = []
    for name, argv in attempts:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
        log.append(f"$ {name}\n{proc.stdout}{proc.stderr}")
        if proc.returncode == 0:
            return ApplyResult(True, name, "\n".join(log))
        # a failed attempt must not leave a half-applied tree for the next one
        subprocess.run([*_GIT, "-C", str(src), "reset", "-q", "--hard"], capture_output=True, check=False)
        subprocess.run([*_GIT, "-C", str(src), "clean", "-q", "-fdx"], capture_output=True, check=False)
    return ApplyResult(False, "", "\n".join(log))
