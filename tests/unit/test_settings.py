"""Settings: the paper's defaults, TOML then env overrides, one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cppperf.shared.errors import ConfigError
from cppperf.shared.settings import load_settings


def test_paper_defaults() -> None:
    s = load_settings(env={})
    assert (s.mining.since, s.mining.until) == ("2020-01-01", "2025-12-31")
    assert s.mining.min_stars == 300
    assert s.mining.max_files == 20
    assert s.classifier.models == ["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-8B"]
    assert (s.builder.runs, s.builder.warmup) == (31, 1)
    assert s.builder.min_improvement == 0.05
    assert s.builder.alpha == 0.05
    assert s.nats_url == ""


def test_toml_then_env(tmp_path: Path) -> None:
    cfg = tmp_path / "cppperf.toml"
    cfg.write_text('nats_url = "nats://a:1"\n[builder]\nruns = 7\n[mining]\nmax_files = 5\n')
    s = load_settings(cfg, env={"CPPPERF_BUILDER_RUNS": "9", "CPPPERF_GITHUB_TOKENS": "t1, t2"})
    assert s.builder.runs == 9  # env wins over TOML
    assert s.mining.max_files == 5
    assert s.nats_url == "nats://a:1"
    assert s.github.tokens == ["t1", "t2"]


def test_invalid_value_names_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env={"CPPPERF_BUILDER_RUNS": "many"})
    assert "builder.runs" in str(err.value)
    assert "CPPPERF_BUILDER_RUNS" in str(err.value)
    assert "\n" not in str(err.value)


def test_submodule_cache_follows_the_mirror_dir(tmp_path: Path) -> None:
    from cppperf.shared.engine.backends import submodule_sources

    s = load_settings(env={}, mining={"mirror_dir": str(tmp_path / "m")})
    assert submodule_sources(s.builder).cache_dir == tmp_path / "m"
    s = load_settings(env={}, mining={"mirror_dir": str(tmp_path / "m")}, builder={"submodule_cache": "/c"})
    assert submodule_sources(s.builder).cache_dir == Path("/c")  # an explicit cache wins
    s = load_settings(env={"CPPPERF_MINING_MIRROR_DIR": str(tmp_path / "e")})
    assert submodule_sources(s.builder).cache_dir == tmp_path / "e"


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("bus.ack_wait", "nan", "must be a finite number"),
        ("builder.min_improvement", "nan", "must be a finite number"),
        ("builder.test_timeout", "inf", "must be a finite number"),
        ("evaluator.agent_api_rate", "-inf", "must be a finite number"),
        ("bus.nak_delay", "-1", "must be >= 0"),
        ("builder.lease_timeout", "-0.5", "must be >= 0"),
        ("evaluator.max_patch_bytes", "0", "must be >= 1"),  # the checks of one key still apply
        ("builder.jobs", str(2**64), "must be at most 9223372036854775807"),
        ("bus.stream_max_bytes", str(-(2**70)), "must be at most"),
    ],
)
def test_numbers_are_finite_in_range_and_fit_an_int64(key: str, value: str, why: str) -> None:
    """TOML and the environment both accept `nan` and `inf`; before, a NaN `min_improvement`
    silently decided no commit improved, and a negative timeout or a 2**64 size reached the tools."""
    var = "CPPPERF_" + key.upper().replace(".", "_")
    with pytest.raises(ConfigError) as err:
        load_settings(env={var: value})
    assert str(err.value).startswith(f"invalid setting {key} ({var}): ") and why in str(err.value)


def test_nan_in_a_toml_file_is_refused_too(tmp_path: Path) -> None:
    cfg = tmp_path / "cppperf.toml"
    cfg.write_text("[builder]\nbuild_timeout = nan\n")
    with pytest.raises(ConfigError, match=r"builder\.build_timeout .*finite"):
        load_settings(cfg, env={})


def test_scores_seeds_and_queue_places_may_be_negative() -> None:
    s = load_settings(
        env={
            "CPPPERF_CLASSIFIER_HEURISTIC_THRESHOLD": "-1.5",
            "CPPPERF_BUILDER_SEED": "-7",
            "CPPPERF_EVALUATOR_LEASE_PRIORITY": "-1",
        }
    )
    assert (s.classifier.heuristic_threshold, s.builder.seed, s.evaluator.lease_priority) == (-1.5, -7, -1)
