"""The Python API as the ecosystem shapes it: `scan` a generator with since/until and a progress
callback (PyDriller-like), `prove`/`evaluate` typed results (the domain Structs)."""

from __future__ import annotations

import asyncio
import inspect
import json
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

import cppperf
from cppperf.api import ScanProgress, typed
from cppperf.shared.domain import EvalReport, EvalVerdict, InstanceMeta, Verdict
from cppperf.shared.errors import BadInput
from cppperf.shared.service import ServiceContext
from tests.conftest import make_settings
from tests.e2e.test_cli_inputs import _store_with, cli
from tests.gitrepo import commit_files


@pytest.fixture
def dated_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    repo = tmp_path / "proj"
    shas: dict[str, str] = {}
    for n, when in enumerate(
        ("2023-01-10T12:00:00+00:00", "2023-06-01T12:00:00+00:00", "2024-02-01T12:00:00+00:00",
         "2024-03-31T20:00:00+00:00", "2024-04-01T08:00:00+00:00")
    ):  # fmt: skip
        monkeypatch.setenv("GIT_COMMITTER_DATE", when)
        monkeypatch.setenv("GIT_AUTHOR_DATE", when)
        shas[when[:10]] = commit_files(repo, {"a.cpp": f"int a = {n};\n"}, f"change {n}")
    return repo, shas


def test_scan_is_a_generator_with_date_bounds_and_progress(dated_repo: tuple[Path, dict[str, str]]) -> None:
    repo, shas = dated_repo
    seen: list[ScanProgress] = []
    commits = cppperf.scan(repo, since="2024-01-01", until=date(2024, 3, 31), progress=seen.append)
    assert inspect.isgenerator(commits) and not seen  # nothing walked before it is iterated
    first = next(commits)
    assert first.sha == shas["2024-03-31"]  # newest first; the bare until date covers its whole day
    assert [p.commit.sha for p in seen] == [shas["2024-04-01"], shas["2024-03-31"]]  # streamed
    assert seen[0].reason == "out-of-window" and seen[1].reason is None
    assert [c.sha for c in commits] == [shas["2024-02-01"]]
    assert (seen[-1].scanned, seen[-1].selected) == (5, 2)
    assert seen[-1].rejected == {"out-of-window": 3} and seen[0].rejected == {"out-of-window": 1}

    aware = datetime(2023, 6, 1, 11, 0, tzinfo=UTC)
    assert [c.sha for c in cppperf.scan(repo, since=aware, until="2023-06-01T13:00:00")] == [
        shas["2023-06-01"]
    ]


def test_scan_refuses_bad_input_before_walking(dated_repo: tuple[Path, dict[str, str]]) -> None:
    repo, _ = dated_repo
    with pytest.raises(ValueError, match="bad date '2024-13-01'"):
        cppperf.scan(repo, since="2024-13-01")
    with pytest.raises(ValueError, match="is after until"):
        cppperf.scan(repo, since="2024-02-01", until="2024-01-01")
    with pytest.raises(ValueError, match="not a git repository"):
        cppperf.scan(repo / "nope")


def test_evaluate_returns_the_typed_report(tmp_path: Path) -> None:
    out_dir = _store_with(tmp_path)
    iid = "someowner__a-rather-long-repository-name-" + "b" * 12
    report = cppperf.evaluate(iid, "", out_dir=out_dir)
    assert isinstance(report, EvalReport)
    assert report.verdict is EvalVerdict.EMPTY_PATCH and report.opt is False and report.instance_id == iid
    on_disk = json.loads((out_dir / "runs" / "default" / "manual" / iid / "report.json").read_text())
    assert on_disk["verdict"] == report.verdict.value  # the same report the CLI writes


