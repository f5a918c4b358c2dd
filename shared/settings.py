"""One typed settings object: paper defaults, overridden by `cppperf.toml`, then `CPPPERF_*` env.

Env names are `CPPPERF_<SECTION>_<KEY>` (e.g. `CPPPERF_BUILDER_RUNS=11`), top-level keys are
`CPPPERF_<KEY>` (e.g. `CPPPERF_NATS_URL`). List values in env are comma separated
(`CPPPERF_GITHUB_TOKENS=t1,t2`). TOML uses one table per section (`[builder] runs = 11`).
An invalid value raises `ConfigError` with a one-line message naming the key.
"""

from __future__ import annotations

import datetime
import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from cppperf.shared.domain import DecisionRule
from cppperf.shared.errors import ConfigError
from cppperf.shared.logging import scrub_text

CPP_SOURCE_EXTENSIONS = [
    ".cpp",
    ".cc",
    ".cxx",
    ".c++",
    ".cp",
    ".C",
    ".c",
    ".h",
    ".hh",
    ".hpp",
    ".hxx",
    ".h++",
    ".ipp",
    ".inl",
    ".tpp",
    ".tcc",
    ".ixx",
    ".cppm",
]


def _xdg_data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def default_mirror_dir() -> Path:
    """Where repository (and submodule) mirrors live unless `mining.mirror_dir` says otherwise."""
    return _xdg_data_home() / "cppperf" / "mirrors"


class BusSettings(msgspec.Struct, kw_only=True):
    data_dir: str = ""  # embedded NATS store; default <out_dir>/.state/nats
    ack_wait: float = 60.0  # seconds before an un-acked, silent message is redelivered
    max_deliver: int = 5  # deliveries before a message is dead-lettered
    max_ack_pending: int = 256
    nak_delay: float = 5.0  # seconds before the first retry of a failure; doubles per attempt
    nak_delay_max: float = 300.0  # cap of the exponential retry delay
    duplicate_window: float = 24 * 3600.0  # Nats-Msg-Id dedup horizon
    heartbeat_interval: float = 0.0  # 0 = ack_wait / 3
    replicas: int = 1  # stream/KV replicas (3 on the compose cluster)
    reconnect_wait: float = 2.0  # seconds between reconnect attempts (services retry forever)
    health_interval: float = 5.0  # seconds between liveness probes (heartbeat file refresh)
    stop_grace: float = 20.0  # on SIGTERM/SIGINT: seconds in-flight work may finish before nak
    claim_lease: float = 60.0  # seconds a dead holder keeps a job's claim (renewed every third)
    dlq_inline_limit: int = 64 * 1024  # larger dead-lettered payloads go to the object store
    creds: str = ""  # NKey credentials file (`cppperf agents add|service-keys`); empty: no auth
    nkey_seed: str = ""  # or the seed itself (k8s: from a Secret) when there is no creds file
    stream_max_bytes: int = 256 * 1024 * 1024  # per stream; a full work queue refuses publishes
    stream_max_msgs: int = 1_000_000  # per stream
    output_max_age: float = 30 * 24 * 3600.0  # patch.built / eval.completed announcements kept
    kv_max_bytes: int = 256 * 1024 * 1024  # per KV bucket; a full bucket refuses writes
    blob_max_bytes: int = 4 * 1024 * 1024 * 1024  # the `blobs` object store
    # who creates/updates streams, buckets and the object store: "self" (each process on connect:
    # the embedded/open bus), "admin" (`cppperf bus provision`; services only check and stop with
    # one line when something is missing), "auto" (admin when `creds`/`nkey_seed` is set)
    provision: Literal["auto", "self", "admin"] = "auto"

    def effective_heartbeat(self) -> float:
        return self.heartbeat_interval or max(self.ack_wait / 3.0, 0.05)

    @property
    def self_provisioning(self) -> bool:
        """True when this process creates and updates streams and buckets itself."""
        if self.provision == "auto":
            return not (self.creds or self.nkey_seed)
        return self.provision == "self"


