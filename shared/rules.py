"""The structural rules that pick candidate commits (paper §CppPerf-Mine, step 2).

A commit is selected when it: is not a merge; has a commit date inside the window; changes at
least one and at most `max_files` files; changes only C++ source/header files; touches no test
file; touches no vendored path. The first rule a commit breaks is its rejection reason.
The filter selects with them; the evaluator's patch checks and the classifier's corpus tooling
use the same test/vendored/source rules, so they live here, not in a stage.

Test files: any path segment named like `test`, `tests`, `unittest`, `testing` (case-insensitive),
or a file name matching `*_test.*`, `test_*.*`, `*Test.*`, `*_unittest.*` (settings
`mining.test_dir_names` / `mining.test_file_globs`). Vendored: a segment such as `third_party`,
`3rdparty`, `vendor`, `external` (`mining.vendor_dir_names`).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from enum import StrEnum
from pathlib import PurePosixPath

from cppperf.shared.settings import MiningSettings


class Reason(StrEnum):
    MERGE = "merge"
    OUT_OF_WINDOW = "out-of-window"
    EMPTY = "no-files"
    TOO_MANY_FILES = "too-many-files"
    NON_CPP = "non-cpp-file"
    TEST_FILE = "test-file"
    VENDORED = "vendored-path"


@dataclass(frozen=True)
class Window:
    since: datetime
    until: datetime  # inclusive end of day

    @classmethod
    def from_strings(cls, since: str, until: str) -> Window:
        s = date.fromisoformat(since)
        u = date.fromisoformat(until)
        return cls(
            datetime(s.year, s.month, s.day, tzinfo=UTC),
            datetime(u.year, u.month, u.day, 23, 59, 59, 999999, tzinfo=UTC),
        )

    def contains(self, when: datetime) -> bool:
        return self.since <= when <= self.until


@dataclass
class Rules:
    window: Window
    max_files: int
    extensions: frozenset[str]
    test_dirs: frozenset[str]
    test_globs: tuple[str, ...]
    vendor_dirs: frozenset[str]
    _cache: dict[str, Reason | None] = field(default_factory=dict, repr=False)

    @classmethod
    def from_settings(cls, s: MiningSettings) -> Rules:
        return cls(
            window=Window.from_strings(s.since, s.until),
            max_files=s.max_files,
            extensions=frozenset(s.source_extensions),
            test_dirs=frozenset(d.lower() for d in s.test_dir_names),
            test_globs=tuple(s.test_file_globs),
            vendor_dirs=frozenset(d.lower() for d in s.vendor_dir_names),
        )

    def is_cpp(self, path: str) -> bool:
        suffix = PurePosixPath(path).suffix
        return suffix in self.extensions or suffix.lower() in self.extensions

    def is_test_path(self, path: str) -> bool:
        p = PurePosixPath(path)
        if any(seg.lower() in self.test_dirs for seg in p.parts[:-1]):
            return True
        return any(fnmatch.fnmatchcase(p.name, g) for g in self.test_globs)

    def is_vendored(self, path: str) -> bool:
        return any(seg.lower() in self.vendor_dirs for seg in PurePosixPath(path).parts[:-1])

    def path_reason(self, path: str) -> Reason | None:
        """The rule a single changed path breaks, if any (cached: paths repeat across commits)."""
        if path in self._cache:
            return self._cache[path]
        reason: Reason | None = None
        if not self.is_cpp(path):
            reason = Reason.NON_CPP
        elif self.is_test_path(path):
            reason = Reason.TEST_FILE
        elif self.is_vendored(path):
            reason = Reason.VENDORED
        if len(self._cache) < 200_000:
            self._cache[path] = reason
        return reason

    def check(self, *, parents: int, when: datetime, paths: list[str]) -> Reason | None:
        """The first rule this commit breaks, or None when it is selected."""
        if parents > 1:
            return Reason.MERGE
        if not self.window.contains(when):
            return Reason.OUT_OF_WINDOW
        if not paths:
            return Reason.EMPTY
        if len(paths) > self.max_files:
            return Reason.TOO_MANY_FILES
        found: set[Reason] = set()
        for path in paths:
            r = self.path_reason(path)
            if r is not None:
                found.add(r)
        for r in (Reason.NON_CPP, Reason.TEST_FILE, Reason.VENDORED):
            if r in found:
                return r
        return None
