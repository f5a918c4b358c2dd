"""Google Benchmark's side of a benchmark workload: its command line (`--benchmark_filter` with
the name matched literally, JSON output, repetitions, minimum time) and its outputs — the
`--benchmark_list_tests` listing and the `--benchmark_format=json` document (`benchmarks[]`:
`name`/`run_name`, `run_type` iteration|aggregate, `repetition_index`, `iterations`, `real_time`,
`cpu_time`, `time_unit`, `error_occurred`/`error_message`, `skipped` in newer releases)."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from typing import Any

from cppperf.shared.domain import BenchmarkSkip

_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_ERE_SPECIAL = set(".[]()*+?{}|^$\\")


def ere_escape(text: str) -> str:
    """`text` matched literally by a POSIX extended regex (Google Benchmark's filter)."""
    return "".join(f"\\{c}" if c in _ERE_SPECIAL else c for c in text)


@dataclass(frozen=True)
class BenchSettings:
    repetitions: int
    min_time: float
    timeout: float


def run_args(benchmark: str, s: BenchSettings) -> list[str]:
    """The switches that run one benchmark, timed, with its JSON on stdout."""
    return [
        f"--benchmark_filter=^{ere_escape(benchmark)}$",
        "--benchmark_format=json",
        f"--benchmark_repetitions={s.repetitions}",
        f"--benchmark_min_time={s.min_time:g}",
    ]


PROBE_ARGS = ["--benchmark_repetitions=1", "--benchmark_min_time=0.001"]  # as short as it allows
LIST_ARGS = ["--benchmark_list_tests=true"]


def listed(output: str) -> list[str]:
    """Benchmark names from `--benchmark_list_tests=true` (one per line; a warning, a log line or
    a flag echoed back by a program with its own `main` is not a name)."""
    return [
        ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith(("*", " ", "-", "["))
    ]


class BenchOutputError(ValueError):
    """A benchmark's output is not the Google Benchmark JSON of its run (the reason)."""

    def __init__(self, reason: BenchmarkSkip, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _json_document(output: str) -> dict[str, Any]:
    """The first JSON object in `output` with a `benchmarks` list (stderr lines may surround it)."""
    decoder = json.JSONDecoder()
    for mt in re.finditer(r"^\{", output, re.MULTILINE):
        try:
            doc, _end = decoder.raw_decode(output, mt.start())
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list):
            return doc
    raise BenchOutputError(BenchmarkSkip.MALFORMED_OUTPUT, "no Google Benchmark JSON in the output")


def parse_run(output: str, benchmark: str) -> tuple[float, float, int]:
    """(median real time, median CPU time) per iteration in seconds over the repetitions of
    `benchmark` in a `--benchmark_format=json` output, and how many repetitions there were."""
    doc = _json_document(output)
    real, cpu = [], []
    for b in doc["benchmarks"]:
        if not isinstance(b, dict) or b.get("run_type", "iteration") != "iteration":
            continue  # aggregates (mean, median, stddev, cv) are computed, not measured
        if b.get("run_name", b.get("name")) != benchmark and b.get("name") != benchmark:
            continue
        if b.get("error_occurred") or b.get("skipped"):
            raise BenchOutputError(
                BenchmarkSkip.ERROR_REPORTED, str(b.get("error_message") or "skipped")[:300]
            )
        unit = _UNITS.get(str(b.get("time_unit", "ns")))
        try:
            r, c = float(b["real_time"]), float(b["cpu_time"])
        except (KeyError, TypeError, ValueError):
            raise BenchOutputError(
                BenchmarkSkip.MALFORMED_OUTPUT, f"{benchmark}: no real_time/cpu_time"
            ) from None
        if unit is None or r < 0 or c < 0:
            raise BenchOutputError(BenchmarkSkip.MALFORMED_OUTPUT, f"{benchmark}: unknown time_unit or time")
        real.append(r * unit)
        cpu.append(c * unit)
    if not real:
        raise BenchOutputError(
            BenchmarkSkip.MALFORMED_OUTPUT, f"no iteration run of {benchmark!r} in the JSON"
        )
    return statistics.median(real), statistics.median(cpu), len(real)
