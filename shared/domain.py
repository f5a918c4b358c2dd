"""The typed domain after the bus: outcomes as `StrEnum`s, state and reports as msgspec Structs.

    Verdict          builder: improved | not-improved | regressed | unchanged-binaries | rejected
    DecisionRule     which test flags decide the verdict: ours | strict | paper (`flags(t)`)
    FailureCategory  why a build or run was rejected: configure | dependency | compile | ...
    EvalVerdict      evaluator: opt | correct | tests-failed | ... | untrusted-refused
    Stage            where an item is in the pipeline (the `stage` of a KV value)

    RepoState, CommitState, InstanceState, EvaluationState   the values of the KV buckets
                                                             `repos`, `commits`, `instances`,
                                                             `evaluations` (keyed by the stable ids)
    InstanceRecord   one instance record: the published CppPerf-DB sections (shared/published.py,
                     `PublishedEntry`) plus `cppperf`, built as this Struct by
                     services/builder/record.py and `cppperf dataset import`
    InstanceMeta     the instance record's `cppperf` section
    StatsRecord      one test's statistics and decisions (engine/stats.py; the record's `tests`)
    Coverage         its `coverage`: which tests run the change, the deciding family, controls
    EvalReport       the evaluator's `report.json` (also `EvalCompleted.report`, without samples),
                     built as this Struct by services/evaluator/pipeline.py

Every value is a `str` subclass or a Struct, so JSON on disk and on the wire is unchanged. KV
values only grow: new fields get defaults and unknown fields are ignored when decoding (msgspec
schema evolution). The record section and the report are what cppperf writes, field for field:
they forbid unknown fields, so the tests that decode real output fail on a key not declared here.
`schemas()` gives their JSON schemas (`cppperf schema`): `instance-record` (the whole record file),
`published-entry` (a CppPerf-DB file as `cppperf dataset import` reads it), `eval-report`, ….
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Final, Protocol, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from cppperf.shared.published import PublishedEntry


class Verdict(StrEnum):
    IMPROVED = "improved"
    NOT_IMPROVED = "not-improved"
    REGRESSED = "regressed"
    UNCHANGED_BINARIES = "unchanged-binaries"
    REJECTED = "rejected"


BUILT_VERDICTS: Final = frozenset(
    {Verdict.IMPROVED, Verdict.NOT_IMPROVED, Verdict.REGRESSED, Verdict.UNCHANGED_BINARIES}
)


class RuleFlags(Protocol):
    """One test's decided flags under every rule (`StatsRecord`)."""

    @property
    def improved(self) -> bool: ...
    @property
    def regressed(self) -> bool: ...
    @property
    def strict_improved(self) -> bool: ...
    @property
    def strict_regressed(self) -> bool: ...
    @property
    def paper_improved(self) -> bool: ...
    @property
    def paper_regressed(self) -> bool: ...


class DecisionRule(StrEnum):
    """Which flags decide a test (engine/stats.py): `ours` (BH-adjusted p, the median change and
    the CI below 1), `strict` (the whole CI beyond the threshold), `paper` (raw p, the mean change)."""

    OURS = "ours"
    STRICT = "strict"
    PAPER = "paper"

    def flags(self, t: RuleFlags) -> tuple[bool, bool]:
        """(improved, regressed) of one test under this rule: the one place a rule names fields."""
        if self is DecisionRule.STRICT:
            return t.strict_improved, t.strict_regressed
        if self is DecisionRule.PAPER:
            return t.paper_improved, t.paper_regressed
        return t.improved, t.regressed

    def improved(self, t: RuleFlags) -> bool:
        return self.flags(t)[0]

    def regressed(self, t: RuleFlags) -> bool:
        return self.flags(t)[1]


class FailureCategory(StrEnum):
    CONFIGURE = "configure"
    DEPENDENCY = "dependency"
    COMPILE = "compile"
    TEST_FAILURE = "test-failure"  # fails on the new side only: the commit broke it
    TEST_FAILURE_BOTH_SIDES = "test-failure-both-sides"  # the project or the build profile
    TEST_FAILURE_PARENT_ONLY = "test-failure-parent-only"  # the commit fixes it: nothing to time
    TEST_FLAKY = "test-flaky"  # failed, then passed when re-run on the same side
    TIMEOUT = "timeout"
    RESOURCE_LIMIT = "resource-limit"
    INFRA = "infra"
    NO_TESTS = "no-tests"


