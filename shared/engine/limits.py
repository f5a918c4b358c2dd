"""The limits every test run gets, built in one place for the builder and the evaluator.

`limits_for(test, settings)`: the test's own CTest TIMEOUT or the configured one, CPU time twice
that (+1 s), the memory and process caps, and where to run: a timed run on its leased core
(`leases.timing_core`), anything else on the build cores.
"""

from __future__ import annotations

from cppperf.shared.engine.cmake import TestCase
from cppperf.shared.engine.leases import core_plan
from cppperf.shared.engine.sandbox import Limits
from cppperf.shared.settings import BuilderSettings


def limits_for(
    test: TestCase,
    settings: BuilderSettings,
    *,
    timeout: float | None = None,
    cpu: int | None = None,
    instructions: bool = False,
    counted: bool = False,
) -> Limits:
    """Limits for one run of `test`: its CTest TIMEOUT, else `timeout`, else `builder.test_timeout`.
    A timed run gets `cpu` (its leased core); an untimed one runs on the build cores. `counted`:
    a timed run under Valgrind (`builder.metric=cachegrind`): the same limits but time, which is
    `builder.valgrind_slowdown` times longer, on any core (an exact count needs no quiet core)."""
    seconds = test.timeout or (timeout if timeout is not None else settings.test_timeout)
    plan = core_plan(settings)
    if counted:
        seconds *= settings.valgrind_slowdown
    return Limits(
        timeout=seconds,
        cpu_seconds=int(seconds * 2) + 1,
        memory_mb=settings.memory_limit_mb,
        processes=settings.max_processes,
        cpu=cpu,
        cpus=(plan.all if counted else plan.build) if cpu is None and settings.pin_cpu else (),
        instructions=instructions,
        valgrind=counted,
        cache_sim=counted and settings.cachegrind_cache_sim,
    )