class GitHubSettings(msgspec.Struct, kw_only=True):
    tokens: list[str] = msgspec.field(default_factory=list)
    api_url: str = "https://api.github.com"
    search_page_size: int = 100
    max_wait: float = 3600.0  # longest rate-limit sleep we accept before failing transiently
    fetch_links: bool = False  # fetch linked issue/PR texts (needs network; on with tokens)


class MiningSettings(msgspec.Struct, kw_only=True):
    since: str = "2020-01-01"
    until: str = "2025-12-31"
    min_stars: int = 300
    max_files: int = 20
    source_extensions: list[str] = msgspec.field(default_factory=lambda: list(CPP_SOURCE_EXTENSIONS))
    test_dir_names: list[str] = msgspec.field(
        default_factory=lambda: ["test", "tests", "unittest", "unittests", "testing", "testdata"]
    )
    test_file_globs: list[str] = msgspec.field(
        default_factory=lambda: [
            "*_test.*",
            "*_tests.*",
            "test_*.*",
            "*Test.*",
            "*Tests.*",
            "*_unittest.*",
            "*_spec.*",
        ]
    )
    vendor_dir_names: list[str] = msgspec.field(
        default_factory=lambda: ["third_party", "thirdparty", "3rdparty", "vendor", "external", "extern"]
    )
    validate_latest: bool = True  # builder validates repo.candidate -> repo.found
    repos: list[str] = msgspec.field(default_factory=list)  # sources for `serve crawler`
    search: bool = False  # `serve crawler` also enumerates GitHub search results
    mirror_dir: str = ""  # default $XDG_DATA_HOME/cppperf/mirrors
    publish_window: int = 64  # selected commits the filter ships concurrently (1 = one at a time)


class ClassifierSettings(msgspec.Struct, kw_only=True):
    backend: Literal["heuristic", "model", "openai", "vllm"] = "heuristic"
    models: list[str] = msgspec.field(default_factory=lambda: ["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-8B"])
    base_urls: list[str] = msgspec.field(default_factory=lambda: ["http://127.0.0.1:8000/v1"])
    api_key: str = "EMPTY"
    phase2_model: int = 1  # index into models
    prefilter: bool = True
    max_concurrency: int = 32
    timeout: float = 120.0
    retries: int = 4
    seed: int = 0
    diff_token_budget: int = 6000
    batch_size: int = 16
    heuristic_threshold: float = 2.0
    # the cascade (openai/vllm): the trained scorer answers clear negatives without an LLM call
    cascade: bool = True
    cascade_threshold: float | None = None  # None: the model's own, chosen to keep 95 % of positives
    model_path: str = ""  # the trained scorer's JSON (`cppperf classify train`); "": the shipped one


