"""`serve builder|evaluator` on the local backend refuses to start without the jail unless the
operator opted out for trusted code."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cppperf.cli import app
from cppperf.shared.engine import sandbox


@pytest.mark.parametrize("service", ["builder", "evaluator"])
def test_serve_refuses_without_the_jail(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "jail_problem", lambda: "bubblewrap (bwrap) is not installed")
    monkeypatch.setenv("CPPPERF_BUILDER_BACKEND", "local")
    res = CliRunner().invoke(app, ["serve", service, "--nats-url", "nats://127.0.0.1:1"])
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "refuses to run untrusted code without the jail" in lines[0], res.output
    assert "Traceback" not in res.output


def test_the_opt_out_lets_a_trusted_builder_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from cppperf.cli.pipeline import _cannot_jail
    from cppperf.shared.settings import load_settings

    monkeypatch.setattr(sandbox, "jail_problem", lambda: "bubblewrap (bwrap) is not installed")
    assert _cannot_jail("builder", load_settings(env={"CPPPERF_BUILDER_SANDBOX": "false"})) == ""
    assert _cannot_jail("evaluator", load_settings(env={"CPPPERF_EVALUATOR_TRUST_PATCHES": "true"})) == ""
    assert _cannot_jail("filter", load_settings(env={})) == ""
    assert "CPPPERF_EVALUATOR_TRUST_PATCHES" in _cannot_jail("evaluator", load_settings(env={}))
