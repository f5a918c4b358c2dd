"""The Kubernetes manifests (deploy/k8s) as the tests read them: the base's files as written, each
overlay rendered by `kubectl kustomize` (the tests that need it are skipped, saying why, without
kubectl), and lookups into the rendered objects."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "production")
CORE_NS, BUILD_NS = "cppperf", "cppperf-build"
WORKLOADS = ("Deployment", "StatefulSet", "CronJob", "Job")


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def base_resources() -> list[dict[str, Any]]:
    """Every object written in deploy/k8s/base (all folders), before kustomize."""
    return [
        d
        for p in sorted((K8S / "base").rglob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in docs_of(p.read_text())
    ]


def render_text(path: Path) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (Debian: apt-get install kubernetes-client; CI machines have it)")
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render(overlay: str) -> list[dict[str, Any]]:
    return docs_of(render_text(K8S / "overlays" / overlay))


def find(docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    for d in docs:
        meta = d["metadata"]
        if d["kind"] == kind and meta["name"] == name and namespace in (None, meta.get("namespace")):
            return d
    raise AssertionError(f"no {kind}/{name}" + (f" in {namespace}" if namespace else ""))


def pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        template: dict[str, Any] = obj["spec"]["jobTemplate"]["spec"]["template"]
        return template
    return dict(obj["spec"]["template"])


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(pod_template(obj)["spec"])


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in WORKLOADS]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def settings_of(docs: list[dict[str, Any]], obj: dict[str, Any]) -> dict[str, str]:
    """The cppperf-env ConfigMap the workload's first container reads, from its own namespace."""
    container = pod_spec(obj)["containers"][0]
    name = container["envFrom"][0]["configMapRef"]["name"]
    data: dict[str, str] = find(docs, "ConfigMap", name, obj["metadata"]["namespace"])["data"]
    return data


def mounted_file(spec: dict[str, Any], container: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """(the volume, the key inside it) that puts a file at `path` in the container."""
    for m in container.get("volumeMounts", []):
        prefix = m["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            volume = next(v for v in spec["volumes"] if v["name"] == m["name"])
            return volume, path[len(prefix) :]
    raise AssertionError(f"nothing mounted at {path}")
