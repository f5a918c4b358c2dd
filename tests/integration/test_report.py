"""The dataset report people browse: one count everywhere, a table that sorts and filters, fast
pages written whole with readable modes, and a clean Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from tests.e2e.test_cli_inputs import cli, published, timed


def _record(name: str, sha: str, tests: list[dict[str, Any]], files: int = 1) -> dict[str, Any]:
    rec = published(name, tests, improved=0)
    rec["commit_info"]["new_sha"] = sha * 40
    rec["commit_info"]["files_changed"] = [
        {"filename": f"f{i}.cpp", "status": "modified"} for i in range(files)
    ]
    return rec


def mixed_store(tmp_path: Path) -> Path:
    """Four verdict shapes in two repositories. `mixed` has a significantly faster test and a
    slower one: regressed, though it has a best speed-up (the header said 28 improved where the
    histogram counted 33 of these)."""
    src = tmp_path / "src"
    src.mkdir()
    recs = {
        "fast": _record("o/a", "1", [timed("t", 0.010, 0.005)]),
        "fast2": _record("o/b", "2", [timed("t", 0.010, 0.008), timed("u", 0.010, 0.010)], files=3),
        "mixed": _record("o/a", "3", [timed("t", 0.010, 0.005), timed("u", 0.010, 0.020)]),
        "same": _record("o/b", "4", [timed("t", 0.010, 0.010)]),
    }
    for name, rec in recs.items():
        (src / f"{name}.json").write_text(json.dumps(rec))
    out_dir = tmp_path / "o"
    res = cli("dataset", "import", str(src), "--out", str(out_dir))
    assert res.exit_code == 0, res.output
    return out_dir


class _Overview(HTMLParser):
    """What a reader of the overview sees: the header's per-verdict counts, the speed-up
    histogram's n (SVG text), the instance table's rows and the links."""

    def __init__(self) -> None:
        super().__init__()
        self.header: dict[str, int] = {}
        self.rows: list[dict[str, str]] = []
        self.links: list[str] = []
        self.texts: list[str] = []
        self._verdict: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "span" and "data-verdict" in a:
            self._verdict = a["data-verdict"]
        if tag == "tr" and "data-id" in a:
            self.rows.append(a)
        if tag == "a" and "href" in a:
            self.links.append(a["href"])

    def handle_data(self, data: str) -> None:
        self.texts.append(data)
        if self._verdict is not None and data.strip():
            count = int(data.split(maxsplit=1)[0])
            assert self.header.setdefault(self._verdict, count) == count, "two header counts disagree"
            self._verdict = None


def parse(page: Path) -> _Overview:
    p = _Overview()
    p.feed(page.read_text())
    return p


def test_overview_counts_agree_and_link_every_instance(tmp_path: Path) -> None:
    out_dir = mixed_store(tmp_path)
    dest = tmp_path / "overview.html"
    res = cli("dataset", "report", "--all", str(dest), "--pages", "--out", str(out_dir))
    assert res.exit_code == 0, res.output
    seen = parse(dest)
    per_verdict: dict[str, int] = {}
    for row in seen.rows:
        per_verdict[row["data-verdict"]] = per_verdict.get(row["data-verdict"], 0) + 1
    assert seen.header == per_verdict  # header counts == table rows, verdict by verdict
    assert per_verdict == {"improved": 2, "regressed": 1, "not-improved": 1}
    (title,) = [t for t in seen.texts if "best speed-up of improved instances" in t]
    assert re.search(r"\(n=(\d+)\)", title)[1] == str(seen.header["improved"])  # type: ignore[index]
    # the regressed instance has an improved test, but no speed-up in the improved column
    assert {r["data-verdict"]: r["data-speedup"] != "" for r in seen.rows}["regressed"] is False
    assert sorted(seen.links) == sorted(f"overview_instances/{r['data-id']}.html" for r in seen.rows)
    for link in seen.links:
        assert (dest.parent / link).stat().st_mode & 0o777 == 0o644
    assert dest.stat().st_mode & 0o777 == 0o644
    assert {r["data-files"] for r in seen.rows} == {"single", "multi"}
    assert not list(tmp_path.glob("**/.*.tmp"))


def test_overview_is_a_plain_table_without_javascript(tmp_path: Path) -> None:
    """The filter form starts hidden (the script shows it); the rows are all there in the HTML."""
    out_dir = mixed_store(tmp_path)
    dest = tmp_path / "overview.html"
    assert cli("dataset", "report", "--all", str(dest), "--out", str(out_dir)).exit_code == 0
    text = dest.read_text()
    assert '<form id="filters" hidden>' in text
    assert not re.search(r"<script[^>]+src=|<link|(src|href)=\"https?:", text)  # nothing fetched at view time
    assert len(parse(dest).rows) == 4 and "<a href" not in text  # no --pages: nothing to link to


def test_ctrl_c_during_pages_exits_130_with_whole_files(tmp_path: Path) -> None:
    """SIGINT while pages are written: one line, exit 130, no overview, no temporary files, every
    page on disk complete."""
    out_dir = mixed_store(tmp_path)
    for i in range(150):  # enough pages that the signal lands mid-way
        src = out_dir / "instances"
        first = sorted(src.glob("*.json"))[0]
        rec = json.loads(first.read_text())
        rec["cppperf"]["instance_id"] = iid = f"o__a-{i:012x}"
        (src / f"{iid}.json").write_text(json.dumps(rec))
    dest = tmp_path / "site.html"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cppperf",
            "dataset",
            "report",
            "--all",
            str(dest),
            "--pages",
            "--out",
            str(out_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    folder = tmp_path / "site_instances"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(folder.glob("*.html"))) < 3:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert proc.returncode == 130, output
    assert len(lines) == 1 and lines[0].startswith("interrupted: ") and "no overview" in lines[0], output
    assert not dest.exists()
    pages = list(folder.glob("*.html"))
    assert 3 <= len(pages) < 154
    assert all(p.read_text().endswith("</html>") for p in pages)
    assert not [p for p in folder.iterdir() if p.suffix != ".html"]
