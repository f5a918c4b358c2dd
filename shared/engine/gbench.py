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


def min_time_arg(seconds: float, *, units: bool) -> str:
    """`--benchmark_min_time` as the library linked in takes it: Google Benchmark 1.8 and later
    want a unit (`0.5s`) and, given none, write a warning on stderr that lands inside the JSON
    on stdout (no newline after it: scnlib's benchmarks, built against 1.9, gave no readable
    output at all); 1.7 and earlier refuse the unit (`units`: the executable took it when listed,
    `UNITS_ARGS`)."""
    return f"--benchmark_min_time={seconds:g}{'s' if units else ''}"


def run_args(benchmark: str, s: BenchSettings, *, units: bool = False) -> list[str]:
    """The switches that run one benchmark, timed, with its JSON on stdout."""
    return [
        f"--benchmark_filter=^{ere_escape(benchmark)}$",
        "--benchmark_format=json",
        f"--benchmark_repetitions={s.repetitions}",
        min_time_arg(s.min_time, units=units),
    ]


PROBE_SECONDS = 0.001  # a probe run: one repetition, as short as Google Benchmark allows
LIST_ARGS = ["--benchmark_list_tests=true"]
# a listing that also says whether the executable takes a unit in --benchmark_min_time (1.8+;
# 1.7 exits 1: "unrecognized command-line flag"), then listed again without it
UNITS_ARGS = [*LIST_ARGS, "--benchmark_min_time=1s"]


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


# Google Benchmark's own log lines (`-- LOG(0): …`, `***WARNING*** …`) go to stderr, which the
# run's output interleaves with the JSON on stdout, at times inside it with no newline after them
# (the JSON's next line, indented, follows on the same line)
_OWN_LOG = re.compile(r"(?:-- LOG\(-?\d+\): |\*\*\*WARNING\*\*\* )[^\n]*?(?=\n| {2,}[\[\]{}\"]|$)")


def _first_document(output: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    for mt in re.finditer(r"^\{", output, re.MULTILINE):
        try:
            doc, _end = decoder.raw_decode(output, mt.start())
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list):
            return doc
    return None


def _json_document(output: str) -> dict[str, Any]:
    """The first JSON object in `output` with a `benchmarks` list (stderr lines may surround it,
    and the library's own log lines may land inside it: `_OWN_LOG`, taken out)."""
    doc = _first_document(output)
    if doc is None and _OWN_LOG.search(output):
        doc = _first_document(_OWN_LOG.sub("", output))
    if doc is None:
        tail = output[-200:].strip()
        raise BenchOutputError(
            BenchmarkSkip.MALFORMED_OUTPUT, f"no Google Benchmark JSON in the output (ends: {tail!r})"
        )
    return doc


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
