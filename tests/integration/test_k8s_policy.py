"""Pod Security and network policy of deploy/k8s, checked offline.

The policy tool is checkov (pinned in .ci/run, which installs it into its own venv `.venv-k8s` so
the main venv's pins stay as they are): its Kubernetes checks map onto the Pod Security Standards'
`restricted` controls (root, uid, capabilities, privilege escalation, seccomp, host namespaces,
read-only root, service-account tokens, resources, NetworkPolicy per pod), plus our checkov
policies for the baseline controls it has no check for (deploy/k8s/policies: hostPath, /proc
mount, AppArmor). The base and each overlay are rendered and scanned whole; every check must pass
on every resource except the named exceptions: the per-resource `checkov.io/skipN` annotations,
allowed on the builder and evaluator only, and the skips for every resource listed in
deploy/k8s/policy-exceptions.yaml (only the image digest check). A mutated copy of a restricted
pod shows each check fails when its property is broken. Without checkov the scans are skipped,
saying so; .ci/run always installs it.

NetworkPolicies: checkov only checks that a policy selects each pod; who may reach which port is
asserted here against the rendered policies (`allowed`: the NetworkPolicy rules for label and
namespace selectors and ports)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s_manifests import (
    BUILD_NS,
    CORE_NS,
    K8S,
    OVERLAYS,
    ROOT,
    WORKLOADS,
    docs_of,
    env_of,
    find,
    pod_spec,
    pod_template,
    render,
    render_text,
    settings_of,
    workloads,
)

EXCEPTIONS = yaml.safe_load((K8S / "policy-exceptions.yaml").read_text())
JAILED = {"builder", "evaluator"}
# What the builder's and evaluator's annotations skip (base/builders/builders.yaml says why):
# seccomp and AppArmor unconfined, /proc unmasked for bwrap; the lease dir's hostPath; no CPU limit.
JAIL_EXCEPTIONS = {"CKV_K8S_31", "CKV2_CPPPERF_3", "CKV2_CPPPERF_2", "CKV2_CPPPERF_1", "CKV_K8S_11"}
RENDERINGS = ("base", *OVERLAYS)
# the annotation names checkov reads as skips (any key containing one: checkov/kubernetes/kubernetes_utils.py)
SKIP_PREFIXES = ("checkov.io/skip", "bridgecrew.io/skip", "cortex.io/skip")


def checkov_path() -> str:
    local = ROOT / ".venv-k8s" / "bin" / "checkov"
    found = str(local) if local.exists() else shutil.which("checkov")
    if found is None:
        pytest.skip(
            f"checkov not installed: .ci/run installs it (python3 -m venv .venv-k8s && "
            f".venv-k8s/bin/pip install checkov=={EXCEPTIONS['checkov']})"
        )
    return found


def run_checkov(folder: Path, *, checks: list[str] | None = None) -> dict[str, Any]:
    """checkov's report on every manifest in `folder`: its Kubernetes checks and ours, minus the
    checks skipped everywhere (policy-exceptions.yaml)."""
    argv = [checkov_path(), "-d", str(folder), "--framework", "kubernetes", "-o", "json", "--skip-download"]
    argv += ["--external-checks-dir", str(K8S / "policies")]
    argv += (
        ["--check", ",".join(checks)] if checks else ["--skip-check", ",".join(EXCEPTIONS["skip_everywhere"])]
    )
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=240)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: some check failed
    report: dict[str, Any] = json.loads(proc.stdout)
    assert report["check_type"] == "kubernetes" and report["summary"]["parsing_errors"] == 0
    return report


@dataclass(frozen=True)
class Finding:
    check: str
    kind: str
    namespace: str
    name: str
    reason: str


def findings(report: dict[str, Any], outcome: str) -> list[Finding]:
    """`outcome`: failed_checks, passed_checks or skipped_checks. A pod template's graph checks
    name it `Pod.<namespace>.<name>.<labels…>`; the others `<Kind>.<namespace>.<name>`."""
    out = []
    for r in report["results"].get(outcome, []):
        kind, namespace, name = r["resource"].split(".")[:3]
        reason = (r.get("check_result") or {}).get("suppress_comment", "")
        out.append(Finding(r["check_id"], kind, namespace, name, reason))
    return out


@dataclass(frozen=True)
class Scan:
    name: str
    docs: list[dict[str, Any]]
    report: dict[str, Any]


@pytest.fixture(scope="module", params=RENDERINGS)
def scan(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Scan:
    name = str(request.param)
    text = render_text(K8S / "base" if name == "base" else K8S / "overlays" / name)
    folder = tmp_path_factory.mktemp(f"render-{name}")
    (folder / "rendered.yaml").write_text(text)
    return Scan(name, docs_of(text), run_checkov(folder))


@pytest.mark.slow
def test_every_check_passes_but_the_named_exceptions(scan: Scan) -> None:
    failed = findings(scan.report, "failed_checks")
    assert failed == [], "\n".join(f"{f.check} {f.kind}/{f.namespace}/{f.name}" for f in failed)
    passed = findings(scan.report, "passed_checks")
    # the scan saw every workload, with the Pod Security checks among what passed
    assert {f.name for f in passed} >= {d["metadata"]["name"] for d in workloads(scan.docs)}
    ids = {f.check for f in passed}
    for check in ("CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_38"):
        assert check in ids  # no privilege escalation, read-only root, non-root, no caps, no token
    assert {"CKV2_K8S_6", "CKV2_CPPPERF_1", "CKV2_CPPPERF_2", "CKV2_CPPPERF_3"} <= ids


@pytest.mark.slow
def test_the_named_exceptions_are_the_jailed_pods_only(scan: Scan) -> None:
    """Every pod of namespace cppperf passes `restricted` with no skip; the builder and evaluator
    skip exactly the named exceptions, each with its reason."""
    skipped = findings(scan.report, "skipped_checks")
    assert {(f.namespace, f.name) for f in skipped} == {(BUILD_NS, n) for n in JAILED}
    for name in JAILED:
        assert {f.check for f in skipped if f.name == name} == JAIL_EXCEPTIONS
    for f in skipped:
        assert len(f.reason) > 30 and f.reason != "No comment provided", f
    # and in the manifests: skip annotations on these two Deployments and nowhere else
    annotated = {
        (d["kind"], d["metadata"]["name"])
        for d in scan.docs
        for meta in (d["metadata"], pod_template(d)["metadata"] if d["kind"] in WORKLOADS else {})
        if any(p in k for k in (meta.get("annotations") or {}) for p in SKIP_PREFIXES)
    }
    assert annotated == {("Deployment", n) for n in JAILED}


def test_only_the_digest_check_is_skipped_everywhere() -> None:
    """Skips for every resource could hide a failure anywhere: only the image digest one (no
    registry to resolve digests here), with its reason; the version is the one .ci/run pins."""
    assert set(EXCEPTIONS["skip_everywhere"]) == {"CKV_K8S_43"}
    assert all(len(reason) > 40 for reason in EXCEPTIONS["skip_everywhere"].values())
    pin = re.search(r"checkov==([\d.]+)", (ROOT / ".ci" / "run").read_text())
    assert pin is not None and pin.group(1) == EXCEPTIONS["checkov"]


# One way to break each hardening property (where: the changed fields), and the check that must
# then fail.
BREAKS: dict[str, tuple[str, dict[str, Any]]] = {
    "CKV_K8S_23": ("pod", {"runAsNonRoot": False, "runAsUser": 0}),
    "CKV_K8S_40": ("pod", {"runAsUser": 1000}),
    "CKV_K8S_20": ("container", {"allowPrivilegeEscalation": True}),
    "CKV_K8S_22": ("container", {"readOnlyRootFilesystem": False}),
    "CKV_K8S_37": ("container", {"capabilities": {"add": ["NET_ADMIN"]}}),
    "CKV_K8S_39": ("container", {"capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}}),
    "CKV_K8S_31": ("pod", {"seccompProfile": {"type": "Unconfined"}}),
    "CKV_K8S_38": ("spec", {"automountServiceAccountToken": True}),
    "CKV_K8S_16": ("container", {"privileged": True}),
    "CKV_K8S_11": ("resources", {"limits": {"memory": "1Gi"}}),
    "CKV2_CPPPERF_1": ("spec", {"volumes": [{"name": "host", "hostPath": {"path": "/var/lib"}}]}),
    "CKV2_CPPPERF_2": ("container", {"procMount": "Unmasked"}),
    "CKV2_CPPPERF_3": ("pod", {"appArmorProfile": {"type": "Unconfined"}}),
}


def _broken(dep: dict[str, Any], check: str) -> dict[str, Any]:
    out = copy.deepcopy(dep)
    out["metadata"]["name"] = name = f"filter-{check.lower().replace('_', '-')}"
    out["spec"]["selector"]["matchLabels"] = out["spec"]["template"]["metadata"]["labels"] = {"x": name}
    spec = out["spec"]["template"]["spec"]
    scope, changes = BREAKS[check]
    container = spec["containers"][0]
    target = {
        "pod": spec["securityContext"],
        "spec": spec,
        "container": container["securityContext"],
        "resources": container["resources"],
    }[scope]
    target.update(changes)
    return out


@pytest.mark.slow
def test_each_check_fails_when_its_property_is_broken(tmp_path: Path) -> None:
    dep = find(render("production"), "Deployment", "filter")
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump_all([_broken(dep, c) for c in BREAKS]))
    report = run_checkov(tmp_path, checks=sorted(BREAKS))
    failed = {(f.check, f.name) for f in findings(report, "failed_checks")}
    for check in BREAKS:
        assert (check, f"filter-{check.lower().replace('_', '-')}") in failed, check


def test_namespaces_carry_their_pod_security_level() -> None:
    docs = render("production")
    labels = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs if d["kind"] == "Namespace"}
    psa = "pod-security.kubernetes.io/"
    for ns in (CORE_NS, BUILD_NS):  # audited and warned at restricted everywhere
        assert labels[ns][psa + "audit"] == labels[ns][psa + "warn"] == "restricted"
    assert labels[CORE_NS][psa + "enforce"] == "restricted"
    assert labels[BUILD_NS][psa + "enforce"] == "privileged"  # the jail's named exceptions


def test_the_jail_exceptions_come_with_a_user_namespace() -> None:
    """An unmasked /proc and unconfined seccomp only in pods with their own user namespace, and
    never a capability: bwrap runs unprivileged (no SYS_ADMIN)."""
    for d in workloads(render("production")):
        spec = pod_spec(d)
        unmasked = any(c["securityContext"].get("procMount") == "Unmasked" for c in spec["containers"])
        unconfined = spec["securityContext"]["seccompProfile"]["type"] != "RuntimeDefault"
        assert unmasked == unconfined == (d["metadata"]["name"] in JAILED), d["metadata"]["name"]
        if unmasked:
            assert spec["hostUsers"] is False
        for c in spec["containers"]:
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_every_path_a_service_writes_is_a_volume() -> None:
    """The root file system is read-only: /tmp, HOME and each data directory a service uses are
    mounted volumes."""
    docs = render("production")
    dirs = {
        "crawler": ["CPPPERF_MINING_MIRROR_DIR"],
        "filter": ["CPPPERF_MINING_MIRROR_DIR", "CPPPERF_HEALTH_DIR"],
        "classifier": ["CPPPERF_HEALTH_DIR"],
        "builder": [
            "CPPPERF_MINING_MIRROR_DIR",
            "CPPPERF_BUILDER_WORK_DIR",
            "CPPPERF_OUT_DIR",
            "CPPPERF_HEALTH_DIR",
        ],
        "evaluator": [
            "CPPPERF_MINING_MIRROR_DIR",
            "CPPPERF_BUILDER_WORK_DIR",
            "CPPPERF_OUT_DIR",
            "CPPPERF_EVALUATOR_RUNS_DIR",
            "CPPPERF_HEALTH_DIR",
            "CPPPERF_BUILDER_LEASE_DIR",
        ],
    }
    for name, needed in dirs.items():
        d = next(w for w in workloads(docs) if w["metadata"]["name"] == name)
        c = pod_spec(d)["containers"][0]
        settings = settings_of(docs, d) | {k: e["value"] for k, e in env_of(c).items() if "value" in e}
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert settings["HOME"] == "/tmp" and "/tmp" in mounts, name
        for key in needed:
            assert settings[key] in mounts, (name, key)
    for d in workloads(docs):
        for c in pod_spec(d)["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True


# NetworkPolicies --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e  # the only operator the manifests use
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def _peer_matches(peer: dict[str, Any], policy_ns: str, other: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # pods are in the cluster's ranges, which every ipBlock here excepts
    ns_sel = peer.get("namespaceSelector")
    in_ns = (
        other.namespace == policy_ns
        if ns_sel is None
        else _matches(ns_sel, {"kubernetes.io/metadata.name": other.namespace})
    )
    return in_ns and _matches(peer.get("podSelector", {}), other.labels)


def _direction_allows(
    policies: list[dict[str, Any]], subject: Pod, other: Pod, port: int, direction: str
) -> bool:
    """NetworkPolicy semantics: if no policy of this direction selects `subject`, allowed; else
    allowed when some rule of a selecting policy admits `other` on `port`."""
    field, peers = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == subject.namespace
        and direction in p["spec"]["policyTypes"]
        and _matches(p["spec"]["podSelector"], subject.labels)
    ]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get(field, []):
            port_ok = "ports" not in rule or any(pp.get("port") == port for pp in rule["ports"])
            peer_ok = peers not in rule or any(
                _peer_matches(x, subject.namespace, other) for x in rule[peers]
            )
            if port_ok and peer_ok:
                return True
    return False


def allowed(docs: list[dict[str, Any]], src: Pod, dst: Pod, port: int) -> bool:
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return _direction_allows(policies, src, dst, port, "Egress") and _direction_allows(
        policies, dst, src, port, "Ingress"
    )


@pytest.fixture(scope="module")
def network() -> Iterator[tuple[list[dict[str, Any]], dict[str, Pod]]]:
    docs = render("production")
    pods = {
        d["metadata"]["name"]: Pod(d["metadata"]["namespace"], pod_template(d)["metadata"]["labels"])
        for d in workloads(docs)
    }
    yield docs, pods


def test_nats_client_port_only_from_cppperf_bus_clients(
    network: tuple[list[dict[str, Any]], dict[str, Pod]],
) -> None:
    docs, pods = network
    nats = pods["nats"]
    for client in ("crawler", "filter", "classifier", "builder", "evaluator"):
        assert allowed(docs, pods[client], nats, 4222), client
    assert not allowed(docs, pods["vllm-model-1"], nats, 4222)  # a cppperf pod, but no bus client
    # the same label from a namespace that is not cppperf's, or no label in cppperf's
    assert not allowed(docs, Pod("default", pods["filter"].labels), nats, 4222)
    assert not allowed(docs, Pod(CORE_NS, {"app.kubernetes.io/name": "debug"}), nats, 4222)
    # the NetworkPolicy selects the NATS pods and names the bus-client label
    policy = find(docs, "NetworkPolicy", "nats", CORE_NS)
    assert _matches(policy["spec"]["podSelector"], nats.labels)
    client_rule = next(
        r for r in policy["spec"]["ingress"] if r["ports"] == [{"protocol": "TCP", "port": 4222}]
    )
    assert [p["podSelector"] for p in client_rule["from"]] == [{"matchLabels": {"cppperf.io/bus": "client"}}]


def test_routes_between_nats_pods_only_and_the_monitor_from_nobody(
    network: tuple[list[dict[str, Any]], dict[str, Pod]],
) -> None:
    docs, pods = network
    nats = pods["nats"]
    assert allowed(docs, nats, nats, 6222)
    for name in pods:
        assert not allowed(docs, pods[name], nats, 8222), name
        if name != "nats":
            assert not allowed(docs, pods[name], nats, 6222), name


def test_vllm_only_from_the_classifier_and_nothing_into_the_build_pods(
    network: tuple[list[dict[str, Any]], dict[str, Pod]],
) -> None:
    docs, pods = network
    for vllm in ("vllm-model-1", "vllm-model-2"):
        assert allowed(docs, pods["classifier"], pods[vllm], 8000)
        for other in ("filter", "crawler", "builder", "evaluator", "nats"):
            assert not allowed(docs, pods[other], pods[vllm], 8000), (other, vllm)
    for jailed in JAILED:
        for other in pods:
            for port in (22, 80, 443, 4222, 8000):
                assert not allowed(docs, pods[other], pods[jailed], port), (other, jailed, port)


def test_every_pod_is_denied_by_default_and_https_leaves_only_where_labelled(
    network: tuple[list[dict[str, Any]], dict[str, Pod]],
) -> None:
    docs, pods = network
    for ns in (CORE_NS, BUILD_NS):
        deny = find(docs, "NetworkPolicy", "default-deny", ns)["spec"]
        assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    out = {n for n, p in pods.items() if p.labels.get("cppperf.io/egress") == "https"}
    assert out == {"crawler", "filter", "builder", "evaluator", "vllm-model-1", "vllm-model-2"}
    for ns in (CORE_NS, BUILD_NS):
        rule = find(docs, "NetworkPolicy", "https-out", ns)["spec"]["egress"]
        assert rule[0]["ports"] == [{"protocol": "TCP", "port": 443}]
        v4 = rule[0]["to"][0]["ipBlock"]
        assert v4["cidr"] == "0.0.0.0/0" and {"10.0.0.0/8", "169.254.0.0/16"} <= set(v4["except"])


# The exceptions against the real image ---------------------------------------------------------
@pytest.mark.docker
@pytest.mark.slow
def test_the_jail_works_in_the_build_pods_context_and_needs_each_exception() -> None:
    """deploy/k8s/jail-check.sh: the service image's jail under the builder pod's security context
    (uid 10001, no capabilities, no-new-privileges, read-only root, own user namespace) probes and
    compiles; without the seccomp or the /proc exception bwrap fails."""
    image = "cppperf/service:latest"
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("podman not installed (.ci/run installs it)")
    if subprocess.run([podman, "image", "exists", image], check=False).returncode != 0:
        pytest.skip(f"no {image} image here (docker compose build, or podman build -f deploy/Dockerfile .)")
    conf = Path(os.environ.get("CPPPERF_ENGINE_DIR", "/tmp/cppperf-engine")) / "containers.conf"
    env = {**os.environ, **({"CONTAINERS_CONF": str(conf)} if conf.exists() else {})}  # .ci/run's engine
    proc = subprocess.run(
        [str(K8S / "jail-check.sh"), image], capture_output=True, text=True, check=False, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("as expected") == 4
