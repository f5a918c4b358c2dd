"""An agent given a cluster's seed list whose first node is down connects to the next one
without printing a traceback (nats-py's default error callback did: the end-to-end run's agent
met it after a node was killed)."""

from __future__ import annotations

import logging

import pytest

from cppperf.client import AgentClient
from cppperf.shared.embedded import EmbeddedNats, free_port


@pytest.mark.nats
async def test_a_dead_seed_is_skipped_quietly(
    nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"nats://127.0.0.1:{free_port()},{nats_server.url}"
    caplog.set_level(logging.DEBUG)
    for _ in range(8):  # nats-py shuffles the seeds: the dead one comes first in most of 8 tries
        async with await AgentClient.connect(url) as client:
            assert client.nc.is_connected
    with_traceback = [r.getMessage() for r in caplog.records if r.exc_info]
    assert with_traceback == []