class EvalVerdict(StrEnum):
    OPT = "opt"
    CORRECT = "correct"
    TESTS_FAILED = "tests-failed"
    TIMEOUT = "timeout"
    BUILD_FAILED = "build-failed"
    APPLY_FAILED = "apply-failed"
    EMPTY_PATCH = "empty-patch"
    MALFORMED_PATCH = "malformed-patch"
    TOO_LARGE = "too-large"
    UNSAFE_PATCH = "unsafe-patch"
    TEST_EDIT = "test-edit"
    FORBIDDEN_FILE = "forbidden-file"
    INSTANCE_BROKEN = "instance-broken"
    UNKNOWN_INSTANCE = "unknown-instance"
    UNTRUSTED_REFUSED = "untrusted-refused"


class Oracle(StrEnum):
    """Which workloads prove an instance (`cppperf.proven_by`) or let it grade agents (`oracle`)."""

    CTEST = "ctest"
    BENCHMARK = "benchmark"
    BOTH = "both"
    NONE = "none"

    @classmethod
    def of(cls, *, ctest: bool, benchmark: bool) -> Oracle:
        if ctest and benchmark:
            return cls.BOTH
        return cls.CTEST if ctest else (cls.BENCHMARK if benchmark else cls.NONE)


class BenchmarkSkip(StrEnum):
    """Why a benchmark the tree builds is not timed (`cppperf.benchmarks_skipped`)."""

    LIST_FAILED = "list-failed"  # `--benchmark_list_tests` failed or listed nothing
    CRASHED = "crashed"  # the probe run exited non-zero
    TIMEOUT = "timeout"  # the probe run passed `builder.benchmark_timeout`
    MALFORMED_OUTPUT = "malformed-output"  # no Google Benchmark JSON for it in the output
    ERROR_REPORTED = "error-reported"  # the benchmark reported an error (SkipWithError)
    ONE_SIDE_ONLY = "one-side-only"  # built on one side only
    CHANGED = "changed"  # the commit changes the benchmark's own sources: each side times other code
    OVER_LIMIT = "over-limit"  # beyond `builder.max_benchmarks`
    UNSUPPORTED_FRAMEWORK = "unsupported-framework"  # nanobench: no generic machine-readable output
    EXACT_METRIC = "exact-metric"  # `builder.metric=cachegrind`: benchmarks time, they do not count
    BACKEND = "backend"  # the backend cannot read the build's CMake file API (docker)


class Stage(StrEnum):
    CANDIDATE = "candidate"
    FOUND = "found"
    REJECTED = "rejected"
    FILTERED = "filtered"
    SELECTED = "selected"
    CLASSIFIED = "classified"
    BUILT = "built"


