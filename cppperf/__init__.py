"""cppperf: mine, prove, package and score performance-improving C++ commits.

The Python API (details in `cppperf.api`):

- `cppperf.scan(repo)` -- the structural filter over a local repository's history;
- `cppperf.prove(repo, sha, runs=11, out_dir=...)` -- build and time one commit against its
  parent, write and return the instance record;
- `cppperf.evaluate(instance_id, patch, model=..., out_dir=...)` -- score one agent patch;
- `cppperf.settings(**overrides)` -- the typed settings these take as `s=`.
"""

from cppperf.api import commit_from_repo, evaluate, prove, scan, settings

__all__ = ["commit_from_repo", "evaluate", "prove", "scan", "settings"]