class BuilderSettings(msgspec.Struct, kw_only=True):
    backend: Literal["local", "docker"] = "local"
    runs: int = 31
    warmup: int = 1
    min_improvement: float = 0.05
    alpha: float = 0.05
    build_type: str = "Release"
    work_dir: str = ""  # default OUT/.state/work (env CPPPERF_BUILDER_WORK_DIR)
    keep: bool = False
    early_stop: bool = True
    early_stop_min_rounds: int = 10
    confirm: bool = True
    decision_rule: Literal["ours", "strict", "paper"] = "ours"
    split_cases: bool = False  # time each gtest/Catch2/doctest case of a CTest test on its own  # strict: the whole CI beyond the threshold
    seed: int = 1234
    jobs: int = 0  # 0 = all cores
    # Share compiled objects between the old and new trees (CCACHE_BASEDIR). Off by default: it
    # makes __FILE__ relative, which silently breaks tests that locate data through __FILE__.
    ccache_basedir: bool = False
    # Build and run every tree at one path (<work>/<instance>/current) in a private mount
    # namespace: identical absolute paths, so ccache shares objects across trees without BASEDIR
    # and __FILE__ stays absolute. Used when the machine allows it (root or user namespaces).
    same_path: bool = True
    configure_timeout: float = 600.0
    build_timeout: float = 3600.0
    test_timeout: float = 600.0
    thread_env: dict[str, str] = msgspec.field(default_factory=lambda: {"OMP_NUM_THREADS": "1"})
    pin_cpu: bool = True
    output_limit: int = 64 * 1024  # bytes of test output kept per run
    sandbox: bool = True
    memory_limit_mb: int = 4096
    max_processes: int = 512  # per test run (pids cgroup, else RLIMIT_NPROC)
    bootstrap_resamples: int = 2000
    docker_host: str = ""  # empty: DOCKER_HOST or the engine's default socket
    base_release: str = ""  # empty: the Debian release of the commit's era (images.ERAS)
    registry: str = ""  # push instance images here when set (e.g. registry.local:5000)
    cpuset: str = ""  # cores for the container; empty: the build and timing cores
    commit_images: bool = True
    # after an instance is proven `improved`: gold-validate it (`cppperf validate`) and record its
    # `oracle`; off by default (two evaluations per proven instance)
    validate_gold: bool = False
    llm_deps: bool = False  # ask the classifier's OpenAI-compatible server for missing packages
    llm_deps_attempts: int = 2
    # Submodules of exported trees: the clone's own first, then these local mirrors (URL -> git
    # directory; env `url=path,url2=path2`), then the shared mirror cache, fetched when allowed.
    submodule_mirrors: dict[str, str] = msgspec.field(default_factory=dict)
    submodule_fetch: bool = True
    submodule_cache: str = ""  # empty: mining.mirror_dir (its default $XDG_DATA_HOME/cppperf/mirrors)
    # When a test fails on both sides under build_type, build and run once more in this build
    # type (the paper built in Debug) before rejecting; empty: no second attempt.
    fallback_build_type: str = "Debug"
    # a compile that fails only on warnings made errors (-Werror meeting a newer compiler's
    # warnings) is retried once with -Wno-error after every flag (recorded as a profile change)
    werror_fallback: bool = True
    # --- measurement (issue 13) -------------------------------------------------------------
    # `default`: Release build, our rule; `paper`: the paper's way (Debug build, the paper's rule)
    profile: Literal["default", "paper"] = "default"
    # what decides: user+sys CPU of the test's process tree (robust to a busy neighbour), wall
    # time, or user-space instructions (hardware counter). Every metric is recorded either way.
    # `cachegrind`: instructions counted by Valgrind (no PMU needed; exact, so no timing core)
    metric: Literal["cpu", "wall", "instructions", "cachegrind"] = "cpu"
    # a test whose CPU time exceeds its wall time by this factor is multi-threaded: decided on wall
    multithread_ratio: float = 1.2
    # a sample shorter than this (seconds) is the mean of repeated runs that together pass it
    sample_floor: float = 0.05
    max_repeats: int = 200
    # host-wide core leases: every cppperf process on the host (all replicas) takes an exclusive
    # flock on one timing core before it times; builds run on the build cores only.
    lease_dir: str = ""  # default /tmp/cppperf-leases (shared by every process on the host)
    timing_cores: list[int] = msgspec.field(default_factory=list)  # empty: the upper half
    build_cores: list[int] = msgspec.field(default_factory=list)  # empty: the other cores
    lease_timeout: float = 6 * 3600.0  # seconds to wait for a free timing core
    # leases are granted in the order of a ticket queue on the lease dir (lower priority first,
    # then arrival). `round`: a proof leases per interleaved round, so a waiter is behind at most
    # one round; `whole`: one lease for the whole measurement; `poll`: the old way (every waiter
    # tries every 0.25 s, whole measurement), kept to compare (bench/lease_fairness.py)
    lease_policy: Literal["round", "whole", "poll"] = "round"
    lease_priority: int = 1  # the builder's place in the queue; evaluator.lease_priority is 0
    # --- the exact metric (builder.metric=cachegrind) ---------------------------------------
    exact_runs: int = 3  # rounds under Valgrind (an exact count needs few; no warm-up)
    exact_tolerance: float = 0.001  # counts of one side within this relative spread are exact
    valgrind_slowdown: float = 50.0  # a test's timeout is multiplied by this under Valgrind
    # also simulate the caches (`--cache-sim=yes`, about 2x slower) and record per run an estimated
    # cycle figure beside the count: Ir + 10·L1 misses + 100·LL misses; the decision stays on Ir
    cachegrind_cache_sim: bool = False
    # --- which tests run the change (issue 27) -------------------------------------------------
    # build the new side once more with --coverage, run each test once, decide on the tests that
    # execute a changed line (the others are A/A controls). Off by default: a second full build
    # of the new side (no ccache hits: other flags) and one more run of every test per proof.
    coverage: bool = False
    # --- the project's own benchmarks as workloads (shared/engine/benchmarks.py) ---------------
    # Google Benchmark executables the CMake tree builds (its benchmark options turned on), timed
    # beside the tests by their own JSON output: per benchmark `benchmark_repetitions` repetitions
    # of at least `benchmark_min_time` seconds each per sample; a run is cut at `benchmark_timeout`
    benchmarks: bool = True
    benchmark_repetitions: int = 5
    benchmark_min_time: float = 0.05
    benchmark_timeout: float = 120.0
    max_benchmarks: int = (
        50  # per instance (spread over the benchmark functions); the others are recorded as skipped
    )

    def effective_build_type(self) -> str:
        return "Debug" if self.profile == "paper" else self.build_type

    def effective_rule(self) -> DecisionRule:
        return DecisionRule.PAPER if self.profile == "paper" else DecisionRule(self.decision_rule)


