"""A new user's pass over the CLI (issue #28): helps keep their examples' lines, human output
holds no Python reprs, nothing is cut, bad input is one line and a non-zero exit."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_cli_inputs import _store_with, cli

REPR = re.compile(r"\{'|\['|<\w[\w.]* object at 0x")


def test_dataset_stats_prints_counts_not_reprs(tmp_path: Path) -> None:
    out_dir = _store_with(tmp_path)
    res = cli("dataset", "stats", "--out", str(out_dir))
    assert res.exit_code == 0, res.output
    assert not REPR.search(res.output), res.output
    assert "(imported 1)" in res.output and "oracles: unvalidated 1" in res.output
