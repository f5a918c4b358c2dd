"""Secrets never printed: nested values, tracebacks, URLs (host:port only), the CLI's errors; and
the expert's tree's output never in an agent's report (it can quote the expert's change)."""

from __future__ import annotations

import io
import json

from typer.testing import CliRunner

from cppperf.cli import app
from cppperf.shared.logging import configure_logging, get_logger, register_url, safe_url

PASSWORD = "s3cr3t-pass-word"
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2"


def _logged(**fields: object) -> str:
    buf = io.StringIO()
    configure_logging("debug", json=True, file=buf)
    log = get_logger("t")
    try:
        raise RuntimeError(f"connect to nats://cppperf:{PASSWORD}@nats-1:4222 failed, token {TOKEN}")
    except RuntimeError:
        log.exception("boom", **fields)
    configure_logging("info")
    return buf.getvalue()


def test_nested_values_and_tracebacks_are_scrubbed() -> None:
    register_url(f"nats://cppperf:{PASSWORD}@nats-1:4222")
    out = _logged(
        config={"bus": {"password": "x" * 8, "servers": [f"nats://u:{PASSWORD}@h:1"]}},
        items=({"auth": TOKEN},),
        note=f"plain {PASSWORD}",
    )
    assert PASSWORD not in out and TOKEN not in out
    event = json.loads(out.splitlines()[-1])
    assert "RuntimeError" in event["exception"]  # the traceback is kept, only its secrets go
    assert event["config"]["bus"]["password"] == "***"
    assert "h:1" in event["config"]["bus"]["servers"][0]


def test_safe_url_keeps_hosts_and_ports_only() -> None:
    url = f"nats://cppperf:{PASSWORD}@nats-1:4222,nats://cppperf:{PASSWORD}@nats-2"
    assert safe_url(url) == "nats-1:4222,nats-2:4222"


def test_status_against_an_unreachable_bus_does_not_print_the_password() -> None:
    res = CliRunner().invoke(app, ["status", "--nats-url", f"nats://cppperf:{PASSWORD}@127.0.0.1:1"])
    assert res.exit_code != 0
    assert "127.0.0.1:1" in res.output
    assert PASSWORD not in res.output


def test_a_malformed_url_is_refused_without_its_password() -> None:
    res = CliRunner().invoke(app, ["status", "--nats-url", f"http://cppperf:{PASSWORD}@host:4222"])
    assert res.exit_code != 0
    assert PASSWORD not in res.output


def test_an_agent_never_reads_the_expert_trees_benchmark_output() -> None:
    """`agent_view` (every report an agent is sent or reads, old stored ones too) leaves out
    the expert side's output of a benchmark that could not be timed; the operator's keeps it."""
    from cppperf.services.evaluator.handlers import agent_view, wire_report
    from cppperf.shared.domain import BenchmarkSkip, EvalReport, EvalVerdict, SkippedBenchmark

    def skip(side: str) -> SkippedBenchmark:
        return SkippedBenchmark(
            name="bench:x", reason=BenchmarkSkip.CRASHED, detail=f"exit 1: {side}_fast_path", side=side
        )

    report = EvalReport(
        verdict=EvalVerdict.CORRECT, benchmarks_skipped=[skip(s) for s in ("expert", "agent", "old", "")]
    )
    shown = agent_view(report).benchmarks_skipped
    assert isinstance(shown, list) and len(shown) == 4
    assert "expert_fast_path" not in json.dumps(wire_report(report, for_agent=True))
    assert "not shown to agents" in shown[0].detail and shown[0].reason == BenchmarkSkip.CRASHED
    assert shown[1:] == report.benchmarks_skipped[1:]  # type: ignore[index]
    assert "expert_fast_path" in json.dumps(wire_report(report))  # the operator's


def test_an_agent_never_reads_where_valgrind_stopped_in_the_experts_tree() -> None:
    """`cpu_fallback_expert` (function, file and line in the expert's tree) is the operator's:
    every agent's view drops it, the reason it came with stays."""
    from cppperf.services.evaluator.handlers import agent_view, wire_report
    from cppperf.shared.domain import EvalReport, EvalVerdict

    where = "unhandled instruction bytes: 0x62 at 0x1234: expert_fast_path (fast.cpp:12)"
    report = EvalReport(
        verdict=EvalVerdict.OPT,
        cpu_fallback="Valgrind cannot run t on the expert side (an instruction it lacks): timed on cpu instead",
        cpu_fallback_expert=where,
    )
    assert "expert_fast_path" not in json.dumps(wire_report(report, for_agent=True))
    assert agent_view(report).cpu_fallback == report.cpu_fallback
    assert wire_report(report)["cpu_fallback_expert"] == where  # the operator's