class EvaluatorSettings(msgspec.Struct, kw_only=True):
    max_patch_bytes: int = 1024 * 1024
    runs: int = 11  # interleaved rounds of original, agent and expert (first discarded)
    test_timeout: float = 300.0
    trust_patches: bool = False  # run agents' code without the bubblewrap jail (unsafe; README)
    allow_build_changes: bool = False  # trusted mode: patches may change build files and scripts
    runs_dir: str = ""  # default OUT/runs
    worker_name: str = ""  # recorded with each evaluation (defaults to host:pid in the service)
    opt_fraction: float = 0.95
    agent_max_pending: int = 16  # an agent's requests queued or running; the next is refused
    agent_max_patch_bytes: int = 512 * 1024  # an agent's inline patch (checked before any write)
    # evaluations the evaluator keeps for one agent (its keys of `evaluations`, its folders under
    # runs/) plus those queued; a submit that would add another is refused (0: no limit). Asking
    # again for an id it has (same run, model and instance) is always accepted: it replaces one.
    agent_max_evaluations: int = 10_000
    agent_api_rate: float = (
        20.0  # an agent's API requests a second (bursts of 2x; 0: no limit); more are refused
    )
    lease_priority: int = 0  # evaluations go before proofs in the timing-core queue
    keep_failed: bool = False  # debugging: keep work_dir/eval/<hash> of an evaluation that failed
    # the metric the three trees are compared on: "" = the one the instance was proven on when it is
    # the exact one (`cachegrind`: counts, no timing-core lease), else `builder.metric`; a value
    # here decides for every instance
    metric: Literal["", "cpu", "wall", "instructions", "cachegrind"] = ""
    # an `opt` decided on exact counts is confirmed by native CPU time: original and agent, this
    # many rounds (the first a warm-up) on the timing core; not faster natively = not opt
    confirm_runs: int = 8
    # short tests get more confirmation rounds: as many as the warm-up says fit in this many
    # seconds (0: always confirm_runs), at most confirm_max_runs
    confirm_seconds: float = 60.0
    confirm_max_runs: int = 31


