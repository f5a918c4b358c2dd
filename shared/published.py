"""The published CppPerf-DB sections of an instance record, as msgspec Structs.

    PublishedEntry   one published file (`entries/<owner>_<name>_<sha>.json`): metadata,
                     commit_info, issues, pull_requests, build_info, performance_analysis, tests,
                     logs, raw_timing_data
    InstanceRecord   (shared/domain.py) = PublishedEntry + `cppperf: InstanceMeta`

The builder fills these sections the way the 347 published files fill them, so tools that read
CppPerf-DB read our records. How strict: every key either writer puts in a section is declared
with its type, and unknown keys are refused (`forbid_unknown_fields`): a variant key is modelled
here, never let through. A key may be absent (`UNSET`, and absent again when encoded, so a file
decodes and encodes back to the same keys) except the five `cppperf dataset import` has always
required — `metadata.repository_name`, `commit_info.old_sha`, `new_sha`, `files_changed`,
`tests.tests` — and the name of a file, test or linked text: CppPerf-DB-shaped files smaller than
the published ones (hand-written, older exports) import as they did. Beside a key, who writes it
when only one writer does: *published* (all 347 files: the pair, binomial and Wilcoxon tests, 99 %
CIs, Cohen's d, log paths, a file's patch, an issue's date) or *ours* (services/builder/record.py:
the deciding metric, median changes, the best test, build log names, the tests whose binaries
matched); the builder writes every other key of its sections.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class Metadata(_Section, kw_only=True):
    collection_date: str | UnsetType = UNSET
    repository: str | UnsetType = UNSET  # the clone URL
    repository_name: str  # owner/name


class ChangedFile(_Section, kw_only=True):
    filename: str
    status: str | UnsetType = UNSET  # added | removed | modified (GitHub's names)
    additions: int | UnsetType = UNSET
    deletions: int | UnsetType = UNSET
    changes: int | UnsetType = UNSET
    patch: str | UnsetType | None = UNSET  # published: the file's hunks (None for a binary file)


class LinkedText(_Section, kw_only=True):
    """One linked issue or pull request."""

    number: int
    url: str | UnsetType = UNSET
    title: str | UnsetType = UNSET
    body: str | UnsetType = UNSET
    created_at: str | UnsetType = UNSET  # published


class CommitInfo(_Section, kw_only=True):
    old_sha: str
    new_sha: str
    commit_message: list[str] | UnsetType = UNSET
    commit_date: str | UnsetType = UNSET
    patch: list[str] | UnsetType = UNSET
    files_changed: list[ChangedFile]
    lines_added: int | UnsetType = UNSET
    lines_removed: int | UnsetType = UNSET


class BuildInfo(_Section, kw_only=True):
    old_build_script: list[str] | UnsetType = UNSET
    new_build_script: list[str] | UnsetType = UNSET
    old_test_script: list[str] | UnsetType = UNSET
    new_test_script: list[str] | UnsetType = UNSET
    build_system: str | UnsetType = UNSET


class PerformanceAnalysis(_Section, kw_only=True):
    """The instance as a whole: the sum of the timed tests' samples, old side against new."""

    is_significant: bool | UnsetType = UNSET
    p_value: float | UnsetType = UNSET  # published: the paper's per-instance tests
    is_pair_significant: bool | UnsetType = UNSET
    pair_p_value: float | UnsetType = UNSET
    is_binom_significant: bool | UnsetType = UNSET
    binom_p_value: float | UnsetType = UNSET
    is_wilcoxon_significant: bool | UnsetType = UNSET
    wilcoxon_p_value: float | UnsetType = UNSET
    is_mannwhitney_significant: bool | UnsetType = UNSET
    mannwhitney_p_value: float | UnsetType = UNSET
    # ours: the improved workload with the largest median change (None: nothing improved)
    test_name: str | UnsetType | None = UNSET
    test_relative_improvement: float | UnsetType | None = UNSET
    test_relative_improvement_median: float | UnsetType | None = UNSET
    relative_improvement: float | UnsetType = UNSET
    relative_improvement_median: float | UnsetType = UNSET  # ours
    absolute_improvement_ms: float | UnsetType = UNSET
    old_mean_ms: float | UnsetType = UNSET
    new_mean_ms: float | UnsetType = UNSET
    old_std_ms: float | UnsetType = UNSET  # published
    new_std_ms: float | UnsetType = UNSET
    effect_size_cohens_d: float | UnsetType = UNSET
    old_ci95_ms: list[float] | UnsetType = UNSET
    new_ci95_ms: list[float] | UnsetType = UNSET
    old_ci99_ms: list[float] | UnsetType = UNSET  # published
    new_ci99_ms: list[float] | UnsetType = UNSET
    old_times_s: list[float] | UnsetType = UNSET
    new_times_s: list[float] | UnsetType = UNSET


