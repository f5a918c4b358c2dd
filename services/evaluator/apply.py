"""Apply an agent's patch to a plain exported tree: `git apply`, then `git apply --recount -C1`.

The tree has no `.git` (an export), git runs with no system or global config and a ceiling
directory just above the tree (it cannot find any repository, so no hooks, filters, fsmonitor or
config commands can run), and — where bubblewrap works — inside the jail as the sandbox uid with
only the tree writable. `git apply` is all-or-nothing and refuses paths outside the tree or behind
a symlink; there is no `patch` fallback (GNU patch follows `---` names, symlinks and C-quoted
names its own way). What the patch really changed is then checked on the tree (checks.check_tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cppperf.shared.engine.sandbox import Jail, Limits, hand_over, jail_env, run

ATTEMPTS = (
    ("git apply", ["apply", "--verbose", "--whitespace=nowarn"]),
    ("git apply --recount -C1", ["apply", "--verbose", "--whitespace=nowarn", "--recount", "-C1"]),
)
_LOG_LIMIT = 64 * 1024


@dataclass(frozen=True)
class ApplyResult:
    ok: bool
    method: str = ""
    log: str = ""


def git_env(tree: Path) -> dict[str, str]:
    """Git with nothing configured: no system/global config, no repository discovery above `tree`."""
    return {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CEILING_DIRECTORIES": str(tree.parent),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ATTR_NOSYSTEM": "1",
    }


def apply_patch(src: Path, patch_file: Path, *, jailed: bool, timeout: float = 120) -> ApplyResult:
    """Apply `patch_file` to the plain tree `src`; which attempt applied it, or why none did."""
    if (src / ".git").exists():
        raise ValueError(f"{src} must be a plain tree (it has a .git)")
    jail: Jail | None = None
    if jailed:
        hand_over(src)
        jail = Jail(rw=((src, src),), ro=((patch_file, patch_file),))
        env = jail_env(git_env(src))
    else:
        env = {**jail_env(git_env(src))}
    log: list[str] = []
    for name, args in ATTEMPTS:
        res = run(
            ["git", *args, str(patch_file)],
            cwd=src,
            env=env,
            limits=Limits(timeout=timeout, memory_mb=2048, processes=64),
            sandbox=jailed,
            jail=jail,
            output_limit=_LOG_LIMIT,
        )
        log.append(f"$ {name}\n{res.output}")
        if res.ok:
            return ApplyResult(True, name, "\n".join(log))
    return ApplyResult(False, "", "\n".join(log))