class Settings(msgspec.Struct, kw_only=True):
    nats_url: str = ""  # empty -> embedded nats-server
    out_dir: str = "cppperf-out"
    log_level: str = "info"
    health_dir: str = ""  # services' heartbeat files (`cppperf health`); default /tmp/cppperf-health
    bus: BusSettings = msgspec.field(default_factory=BusSettings)
    github: GitHubSettings = msgspec.field(default_factory=GitHubSettings)
    mining: MiningSettings = msgspec.field(default_factory=MiningSettings)
    classifier: ClassifierSettings = msgspec.field(default_factory=ClassifierSettings)
    builder: BuilderSettings = msgspec.field(default_factory=BuilderSettings)
    evaluator: EvaluatorSettings = msgspec.field(default_factory=EvaluatorSettings)

    # Derived paths -------------------------------------------------------------------------
    def state_dir(self) -> Path:
        """The project's state, beside its outputs: two output folders never share a pipeline."""
        return Path(self.out_dir) / ".state"

    def nats_data_dir(self) -> Path:
        return Path(self.bus.data_dir) if self.bus.data_dir else self.state_dir() / "nats"

    def mirror_dir(self) -> Path:
        return (
            Path(self.mining.mirror_dir)
            if self.mining.mirror_dir
            else _xdg_data_home() / "cppperf" / "mirrors"
        )

    def health_path(self) -> Path:
        return Path(self.health_dir or "/tmp/cppperf-health")  # noqa: S108 - per-container state

    def work_dir(self) -> Path:
        """Build workspaces: OUT/.state/work unless `builder.work_dir` says otherwise (a shared
        one is safe: each process owns and locks its own folder in it, `shared/claims.py`)."""
        return (
            Path(self.builder.work_dir) if self.builder.work_dir else self.state_dir() / "work"
        ).absolute()

    def run_owner(self) -> str:
        """Who this run is, for the workspaces it owns: its state folder's absolute path."""
        return str(self.state_dir().absolute())

    def runs_path(self) -> Path:
        """Evaluation runs: OUT/runs unless `evaluator.runs_dir` says otherwise."""
        return Path(self.evaluator.runs_dir) if self.evaluator.runs_dir else Path(self.out_dir) / "runs"


_SECTION_TYPES: dict[str, type[msgspec.Struct]] = {
    "bus": BusSettings,
    "github": GitHubSettings,
    "mining": MiningSettings,
    "classifier": ClassifierSettings,
    "builder": BuilderSettings,
    "evaluator": EvaluatorSettings,
}
_SECTIONS = tuple(_SECTION_TYPES)


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """Collect `CPPPERF_*` variables into the nested shape Settings decodes from."""
    out: dict[str, Any] = {}
    top_fields = {f for f in Settings.__struct_fields__ if f not in _SECTIONS}
    for f in top_fields:
        val = env.get(f"CPPPERF_{f.upper()}")
        if val is not None:
            out[f] = val
    for section, cls in _SECTION_TYPES.items():
        defaults = cls()
        for f in cls.__struct_fields__:
            val = env.get(f"CPPPERF_{section.upper()}_{f.upper()}")
            if val is None:
                continue
            current = getattr(defaults, f)
            parsed: Any = val
            if isinstance(current, list):
                parsed = [v.strip() for v in val.split(",") if v.strip()]
            elif isinstance(current, dict):
                parsed = dict(kv.split("=", 1) for kv in val.split(",") if "=" in kv)
            out.setdefault(section, {})[f] = parsed
    return out


def env_names() -> set[str]:
    """Every `CPPPERF_*` variable the settings read (deployment files are checked against it)."""
    names = {f"CPPPERF_{f.upper()}" for f in Settings.__struct_fields__ if f not in _SECTIONS}
    for section, cls in _SECTION_TYPES.items():
        names |= {f"CPPPERF_{section.upper()}_{f.upper()}" for f in cls.__struct_fields__}
    return names | {"CPPPERF_CONFIG"}


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def _key_from_error(err: msgspec.ValidationError) -> str:
    text = str(err)
    if "at `$." in text:
        path = text.split("at `$.", 1)[1].split("`", 1)[0]
        parts = path.split(".")
        env = "CPPPERF_" + "_".join(p.upper().split("[")[0] for p in parts)
        return f"{path} ({env})"
    return "settings"


