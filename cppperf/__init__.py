"""cppperf: mine, prove, package and score performance-improving C++ commits.

The Python API (details in `cppperf.api`):

- `cppperf.scan(repo, since=..., until=..., progress=...)` -- the structural filter over a local
  repository's history, a generator of the selected commits;
- `cppperf.prove(repo, sha, runs=11, out_dir=...)` -- build and time one commit against its
  parent, write the instance record and return it typed (`Proof`);
- `cppperf.evaluate(instance_id, patch, model=..., out_dir=...)` -- score one agent patch (an
  `EvalReport`);
- `cppperf.settings(**overrides)` -- the typed settings these take as `s=`.
"""

from cppperf.api import Proof, ScanProgress, commit_from_repo, evaluate, prove, scan, settings

__all__ = ["Proof", "ScanProgress", "commit_from_repo", "evaluate", "prove", "scan", "settings"]
