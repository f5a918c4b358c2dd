"""A service started before its NATS cluster can answer JetStream (one node of three up: no meta
leader, so no stream can be created) waits and comes up once the other nodes join, instead of
dying with a `nats: timeout` traceback (found by bench/cluster_e2e.py on a fresh cluster)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from cppperf.runtime import connect
from cppperf.shared.settings import load_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cluster_e2e import Cluster, make_keys

pytestmark = pytest.mark.stage2


@pytest.mark.nats
@pytest.mark.slow
async def test_a_service_waits_for_the_cluster_to_answer_jetstream(tmp_path: Path) -> None:
    for sub in ("conf", "logs"):
        (tmp_path / sub).mkdir()
    env, _secrets = make_keys(tmp_path)
    cluster = Cluster(tmp_path, env)
    settings = load_settings(
        env={
            "CPPPERF_BUS_CREDS": str(tmp_path / "conf" / "creds" / "admin.creds"),
            "CPPPERF_BUS_PROVISION": "self",  # the admin's identity, provisioning as it connects
            "CPPPERF_BUS_REPLICAS": "3",
            "CPPPERF_BUS_RECONNECT_WAIT": "0.5",
        }
    )
    try:
        cluster.start(1)

        async def start_service() -> list[str]:
            async with connect(settings, cluster.url, owner=True, services=["filter"], wait=True) as ctx:
                return [i.config.name or "" for i in await ctx.bus.js.streams_info()]

        service = asyncio.create_task(start_service())
        await asyncio.sleep(15)  # longer than one JetStream request's timeout (10 s)
        assert not service.done(), service.exception()  # waiting, not failed
        cluster.start(2)
        cluster.start(3)
        streams = await asyncio.wait_for(service, timeout=120)
        assert {"REPO_FOUND", "COMMIT_SELECTED", "KV_repos", "OBJ_blobs"} <= set(streams)
    finally:
        cluster.stop()
