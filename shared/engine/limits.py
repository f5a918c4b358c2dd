"""The limits every test run gets, built in one place for the builder and the evaluator.

`limits_for(test, settings)`: the test's own CTest TIMEOUT or the configured one, CPU time twice
that (+1 s), the memory and process caps, and the CPU to pin to. `pinned_cpu(settings)` is the one
place that picks that CPU (the last one this process may run on); host core leases replace it.
"""

from __future__ import annotations

import os

from cppperf.shared.engine.cmake import TestCase
from cppperf.shared.engine.sandbox import Limits
from cppperf.shared.settings import BuilderSettings


def pinned_cpu(settings: BuilderSettings) -> int | None:
    """The CPU timing runs are pinned to, or None when `builder.pin_cpu` is off."""
    if not settings.pin_cpu:
        return None
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API on this platform
        return None
    return cpus[-1] if cpus else None


def limits_for(
    test: TestCase, settings: BuilderSettings, *, timeout: float | None = None, cpu: int | None = None
) -> Limits:
    """Limits for one run of `test`: its CTest TIMEOUT, else `timeout`, else `builder.test_timeout`."""
    seconds = test.timeout or (timeout if timeout is not None else settings.test_timeout)
    return Limits(
        timeout=seconds,
        cpu_seconds=int(seconds * 2) + 1,
        memory_mb=settings.memory_limit_mb,
        processes=settings.max_processes,
        cpu=cpu,
    )
