"""The typed domain: every verdict spelled once (StrEnum, JSON unchanged), the Structs describe
what the builder and the evaluator really write (no key outside the schema), and their JSON
schemas are exported (`cppperf schema`)."""

from __future__ import annotations

import json
import random

import msgspec
import pytest
from typer.testing import CliRunner

from cppperf.cli import app
from cppperf.services.builder.instance import InstanceResult
from cppperf.services.builder.record import build_record
from cppperf.services.evaluator.score import score
from cppperf.shared import domain as d
from cppperf.shared import messages as m
from cppperf.shared.engine.protocol import measure
from cppperf.shared.engine.sandbox import RunResult
from cppperf.shared.engine.stats import compare_all, verdict
from cppperf.shared.settings import load_settings
from tests.conftest import strict


def test_enums_are_their_strings_on_the_wire() -> None:
    assert json.dumps({"v": d.Verdict.UNCHANGED_BINARIES}) == '{"v": "unchanged-binaries"}'
    assert m.encode(m.PatchBuilt(instance_id="i", repo="r", sha="s", parent="p", verdict=d.Verdict.IMPROVED))
    assert "improved" in d.BUILT_VERDICTS and "rejected" not in d.BUILT_VERDICTS
    assert d.to_struct({"verdict": "opt"}, d.EvalReport).verdict is d.EvalVerdict.OPT
    with pytest.raises(msgspec.ValidationError):
        d.to_struct({"verdict": "splendid"}, d.EvalReport)


def test_every_schema_exports() -> None:
    schemas = d.schemas()
    assert set(schemas) == set(d.SCHEMA_TYPES)
    meta = schemas["instance-meta"]["$defs"]["InstanceMeta"]  # type: ignore[index]
    assert "verdict" in meta["required"]
    out = CliRunner().invoke(app, ["schema", "eval-report"])
    assert out.exit_code == 0 and "EvalReport" in out.stdout
    bad = CliRunner().invoke(app, ["schema", "nope"])
    assert bad.exit_code == 2 and "unknown schema" in bad.output


def _fake_run(side: str, name: str) -> RunResult:
    base = 0.010 if side == "old" else 0.008
    return RunResult(0, base * random.uniform(0.98, 1.02), base, "", False, False)


def test_the_record_section_matches_instance_meta() -> None:
    random.seed(1)
    settings = load_settings(env={}).builder
    meas = measure(["a", "b"], _fake_run, rounds=8, warmup=1, seed=3)
    decided = compare_all(
        {n: (s.old, s.new) for n, s in meas.samples.items()},
        alpha=0.05,
        min_improvement=0.05,
        resamples=200,
        seed=3,
    )
    res = InstanceResult(
        instance_id="o__r-aaaaaaaaaaaa",
        verdict=verdict(decided),
        verdict_paper=verdict(decided, paper=True),
        tests=decided,
        measurement=meas,
        build_steps=[
            d.BuildStep(side="old", step="configure", ok=True, seconds=1.0, category=None, log=None)
        ],
        confirmations={"a": d.Confirmation(held=True, old=[1.0], new=[0.5], ci=[0.4, 0.6])},
    )
    commit = m.CommitSelected(
        repo="o/r", url="u", sha="a" * 40, parent="b" * 40, date="2024-01-01", message="x"
    )
    section = build_record(commit, res, diff="", settings=settings)["cppperf"]
    assert set(section) <= set(d.InstanceMeta.__struct_fields__), set(section) - set(
        d.InstanceMeta.__struct_fields__
    )
    meta = d.to_struct(json.loads(json.dumps(section)), d.InstanceMeta)
    assert meta.verdict is d.Verdict.IMPROVED and meta.tests[0].name in {"a", "b"}
    assert strict(section, d.InstanceMeta) == meta  # every key declared, every value its type


def test_the_score_block_matches_eval_report() -> None:
    rng = random.Random(2)
    samples = {
        "t": {
            "old": [rng.uniform(0.99, 1.01) for _ in range(10)],
            "agent": [rng.uniform(0.49, 0.51) for _ in range(10)],
            "expert": [rng.uniform(0.49, 0.51) for _ in range(10)],
        }
    }
    block = score(samples, alpha=0.05, min_improvement=0.05, opt_fraction=0.95, resamples=200, seed=1)
    report = {
        "verdict": "opt",
        "reason": "",
        "applied": True,
        "tests_pass": True,
        "samples": samples,
        **msgspec.to_builtins(block),
    }
    assert set(report) <= set(d.EvalReport.__struct_fields__)
    assert d.to_struct(json.loads(json.dumps(report)), d.EvalReport).per_test is not None
    assert strict(report, d.EvalReport).per_test is not None


def test_imported_records_fit_instance_meta() -> None:
    from cppperf.dataset.records import to_record
    from tests.conftest import SHARED_DATA

    files = sorted((SHARED_DATA / "cppperf-db" / "entries").glob("*.json"))[:5]
    if not files:
        pytest.skip("no published CppPerf-DB entries on this machine")
    for f in files:
        section = to_record(json.loads(f.read_text()), f.name)["cppperf"]
        assert set(section) <= set(d.InstanceMeta.__struct_fields__), f.name
        d.to_struct(json.loads(json.dumps(section)), d.InstanceMeta)
        strict(section, d.InstanceMeta)