def load_settings(
    toml_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Load settings: defaults < TOML file < environment < explicit overrides (CLI flags)."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    explicit = toml_path or env.get("CPPPERF_CONFIG")
    path = Path(explicit) if explicit else Path("cppperf.toml")
    if explicit and not path.is_file():
        raise ConfigError(f"config file {path} not found")
    if path.is_file():
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        _check_known_keys(raw, path)
    raw = _merge(raw, _env_overrides(env))
    raw = _merge(raw, overrides)
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid setting {_key_from_error(exc)}: {exc}") from exc
    if not settings.builder.submodule_cache and settings.mining.mirror_dir:
        # submodule (and FetchContent) mirrors live beside the repository mirrors they belong with
        settings.builder = msgspec.structs.replace(
            settings.builder, submodule_cache=settings.mining.mirror_dir
        )
    validate(settings)
    return settings


# Validation beyond types: ranges, dates, URLs -------------------------------------------------
def _env_name(key: str) -> str:
    return "CPPPERF_" + key.upper().replace(".", "_")


def _bad(key: str, why: str) -> ConfigError:
    return ConfigError(f"invalid setting {key} ({_env_name(key)}): {why}")


def _check_known_keys(raw: Mapping[str, Any], path: Path) -> None:
    """A misspelt TOML key or section is an error, not silently ignored."""
    top = set(Settings.__struct_fields__)
    for key, value in raw.items():
        if key not in top:
            raise ConfigError(f"{path}: unknown setting {key!r} (known: {', '.join(sorted(top))})")
        if key in _SECTION_TYPES:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path}: [{key}] must be a table")
            known = set(_SECTION_TYPES[key].__struct_fields__)
            for sub in value:
                if sub not in known:
                    raise ConfigError(f"{path}: unknown setting {key}.{sub} in [{key}]")


def parse_date(value: str) -> datetime.date:
    """`YYYY-MM-DD` (what `--since`/`--until` and the mining settings take) or ValueError."""
    text = value.strip()
    if len(text) != 10:
        raise ValueError(f"{value!r} is not a date (YYYY-MM-DD)")
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a date (YYYY-MM-DD)") from None


def check_nats_url(url: str) -> None:
    """Each server of `nats://host:port[,nats://host:port…]` must parse; ValueError otherwise."""
    for server in [u.strip() for u in url.split(",") if u.strip()] or [url]:
        parts = urlsplit(server)
        if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
            raise ValueError(f"{scrub_text(server)!r} is not a NATS URL (nats://host:port)")
        try:
            _ = parts.port
        except ValueError:
            raise ValueError(f"{scrub_text(server)!r} has an invalid port") from None


MIN_MEASURED_ROUNDS = 3  # fewer timed rounds per side leave the statistics nothing to test


def validate(s: Settings) -> None:
    """Ranges, dates and URLs that msgspec's types cannot express; one-line ConfigError naming the key."""
    for key, value in (("mining.since", s.mining.since), ("mining.until", s.mining.until)):
        try:
            parse_date(value)
        except ValueError as exc:
            raise _bad(key, str(exc)) from None
    if s.mining.since > s.mining.until:
        raise _bad("mining.since", f"{s.mining.since} is after mining.until {s.mining.until}")
    if s.nats_url:
        try:
            check_nats_url(s.nats_url)
        except ValueError as exc:
            raise _bad("nats_url", str(exc)) from None
    if Path(s.out_dir).exists() and not Path(s.out_dir).is_dir():
        raise _bad("out_dir", f"{s.out_dir} is a file: --out names a folder (created when missing)")
    if s.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise _bad("log_level", f"{s.log_level!r} is not one of debug, info, warning, error, critical")
    _validate_ranges(s)


# numbers that may be below zero (scores, seeds, queue places); every other number is a count, a
# size, a duration or a rate: >= 0
_SIGNED: frozenset[str] = frozenset(
    {
        "classifier.heuristic_threshold",
        "classifier.cascade_threshold",
        "classifier.seed",
        "classifier.phase2_model",
        "builder.seed",
        "builder.lease_priority",
        "evaluator.lease_priority",
    }
)
_INT64_MAX = 2**63 - 1  # what NATS, the kernel and the C++ tools take


