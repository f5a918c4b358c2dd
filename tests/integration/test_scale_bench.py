"""bench/scale.py's generated repositories: the generator's ground truth (which rule each commit
breaks, or that it is selected) equals the filter's own walk, the crawler's static checks
accept every repository, and a seed gives the same history, so the scale run's exact funnel check compares like with like."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from cppperf.services.crawler.checks import check_repository
from cppperf.services.filter.walk import walk
from cppperf.shared.rules import Rules
from cppperf.shared.settings import MiningSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from scale_repos import make_repos


def test_generated_truth_matches_the_filter(tmp_path: Path) -> None:
    truths = make_repos(tmp_path, 4, seed=7)
    rules = Rules.from_settings(MiningSettings())
    total: Counter[str] = Counter()
    for t in truths:
        result = walk(Path(t.path), rules)
        assert result.scanned == t.commits
        assert +Counter({"selected": len(result.selected), **result.rejected}) == +t.outcomes
        assert check_repository(Path(t.path)).ok
        total.update(t.outcomes)
    share = total["selected"] / sum(total.values())
    assert 0.25 < share < 0.55  # about 40 % structurally selected, as in the paper's mix
    again = make_repos(tmp_path / "again", 1, seed=7)[0]  # deterministic: the same history
    heads = [
        subprocess.run(
            ["git", "-C", p, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout
        for p in (truths[0].path, again.path)
    ]
    assert heads[0] == heads[1]
