"""Deployment files: the compose file's structure (3-node NATS cluster with auth, vLLM servers with
GPU reservations, every service, health checks, volumes), every CPPPERF_* variable it passes is one
the code reads, and the NATS configs form a real R=3 JetStream cluster our bus provisions."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cppperf.shared import messages as m
from cppperf.shared.bus import Bus
from cppperf.shared.embedded import find_nats_server, free_port
from cppperf.shared.provision import provision_all
from cppperf.shared.settings import env_names, load_settings

pytestmark = pytest.mark.stage2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from cluster_e2e import cluster_node_config  # noqa: E402 - bench/ is no package


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_services_and_volumes(compose: dict[str, Any]) -> None:
    svc = compose["services"]
    assert {
        "nats-1",
        "nats-2",
        "nats-3",
        "vllm-model-1",
        "vllm-model-2",
        "crawler",
        "filter",
        "classifier",
        "builder",
        "evaluator",
    } <= set(svc)
    for name in ("crawler", "filter", "classifier", "builder", "evaluator"):
        assert svc[name]["command"] == ["serve", name]
        assert "healthcheck" in svc[name]
        assert any(str(v).endswith(":/data") for v in svc[name]["volumes"])
    for name in ("nats-1", "nats-2", "nats-3"):
        assert "./deploy/nats:/etc/nats:ro" in svc[name]["volumes"] and "healthcheck" in svc[name]
        assert svc[name]["command"] == ["-c", f"/etc/nats/{name}.conf"]  # with accounts.conf beside it
    for name in ("crawler", "filter", "classifier", "builder", "evaluator"):  # each its own identity
        assert svc[name]["environment"]["CPPPERF_BUS_CREDS"] == f"/run/secrets/{name}"
        assert svc[name]["secrets"] == [name]
        assert compose["secrets"][name]["file"] == f"./deploy/nats/creds/{name}.creds"
    gpu = svc["vllm-model-1"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]
    for name, service in svc.items():  # no host root from a container, nothing published
        assert not any("docker.sock" in str(v) for v in service.get("volumes", [])), name
        assert "DOCKER_HOST" not in (service.get("environment") or {}), name
        assert not service.get("ports"), name
        assert not service.get("privileged"), name
    for name in ("builder", "evaluator"):  # the jail runs in the service image itself
        assert svc[name]["environment"]["CPPPERF_BUILDER_BACKEND"] == "local"
    assert "bubblewrap" in (ROOT / "deploy" / "Dockerfile").read_text()
    assert {"nats-1", "nats-2", "nats-3", "dataset"} <= set(compose["volumes"])
    assert (ROOT / "deploy" / "Dockerfile").read_text().count('ENTRYPOINT ["cppperf"]') == 1


def test_admin_provisions_before_any_service_starts(compose: dict[str, Any]) -> None:
    svc = compose["services"]
    provision = svc["provision"]
    assert provision["command"] == ["bus", "provision"] and provision["restart"] == "no"
    assert provision["environment"]["CPPPERF_BUS_CREDS"] == "/run/secrets/admin"
    assert provision["secrets"] == ["admin"]
    assert compose["secrets"]["admin"]["file"] == "./deploy/nats/creds/admin.creds"
    for name in ("crawler", "filter", "classifier", "builder", "evaluator"):
        assert svc[name]["depends_on"]["provision"] == {"condition": "service_completed_successfully"}, name
        assert "admin" not in svc[name]["secrets"], name


def test_every_setting_passed_is_read_by_the_code(compose: dict[str, Any]) -> None:
    known = env_names()
    seen = set()
    for name, svc in compose["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if key.startswith("CPPPERF_") and not key.startswith("CPPPERF_MODEL_"):
                assert key in known, f"{name}: {key} is not a setting"
                seen.add(key)
                if "${" not in str(value):  # literal values must also parse into the setting's type
                    load_settings(env={key: str(value)})
    assert {
        "CPPPERF_NATS_URL",
        "CPPPERF_BUS_REPLICAS",
        "CPPPERF_CLASSIFIER_BASE_URLS",
        "CPPPERF_BUILDER_BACKEND",
    } <= seen
    url = compose["services"]["builder"]["environment"]["CPPPERF_NATS_URL"]
    assert url.count("nats://") == 3  # the seed list names every node


@pytest.mark.nats
@pytest.mark.slow
def test_nats_configs_form_a_replicated_cluster(tmp_path: Path) -> None:
    from cppperf.agents import service_keys

    ports = {i: (free_port(), free_port()) for i in (1, 2, 3)}
    for name in ("accounts.conf", "agents.conf"):
        (tmp_path / name).write_text((ROOT / "deploy" / "nats" / name).read_text())
    env = {**os.environ, **service_keys(tmp_path / "creds")}
    procs = []
    try:
        for i in (1, 2, 3):
            conf = tmp_path / f"nats-{i}.conf"
            conf.write_text(cluster_node_config(i, ports, tmp_path))
            check = subprocess.run(
                [find_nats_server(), "-t", "-c", str(conf)],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            assert check.returncode == 0, check.stderr
            procs.append(
                subprocess.Popen(
                    [find_nats_server(), "-c", str(conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        url = ",".join(f"nats://127.0.0.1:{ports[i][0]}" for i in (1, 2, 3))
        settings = load_settings(
            env={"CPPPERF_BUS_REPLICAS": "3", "CPPPERF_BUS_CREDS": str(tmp_path / "creds" / "admin.creds")}
        )

        async def scenario() -> tuple[int, int]:
            deadline = time.monotonic() + 60
            while True:
                bus = await Bus.connect(url, settings.bus)
                try:
                    await provision_all(bus)  # `cppperf bus provision`; needs the meta leader
                    break
                except Exception:
                    await bus.close()
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(1)
            await bus.publish(m.REPO_FOUND, m.RepoFound(repo="a/b", url="x"))
            info = await bus.js.stream_info("REPO_FOUND")
            await bus.close()
            return info.config.num_replicas or 0, len(info.cluster.replicas or []) if info.cluster else 0

        replicas, peers = asyncio.run(scenario())
        assert replicas == 3 and peers == 2
        bad = subprocess.run(
            [
                sys.executable,
                "-c",
                "import asyncio, nats; asyncio.run(nats.connect("
                f"'nats://cppperf:wrong@127.0.0.1:{ports[1][0]}', allow_reconnect=False, connect_timeout=2))",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert bad.returncode != 0 and re.search("uthoriz", bad.stderr)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
