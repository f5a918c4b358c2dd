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
from cppperf.shared.engine.stats import compare_all, compare_batch, decide, verdict
from cppperf.shared.published import PublishedEntry
from cppperf.shared.settings import load_settings
from tests.conftest import SHARED_DATA, as_file, strict


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
    record = json.loads(CliRunner().invoke(app, ["schema", "instance-record"]).stdout)
    assert set(record["$defs"]["InstanceRecord"]["properties"]) == {  # every section, ours last
        *PUBLISHED_SECTIONS,
        "cppperf",
    }
    assert {"TestResult", "PerformanceAnalysis", "InstanceMeta", "StatsRecord"} <= set(record["$defs"])
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
    record = as_file(build_record(commit, res, diff="", settings=settings))
    assert strict(record, d.InstanceRecord).cppperf.verdict is d.Verdict.IMPROVED  # every section
    section = record["cppperf"]
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
        section = as_file(to_record(json.loads(f.read_text()), f.name))["cppperf"]
        assert set(section) <= set(d.InstanceMeta.__struct_fields__), f.name
        d.to_struct(json.loads(json.dumps(section)), d.InstanceMeta)
        strict(section, d.InstanceMeta)


PUBLISHED_SECTIONS = (
    "metadata",
    "commit_info",
    "issues",
    "pull_requests",
    "build_info",
    "performance_analysis",
    "tests",
    "logs",
    "raw_timing_data",
)
ENTRIES = SHARED_DATA / "cppperf-db" / "entries"


@pytest.mark.skipif(
    not ENTRIES.is_dir(), reason=f"the published CppPerf-DB entries are not at {ENTRIES} (../shared/data)"
)
def test_every_published_entry_decodes_and_round_trips() -> None:
    """All 347 published files decode strictly as `PublishedEntry` (every key declared, every value
    its type) and encode back to the same JSON content; as an imported record they decode as an
    `InstanceRecord` from the file `dataset import` writes."""
    from cppperf.dataset.records import to_published, to_record

    files = sorted(ENTRIES.glob("*.json"))
    assert len(files) == 347
    nan_effect_sizes = 0
    for f in files:
        original = json.loads(f.read_text())
        entry = msgspec.convert(original, PublishedEntry, strict=True)
        assert json.loads(json.dumps(msgspec.to_builtins(entry))) == original, f.name
        nan_effect_sizes += sum(t.effect_size_cohens_d == "NaN" for t in entry.tests.tests)
    assert nan_effect_sizes == 998  # the variant a float field takes in the published files: a string
    record = to_record(json.loads(files[0].read_text()), files[0].name)
    again = d.decode_record(d.record_text(record))
    assert again == record and d.to_json_dict(to_published(again)) == json.loads(files[0].read_text())


def test_records_refuse_an_undeclared_key_in_any_section() -> None:
    record = as_file(_record())
    d.decode_record(json.dumps(record))
    for section in ("performance_analysis", "logs", "cppperf"):
        bad = {**record, section: {**record[section], "surprise": 1}}
        with pytest.raises(msgspec.ValidationError, match="surprise"):
            d.decode_record(json.dumps(bad))
    bad_test = json.loads(json.dumps(record))
    bad_test["tests"]["tests"][0]["p_value"] = "small"
    with pytest.raises(msgspec.ValidationError, match="p_value"):
        d.decode_record(json.dumps(bad_test))


def test_an_unknown_ci_is_written_as_infinity_as_before() -> None:
    record = _record()
    assert record.cppperf.tests and any(t.ci_high == float("inf") for t in record.cppperf.tests)
    text = d.record_text(record)
    assert '"ci_high": Infinity' in text and '"ci_high": null' not in text
    assert d.decode_record(text) == record


def _record() -> d.InstanceRecord:
    """A built record of a synthetic result whose tests carry unknown CIs (no bootstrap)."""
    settings = load_settings(env={}).builder
    rng = random.Random(1)
    samples = {
        n: ([rng.uniform(9, 11) for _ in range(9)], [rng.uniform(4, 6) for _ in range(9)]) for n in "ab"
    }
    tests = decide(compare_batch(samples), alpha=0.05, min_improvement=0.05)
    res = InstanceResult(instance_id="o__r-aaaaaaaaaaaa", verdict=verdict(tests), tests=tests)
    commit = m.CommitSelected(
        repo="o/r", url="u", sha="a" * 40, parent="b" * 40, date="2024-01-01", message="x"
    )
    return build_record(commit, res, diff="", settings=settings)


def test_a_counted_tests_medians_are_instruction_counts_not_milliseconds() -> None:
    """Graded on Cachegrind counts, a test's medians are counts (`median_instructions`); a timed
    test's are milliseconds (`median_ms`); never a count filed as milliseconds."""
    samples = {
        "counted": {"old": [1_000_000.0] * 3, "agent": [800_000.0] * 3, "expert": [790_000.0] * 3},
        "timed": {"old": [0.010] * 5, "agent": [0.008] * 5, "expert": [0.008] * 5},
    }
    block = score(
        samples, alpha=0.05, min_improvement=0.05, opt_fraction=0.95, resamples=200, seed=1, exact={"counted"}
    )
    counted, timed = block.per_test["counted"], block.per_test["timed"]
    assert counted.median_instructions == {"old": 1_000_000, "agent": 800_000, "expert": 790_000}
    assert counted.median_ms is msgspec.UNSET
    assert timed.median_ms == pytest.approx({"old": 10.0, "agent": 8.0, "expert": 8.0})
    assert timed.median_instructions is msgspec.UNSET
    wire = json.loads(msgspec.json.encode(block))
    assert (
        "median_ms" not in wire["per_test"]["counted"]
        and "median_instructions" not in wire["per_test"]["timed"]
    )