class TestResult(_Section, kw_only=True):
    """One test in `tests.tests`. A test whose binaries matched on both sides (ours, verdict
    `unchanged-binaries`) has only its name, `is_significant` and `unchanged_binary`."""

    __test__ = False  # not a pytest test class

    test_name: str
    is_significant: bool | UnsetType = UNSET
    p_value: float | UnsetType = UNSET  # ours: the BH-adjusted one-sided p
    is_pair_significant: bool | UnsetType = UNSET  # published
    pair_p_value: float | UnsetType = UNSET
    is_binom_significant: bool | UnsetType = UNSET
    binom_p_value: float | UnsetType = UNSET
    is_wilcoxon_significant: bool | UnsetType = UNSET
    wilcoxon_p_value: float | UnsetType = UNSET
    is_mannwhitney_significant: bool | UnsetType = UNSET
    mannwhitney_p_value: float | UnsetType = UNSET
    relative_improvement: float | UnsetType = UNSET
    relative_improvement_median: float | UnsetType = UNSET  # ours
    decided_on: str | UnsetType | None = UNSET  # ours: the metric that decided it
    exact: bool | UnsetType = UNSET  # ours: decided on exact counts
    absolute_improvement_ms: float | UnsetType = UNSET
    old_mean_ms: float | UnsetType = UNSET
    new_mean_ms: float | UnsetType = UNSET
    old_std_ms: float | UnsetType = UNSET
    new_std_ms: float | UnsetType = UNSET
    # published: a float, or the string "NaN" where both sides had no variance (998 of 13,797 tests)
    effect_size_cohens_d: float | str | UnsetType = UNSET
    old_ci95_ms: list[float] | UnsetType = UNSET
    new_ci95_ms: list[float] | UnsetType = UNSET
    old_ci99_ms: list[float] | UnsetType = UNSET  # published
    new_ci99_ms: list[float] | UnsetType = UNSET
    old_times: list[float] | UnsetType = UNSET  # ms
    new_times: list[float] | UnsetType = UNSET
    unchanged_binary: bool | UnsetType = UNSET  # ours


class TestsSummary(_Section, kw_only=True):
    """The `tests` section: counts and names per statistical test, then every test."""

    __test__ = False

    total_tests: int | UnsetType = UNSET
    significant_improvements: int | UnsetType = UNSET
    significant_improvements_tests: list[str] | UnsetType = UNSET
    significant_regressions: int | UnsetType = UNSET
    significant_regressions_tests: list[str] | UnsetType = UNSET
    significant_pair_improvements: int | UnsetType = UNSET  # published
    significant_pair_improvements_tests: list[str] | UnsetType = UNSET
    significant_pair_regressions: int | UnsetType = UNSET
    significant_pair_regressions_tests: list[str] | UnsetType = UNSET
    significant_binom_improvements: int | UnsetType = UNSET
    significant_binom_improvements_tests: list[str] | UnsetType = UNSET
    significant_binom_regressions: int | UnsetType = UNSET
    significant_binom_regressions_tests: list[str] | UnsetType = UNSET
    significant_wilcoxon_improvements: int | UnsetType = UNSET
    significant_wilcoxon_improvements_tests: list[str] | UnsetType = UNSET
    significant_wilcoxon_regressions: int | UnsetType = UNSET
    significant_wilcoxon_regressions_tests: list[str] | UnsetType = UNSET
    significant_mannwhitney_improvements: int | UnsetType = UNSET
    significant_mannwhitney_improvements_tests: list[str] | UnsetType = UNSET
    significant_mannwhitney_regressions: int | UnsetType = UNSET
    significant_mannwhitney_regressions_tests: list[str] | UnsetType = UNSET
    tests: list[TestResult]


class Logs(_Section, kw_only=True):
    full_log_path: str | UnsetType = UNSET  # published
    config_log_path: str | UnsetType = UNSET
    build_log_path: str | UnsetType = UNSET
    test_log_path: str | UnsetType = UNSET
    build_success: bool | UnsetType = UNSET
    test_success: bool | UnsetType = UNSET
    build_logs: list[str] | UnsetType = UNSET  # ours: the kept build logs


class RawTimingData(_Section, kw_only=True):
    warmup_runs: int | UnsetType = UNSET
    measurement_runs: int | UnsetType = UNSET
    min_exec_time_improvement: float | UnsetType = UNSET
    min_p_value: float | UnsetType = UNSET


class PublishedEntry(_Section, kw_only=True):
    """One CppPerf-DB entry: what `cppperf dataset import` reads and `export --format cppperf-db`
    writes back, key for key."""

    metadata: Metadata
    commit_info: CommitInfo
    issues: list[LinkedText] | UnsetType = UNSET
    pull_requests: list[LinkedText] | UnsetType = UNSET
    build_info: BuildInfo | UnsetType = UNSET
    performance_analysis: PerformanceAnalysis | UnsetType = UNSET
    tests: TestsSummary
    logs: Logs | UnsetType = UNSET
    raw_timing_data: RawTimingData | UnsetType = UNSET