class _Value(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A KV value: `id` and `updated_at` are stamped by the store on every write."""

    id: str = ""
    updated_at: str = ""


# ------------------------------------------------------------------------------------ KV values
class FilterSummary(msgspec.Struct, kw_only=True):
    scanned: int = 0
    selected: int = 0
    rejected: dict[str, int] = msgspec.field(default_factory=dict)
    head: str = ""  # the walked history's head: a repeated walk of the same head is skipped


class RepoState(_Value, kw_only=True):
    stage: Stage | None = None
    url: str = ""
    source: str | None = None
    by: str | None = None  # which stage rejected it
    reason: str | None = None
    validated: bool = False
    head_sha: str | None = None
    test_count: int | None = None
    build_seconds: float | None = None
    filter: FilterSummary | None = None


class CommitState(_Value, kw_only=True):
    stage: Stage | None = None
    repo: str = ""
    sha: str = ""
    label: bool | None = None
    backend: str | None = None
    phase: int | None = None
    score: float | None = None
    verdict: Verdict | None = None


class InstanceState(_Value, kw_only=True):
    stage: Stage | None = None
    verdict: Verdict | None = None
    repo: str = ""
    sha: str = ""
    parent: str = ""
    improved_tests: list[str] = msgspec.field(default_factory=list)
    regressed_tests: list[str] = msgspec.field(default_factory=list)
    improved_benchmarks: list[str] = msgspec.field(default_factory=list)  # `bench:` workloads
    regressed_benchmarks: list[str] = msgspec.field(default_factory=list)
    failure_category: FailureCategory | None = None
    record: str = ""  # the whole instance record (JSON) when small enough to stay inline
    record_ref: str | None = None  # else its object-store name
    record_path: str = ""  # where this node exported it (an export, not the state)
    # gold validation's result (the record's `cppperf.oracle`), set by the evaluator: None until
    # validated (`validate.requested`)
    oracle: Oracle | None = None


class EvaluationState(_Value, kw_only=True):
    verdict: EvalVerdict | None = None
    opt: bool = False
    run_id: str = ""
    model: str = ""
    instance_id: str = ""
    agent: str = ""  # the NATS identity that asked (from the subject); "" for a service's request
    worker: str = ""
    report: str = ""  # the report JSON (without samples) when small enough to stay inline
    report_ref: str | None = None
    # the `Nats-Msg-Id` its announcement was published with (one per evaluation: a crash's
    # re-publish is deduplicated, the next evaluation of the id is not); "" for older records
    announced: str = ""


# --------------------------------------------------------------------- the instance record
# What the builder and the evaluator write, field for field: these decode with
# `forbid_unknown_fields` (a key written but not declared here fails the round-trip tests on real
# output: tests/integration/test_whose_fault.py, test_builder.py, test_evaluator.py, test_domain.py).
class _Written(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class BuildStep(_Written, kw_only=True):
    side: str
    step: str
    ok: bool
    seconds: float
    category: FailureCategory | None = None
    log: str | None = None
    command: list[str] = msgspec.field(default_factory=list)  # the argv exactly as it ran


class StatsRecord(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One test's statistics and decisions (engine/stats.py computes them; the record keeps them)."""

    name: str
    n_old: int
    n_new: int
    median_old: float
    median_new: float
    mean_old: float
    mean_new: float
    median_change: float
    mean_change: float
    ratio: float
    ci_low: float
    ci_high: float
    p_improve: float
    p_regress: float
    p_improve_adj: float = 1.0
    p_regress_adj: float = 1.0
    improved: bool = False
    regressed: bool = False
    paper_improved: bool = False
    paper_regressed: bool = False
    strict_improved: bool = False
    strict_regressed: bool = False
    exact: bool = False  # decided on exact counts, not on a distribution


class Confirmation(_Written, kw_only=True, omit_defaults=True):
    held: bool
    failure: str | None = None
    metric: str | None = None  # the metric `old` and `new` are in (the test's deciding metric)
    old: list[float] | None = None
    new: list[float] | None = None
    old_wall_s: list[float] | None = None
    new_wall_s: list[float] | None = None
    median_change: float | None = None
    p_improve: float | None = None
    p_regress: float | None = None
    ratio: float | None = None
    ci: list[float] | None = None


class SideSamples(_Written, kw_only=True):
    old_s: list[float]
    new_s: list[float]
    old_cpu_s: list[float] = msgspec.field(default_factory=list)
    new_cpu_s: list[float] = msgspec.field(default_factory=list)
    old_instructions: list[float] = msgspec.field(default_factory=list)  # `builder.metric = instructions`
    new_instructions: list[float] = msgspec.field(default_factory=list)
    old_ir: list[float] = msgspec.field(default_factory=list)  # `builder.metric = cachegrind`
    new_ir: list[float] = msgspec.field(default_factory=list)
    # `builder.cachegrind_cache_sim`: estimated cycles per run beside the count (not deciding)
    old_est_cycles: list[float] = msgspec.field(default_factory=list)
    new_est_cycles: list[float] = msgspec.field(default_factory=list)


class Environment(_Written, kw_only=True):
    platform: str = ""
    cpu_model: str = ""
    cpu_count: int | None = None
    python: str = ""
    build_type: str = ""
    thread_env: dict[str, str] = msgspec.field(default_factory=dict)
    pinned_cpu: bool = False
    cppperf_version: str = ""
    profile: str = ""
    timing_cores: list[int] = msgspec.field(default_factory=list)  # host core leases
    build_cores: list[int] = msgspec.field(default_factory=list)
    leased_core: int | None = None  # the core this instance was timed on
    # the lease facts, once timed (`leases.Turns.facts`)
    leased_cores: list[int] | UnsetType = UNSET  # every core a round was timed on
    lease_policy: str | UnsetType = UNSET  # round | whole | poll | none (exact metric / unpinned)
    lease_waits: int | UnsetType = UNSET
    lease_wait_max_s: float | UnsetType = UNSET
    lease_wait_total_s: float | UnsetType = UNSET
    power_warning: str | UnsetType = UNSET  # the rounds cannot reach alpha for this many tests
    load_average_start: list[float] | None = None
    load_average_end: list[float] | UnsetType = UNSET
    compiler_version: str | UnsetType = UNSET  # once both sides built
    cmake_version: str | UnsetType = UNSET


class Attempt(_Written, kw_only=True):
    """One build profile tried (the fallback build type or -Wno-error makes another)."""

    build_type: str
    profile_change: str = ""  # what changed from the configured profile (`-Wno-error`)
    verdict: Verdict
    failure_category: FailureCategory | None = None
    failure_step: str = ""
    failure_lines: list[str] = msgspec.field(default_factory=list)
    failure_detail: str = ""
    tried: list[str] = msgspec.field(default_factory=list)
    build_steps: list[BuildStep] = msgspec.field(default_factory=list)


class ValidationRun(_Written, kw_only=True, omit_defaults=True):
    """One of gold validation's two evaluations, in brief (its full report stays on disk under
    `evaluator.runs_dir/validate/{gold,null}/<id>/`); empty when it did not run (the null patch
    runs only after the expert's scored opt)."""

    verdict: EvalVerdict | None = None
    opt: bool = False
    reason: str = ""
    gm_speedup_agent: float | None = None
    timed_tests: list[str] = msgspec.field(default_factory=list)
    timed_benchmarks: list[str] = msgspec.field(default_factory=list)
    wall_seconds: float | None = None
    metric: str = ""  # the metric its verdict was decided on (cpu | wall | instructions | cachegrind)


class Validation(_Written, kw_only=True):
    """Gold validation (services/evaluator/gold.py): the two evaluations' verdicts, the oracle."""

    gold: ValidationRun = msgspec.field(default_factory=ValidationRun)  # the expert patch's evaluation
    null: ValidationRun = msgspec.field(default_factory=ValidationRun)  # the comment-only patch's
    oracle: Oracle = Oracle.NONE
    can_grade: bool = False
    why: str = ""  # when it cannot grade


class Calibration(_Written, kw_only=True):
    """`cppperf build --calibrate`: an A/A run (the same commit on both sides), what each rule flags."""

    tests: int
    flagged_ours: list[str] = msgspec.field(default_factory=list)
    flagged_paper_rule: list[str] = msgspec.field(default_factory=list)
    flagged_strict_rule: list[str] = msgspec.field(default_factory=list)
    verdict: Verdict
    verdict_paper_rule: Verdict
    verdict_strict_rule: Verdict
    failure: str = ""


class CoveredTest(_Written, kw_only=True):
    """One test's run on the coverage build of the new side (`builder.coverage`)."""

    runs_change: bool  # it executed a changed line (or the function around a change with none)
    lines_hit: int = 0  # the changed executable lines it executed
    lines_total: int = 0  # the changed executable lines (`Coverage.executable_lines`)
    functions_hit: list[str] = msgspec.field(default_factory=list)  # around a change it ran
    ran: bool = True  # False: its coverage run failed; it stays in the deciding family
    # runs_change only assumed: it ran a changed file's code, but its translation units leave the
    # changed sites without a gcov line (always_inline code has none): not known not to run it
    assumed: bool = False


class Coverage(_Written, kw_only=True):
    """Which tests run the change (services/builder, `shared/engine/coverage.py`): the instance is
    decided on those tests (the correction runs over that family); the others are A/A controls."""

    used: bool = False  # the decision ran over `deciding` only
    reason: str = ""  # why not (then every test decided, as without coverage)
    changed_lines: int = 0  # new-side lines the diff adds, or that border a deletion
    executable_lines: int = 0  # of them, lines gcov instruments in a translation unit a test ran
    unmapped_hunks: int = 0  # hunks with no instrumented line and no function around them
    tests: dict[str, CoveredTest] = msgspec.field(default_factory=dict)
    deciding: list[str] = msgspec.field(default_factory=list)  # the tests that run the change
    controls: list[str] = msgspec.field(default_factory=list)  # the tests that do not
    moved_controls: dict[str, str] = msgspec.field(default_factory=dict)  # control -> improved | regressed
    suspect: bool = False  # a control moved: the measurement is flagged (the verdict stands)
    seconds: float = 0.0  # the coverage build, runs and gcov
    build_log: str = ""  # the coverage build's log, by name in the instance's logs folder


class BenchmarkWorkload(_Written, kw_only=True):
    """One benchmark timed as a workload (`bench:<target>/<benchmark>`)."""

    name: str
    target: str  # the CMake target that builds the executable
    executable: str  # its path relative to the build tree
    benchmark: str  # the benchmark's own name (its `--benchmark_filter`)
    framework: str = "google-benchmark"
    repetitions: int = 1  # repetitions inside one sample (the sample is their median)
    min_time_s: float = 0.0  # `--benchmark_min_time` of each repetition


class SkippedBenchmark(_Written, kw_only=True):
    name: str
    reason: BenchmarkSkip
    detail: str = ""
    side: str = ""  # the side it failed on (listing, probe) or is missing from (one-side-only)


class InstanceMeta(_Written, kw_only=True):
    """The instance record's `cppperf` section."""

    record_version: int = 1
    instance_id: str
    # UNSET: not written by the builder (`cppperf dataset import`, images, validation add them)
    imported_from: str | UnsetType | None = UNSET  # a published CppPerf-DB file (`dataset import`)
    statistics: str | UnsetType | None = UNSET  # how an imported record's verdicts were recomputed
    verdict: Verdict
    decision_rule: str = ""  # which rule decided `verdict` (`DecisionRule`: ours | strict | paper)
    verdict_paper_rule: Verdict | None = None
    verdict_strict_rule: Verdict | None = None
    profile: str = ""  # default | paper
    metric: str = ""  # cpu | wall | instructions
    decided_on: dict[str, str] = msgspec.field(default_factory=dict)  # per test: the metric that decided
    repeats: dict[str, int] = msgspec.field(default_factory=dict)  # per test: runs inside one sample
    sample_floor_s: float | None = None
    compared_tests: list[str] = msgspec.field(default_factory=list)
    improved_tests: list[str] | UnsetType = UNSET  # imported records
    regressed_tests: list[str] | UnsetType = UNSET
    failure_category: FailureCategory | None = None
    failure_detail: str = ""
    failure_step: str = ""  # checkout | configure | build | tests | test
    failure_lines: list[str] = msgspec.field(default_factory=list)  # the log lines that matter
    tried: list[str] = msgspec.field(default_factory=list)  # what cppperf did about the failure
    attempts: list[Attempt] = msgspec.field(default_factory=list)
    builder: str = "local"
    environment: Environment = msgspec.field(default_factory=Environment)
    seed: int | None = None
    rounds: int = 0
    rounds_run: dict[str, int] = msgspec.field(default_factory=dict)
    rounds_saved_by_early_stop: int = 0
    settled_early: dict[str, str] = msgspec.field(default_factory=dict)
    # workloads taken out of the measurement, and why (the exact metric: a test that fails under
    # Valgrind on both sides and passes natively on both); the evaluator does not count them
    left_out: dict[str, str] = msgspec.field(default_factory=dict)
    added_tests: list[str] = msgspec.field(default_factory=list)
    removed_tests: list[str] = msgspec.field(default_factory=list)
    missing_packages: list[str] = msgspec.field(default_factory=list)
    llm_proposed_packages: list[str] = msgspec.field(default_factory=list)
    build_steps: list[BuildStep] = msgspec.field(default_factory=list)
    tests: list[StatsRecord] = msgspec.field(default_factory=list)
    confirmations: dict[str, Confirmation] = msgspec.field(default_factory=dict)
    samples: dict[str, SideSamples] = msgspec.field(default_factory=dict)
    linked_texts_fetched: bool = False
    image: str | UnsetType | None = UNSET  # the docker backend's instance image
    installed_packages: list[str] | UnsetType = UNSET
    image_pushed: str | UnsetType | None = UNSET
    oracle: str | UnsetType | None = UNSET  # `cppperf validate`: ctest | benchmark | both | none
    # the project's benchmarks as workloads: which kind of workload proved the instance (None: no
    # proof was made), per-benchmark statistics beside `tests`, what was timed and what was not
    proven_by: Oracle | None = None
    benchmarks: list[StatsRecord] = msgspec.field(default_factory=list)
    benchmark_workloads: list[BenchmarkWorkload] = msgspec.field(default_factory=list)
    benchmarks_skipped: list[SkippedBenchmark] = msgspec.field(default_factory=list)
    improved_benchmarks: list[str] = msgspec.field(default_factory=list)
    regressed_benchmarks: list[str] = msgspec.field(default_factory=list)
    validation: Validation | UnsetType | None = UNSET
    calibration: Calibration | UnsetType = UNSET
    coverage: Coverage | UnsetType = UNSET  # `builder.coverage`: which tests run the change


class InstanceRecord(PublishedEntry, kw_only=True):
    """One instance record (`OUT/instances/<id>.json`): the published CppPerf-DB sections
    (shared/published.py) plus `cppperf`. Built as this Struct by services/builder/record.py and by
    `cppperf dataset import` (cppperf/dataset/records.py); `write_record` writes it."""

    cppperf: InstanceMeta


# ------------------------------------------------------------------- the evaluation report
class FailedTest(_Written, kw_only=True):
    test: str
    returncode: int
    timed_out: bool
    output_tail: str = ""


class PerTestScore(_Written, kw_only=True):
    agent_speedup: float
    agent_ci: list[float] | None
    agent_improved: bool
    agent_regressed: bool
    expert_speedup: float
    expert_ci: list[float] | None
    expert_improved: bool
    # the medians per side (old, agent, expert): milliseconds of a timed test, Valgrind's
    # instruction count of a counted one (`metric=cachegrind`); a test has one of the two
    median_ms: dict[str, float] | UnsetType = UNSET
    median_instructions: dict[str, int] | UnsetType = UNSET
    agent_vs_expert_time_ratio: float
    agent_vs_expert_ci: list[float]
    within_opt_fraction: bool


class NativeConfirmation(_Written, kw_only=True):
    """An `opt` decided on exact counts, checked against native CPU time (evaluator pipeline
    `_confirm`): original, agent and expert timed without Valgrind on the timing core. A count
    can be made to disagree with the work (a patch that detects Valgrind and does less there,
    work the count misses); the time cannot. `confirmed`: the native times score `opt` too (the
    timed metric's own decision: the agent significantly faster than the original on a counted
    test, slower on none, within `evaluator.opt_fraction` of the expert); else the
    verdict is `correct`, not `opt`."""

    metric: str = "cpu"
    rounds: int
    confirmed: bool
    speedup: dict[str, float] = msgspec.field(default_factory=dict)  # per test: original / agent, native
    expert_speedup: dict[str, float] = msgspec.field(default_factory=dict)  # original / expert, native
    improved: list[str] = msgspec.field(default_factory=list)  # the agent significantly faster
    regressed: list[str] = msgspec.field(default_factory=list)  # the agent significantly slower
    short_of_expert: list[str] = msgspec.field(default_factory=list)  # clearly slower than the expert
    leased_core: int | None = None


class EvalReport(_Written, kw_only=True):
    """`runs/<run_id>/<model>/<instance_id>/report.json`, built as this Struct by the evaluator
    (services/evaluator/pipeline.py). A field is UNSET (absent from the JSON) until the step that
    fills it ran: a patch refused before it is applied has no `applied`, `tests`, `per_test`, …"""

    verdict: EvalVerdict
    opt: bool = False
    reason: str = ""
    instance_id: str | UnsetType = UNSET
    run_id: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    evaluation_id: str | UnsetType = UNSET
    patch_sha256: str | UnsetType = UNSET  # the evaluated patch: a report is reused only for the same patch
    wall_seconds: float | UnsetType = UNSET
    sandbox: str | UnsetType = UNSET  # bwrap | docker | none (trust_patches without a jail)
    multi_file: bool | UnsetType = UNSET
    files: list[str] | UnsetType = UNSET
    applied: bool | UnsetType = UNSET
    applied_with: str | UnsetType = UNSET
    apply_log: str | UnsetType = UNSET
    builds: bool | UnsetType = UNSET
    build_tail: str | UnsetType = UNSET
    tests: list[str] | UnsetType = UNSET
    tests_pass: bool | UnsetType = UNSET
    failing_tests: list[FailedTest] | UnsetType = UNSET
    timed_tests: list[str] | UnsetType = UNSET  # every timed workload: tests and `bench:` benchmarks
    timed_benchmarks: list[str] | UnsetType = UNSET  # the benchmarks among them
    # tests Valgrind could not count on any side (passing natively on all): not counted, and why
    left_out: dict[str, str] | UnsetType = UNSET
    # why the exact metric could not grade and CPU time did (an instruction Valgrind lacks...)
    cpu_fallback: str | UnsetType = UNSET
    # where in the expert's tree Valgrind stopped, when that caused it (the operator's; agents never see it)
    cpu_fallback_expert: str | UnsetType = UNSET
    benchmarks_skipped: list[SkippedBenchmark] | UnsetType = UNSET
    rounds: int | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    per_test: dict[str, PerTestScore] | UnsetType = UNSET
    gm_speedup_agent: float | UnsetType = UNSET
    gm_speedup_expert: float | UnsetType = UNSET
    fraction_of_expert: float | UnsetType | None = UNSET
    agent_significant: bool | UnsetType = UNSET
    agent_regressed: bool | UnsetType = UNSET
    # per test, per side: the deciding metric's samples, and wall and CPU (not on the bus)
    samples: dict[str, dict[str, list[float]]] | UnsetType = UNSET
    samples_wall: dict[str, dict[str, list[float]]] | UnsetType = UNSET
    samples_cpu: dict[str, dict[str, list[float]]] | UnsetType = UNSET
    # `builder.cachegrind_cache_sim`: estimated cycles per run, beside the counts (not deciding)
    samples_est_cycles: dict[str, dict[str, list[float]]] | UnsetType = UNSET
    metric: str | UnsetType = UNSET  # builder.metric
    decided_on: dict[str, str] | UnsetType = UNSET  # per test: the metric that decided
    repeats: dict[str, int] | UnsetType = UNSET  # per test: runs inside one sample
    leased_core: int | UnsetType | None = UNSET  # the timing core the three trees were timed on
    # an `opt` on exact counts checked by native CPU time (its samples: `samples_confirm`, on disk)
    native_confirmation: NativeConfirmation | UnsetType = UNSET
    samples_confirm: dict[str, dict[str, list[float]]] | UnsetType = UNSET


# ------------------------------------------------------------------------------------ schemas
SCHEMA_TYPES: Final[dict[str, type[msgspec.Struct]]] = {
    "repo-state": RepoState,
    "commit-state": CommitState,
    "instance-state": InstanceState,
    "evaluation-state": EvaluationState,
    "instance-record": InstanceRecord,
    "published-entry": PublishedEntry,
    "instance-meta": InstanceMeta,
    "eval-report": EvalReport,
}

S = TypeVar("S", bound=msgspec.Struct)


def schema(name: str) -> dict[str, object]:
    """The JSON schema of one domain type by its name in `SCHEMA_TYPES`."""
    try:
        typ = SCHEMA_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown schema {name!r}: one of {', '.join(SCHEMA_TYPES)}") from None
    out: dict[str, object] = msgspec.json.schema(typ)
    return out


def schemas() -> dict[str, dict[str, object]]:
    return {name: schema(name) for name in SCHEMA_TYPES}


def to_struct(value: object, typ: type[S]) -> S:
    """A JSON-shaped value (a KV value, a record section, a report) as its Struct."""
    return msgspec.convert(value, typ, strict=False)


def to_json_dict(value: msgspec.Struct) -> dict[str, object]:
    out: dict[str, object] = msgspec.to_builtins(value)
    return out


def record_text(record: InstanceRecord, *, indent: int | None = 1) -> str:
    """An instance record's JSON as the record files hold it: Python's encoder, as records were
    always written (an unknown CI is `Infinity`, which `msgspec.json` would write as null)."""
    return json.dumps(msgspec.to_builtins(record), indent=indent)


def decode_record(value: str | bytes | object) -> InstanceRecord:
    """An instance record from its JSON (text, or already parsed), strictly: every key declared,
    every value of its type (`msgspec.ValidationError` otherwise; `json.JSONDecodeError` for text
    that is not JSON, ValueError for JSON nested deeper than the decoder's recursion limit).
    Python's decoder: it reads `Infinity`."""
    try:
        data = json.loads(value) if isinstance(value, str | bytes) else value
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    return msgspec.convert(data, InstanceRecord, strict=True)