def _validate_numbers(s: Settings) -> None:
    """Every number of every section: finite (TOML and the environment accept `nan` and `inf`), no
    larger than an int64, and >= 0 unless it is one of `_SIGNED`."""
    for section in _SECTIONS:
        values = getattr(s, section)
        for name in type(values).__struct_fields__:
            value = getattr(values, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            key = f"{section}.{name}"
            if isinstance(value, float) and not math.isfinite(value):
                raise _bad(key, f"{value}; must be a finite number")
            if abs(value) > _INT64_MAX:
                raise _bad(key, f"{value}; must be at most {_INT64_MAX}")
            if value < 0 and key not in _SIGNED:
                raise _bad(key, f"{value}; must be >= 0")


def _validate_ranges(s: Settings) -> None:
    _validate_numbers(s)
    if s.builder.warmup < 0:
        raise _bad("builder.warmup", "must be >= 0")
    least = s.builder.warmup + MIN_MEASURED_ROUNDS
    if s.builder.runs < least:
        raise _bad(
            "builder.runs", f"{s.builder.runs} rounds; need >= {least} (warmup + {MIN_MEASURED_ROUNDS})"
        )
    if s.evaluator.runs < 1 + MIN_MEASURED_ROUNDS:
        raise _bad(
            "evaluator.runs",
            f"{s.evaluator.runs} rounds; need >= {1 + MIN_MEASURED_ROUNDS} (first discarded)",
        )
    for key, n in (
        ("mining.max_files", s.mining.max_files),
        ("mining.publish_window", s.mining.publish_window),
        ("bus.max_deliver", s.bus.max_deliver),
        ("evaluator.max_patch_bytes", s.evaluator.max_patch_bytes),
    ):
        if n < 1:
            raise _bad(key, f"{n}; must be >= 1")
    for key, x in (("mining.min_stars", s.mining.min_stars), ("builder.jobs", s.builder.jobs)):
        if x < 0:
            raise _bad(key, f"{x}; must be >= 0")
    for key, f in (("builder.alpha", s.builder.alpha), ("evaluator.opt_fraction", s.evaluator.opt_fraction)):
        if not 0.0 < f <= 1.0:
            raise _bad(key, f"{f}; must be in (0, 1]")
    if s.builder.min_improvement < 0:
        raise _bad("builder.min_improvement", "must be >= 0")
    _validate_exact(s.builder)
    if s.evaluator.confirm_runs < 6:
        raise _bad(
            "evaluator.confirm_runs",
            f"{s.evaluator.confirm_runs}; must be >= 6 (a warm-up and five rounds to decide on)",
        )
    if s.evaluator.confirm_max_runs < s.evaluator.confirm_runs:
        raise _bad(
            "evaluator.confirm_max_runs",
            f"{s.evaluator.confirm_max_runs}; must be >= evaluator.confirm_runs ({s.evaluator.confirm_runs})",
        )


def _validate_exact(b: BuilderSettings) -> None:
    if b.exact_runs < 2:
        raise _bad("builder.exact_runs", f"{b.exact_runs}; must be >= 2 (a re-run shows a count is exact)")
    if b.exact_tolerance < 0:
        raise _bad("builder.exact_tolerance", "must be >= 0")
    if b.valgrind_slowdown < 1:
        raise _bad("builder.valgrind_slowdown", f"{b.valgrind_slowdown}; must be >= 1")
    for key, n in (
        ("builder.benchmark_repetitions", b.benchmark_repetitions),
        ("builder.max_benchmarks", b.max_benchmarks),
    ):
        if n < 1:
            raise _bad(key, f"{n}; must be >= 1")
    for key, x in (
        ("builder.benchmark_min_time", b.benchmark_min_time),
        ("builder.benchmark_timeout", b.benchmark_timeout),
    ):
        if x <= 0:
            raise _bad(key, f"{x}; must be > 0")