def test_evaluate_refuses_a_run_id_that_would_be_renamed(tmp_path: Path) -> None:
    """Before: run_id ".." wrote under OUT/runs/model, "_x" under OUT/runs/x."""
    out_dir = _store_with(tmp_path)
    iid = "someowner__a-rather-long-repository-name-" + "b" * 12
    for run_id in ("", "..", "_x", "a/b"):
        with pytest.raises(BadInput, match="not a run id"):
            cppperf.evaluate(iid, "", run_id=run_id, out_dir=out_dir)
    assert not (out_dir / "runs").exists()


def test_typed_keeps_declared_keys_and_types_nested_values() -> None:
    report = typed(
        EvalReport,
        {
            "verdict": "opt",
            "opt": True,
            "a_key_from_a_newer_version": 1,
            "per_test": {
                "t": {
                    "agent_speedup": 1.5,
                    "agent_ci": [1.2, 1.8],
                    "agent_improved": True,
                    "agent_regressed": False,
                    "expert_speedup": 1.4,
                    "expert_ci": None,
                    "expert_improved": True,
                    "median_ms": {"old": 10.0, "agent": 6.6},
                    "agent_vs_expert_time_ratio": 0.95,
                    "agent_vs_expert_ci": [0.9, 1.0],
                    "within_opt_fraction": True,
                }
            },
        },
    )
    assert report.verdict is EvalVerdict.OPT and report.per_test is not None
    assert report.per_test["t"].agent_ci == [1.2, 1.8]
    with pytest.raises(Exception, match="verdict"):
        typed(EvalReport, {"verdict": "no-such-verdict"})


def test_imported_record_section_is_typed(tmp_path: Path) -> None:
    out_dir = _store_with(tmp_path)
    (path,) = (out_dir / "instances").glob("*.json")
    meta = typed(InstanceMeta, json.loads(path.read_text())["cppperf"])
    assert meta.verdict is Verdict.IMPROVED and meta.tests[0].name == "t1" and meta.tests[0].improved


@pytest.mark.nats
async def test_evaluate_over_a_bus_api_and_cli_share_one_client(ctx: ServiceContext, tmp_path: Path) -> None:
    """`cppperf.evaluate(..., nats_url=)`: the evaluator service on the bus scores the patch (its
    instance store, not ours: this OUT has no instances) through `cppperf.client`, the module the
    CLI's `evaluate --nats-url` uses; the report comes back typed and is kept where a local
    evaluation writes it."""
    from cppperf.runtime import run_services

    (tmp_path / "service").mkdir()
    service_out = _store_with(tmp_path / "service")
    iid = "someowner__a-rather-long-repository-name-" + "b" * 12
    served = make_settings(tmp_path / "service", nats_url=ctx.settings.nats_url, out_dir=str(service_out))
    mine = tmp_path / "mine"
    with pytest.raises(ValueError, match="unknown instance"):  # without a bus: our OUT decides
        cppperf.evaluate(iid, "", out_dir=mine)
    async with run_services(served, ctx.settings.nats_url, ["evaluator"]):
        report = await asyncio.to_thread(
            cppperf.evaluate, iid, "", model="bus-agent", out_dir=mine, nats_url=ctx.settings.nats_url
        )
        empty = tmp_path / "empty.diff"
        empty.write_text("")
        res = await asyncio.to_thread(
            cli,
            *("evaluate", "--instance", iid, "--patch", str(empty), "--model", "cli-agent", "--json"),
            *("--nats-url", ctx.settings.nats_url, "--out", str(mine)),
        )
    assert isinstance(report, EvalReport)
    assert report.verdict is EvalVerdict.EMPTY_PATCH and report.instance_id == iid
    kept = json.loads((mine / "runs" / "default" / "bus-agent" / iid / "report.json").read_text())
    assert kept["verdict"] == "empty-patch" and kept["model"] == "bus-agent"
    # the CLI, the same client: the same report, kept in the same place
    assert res.exit_code == 0, res.output
    assert [r["verdict"] for r in json.loads(res.stdout)["reports"]] == ["empty-patch"]
    assert (mine / "runs" / "default" / "cli-agent" / iid / "report.json").is_file()
