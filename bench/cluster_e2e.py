"""The deployed topology end to end on this machine (README: "The cluster end to end").

What docker-compose.yml describes, as processes: three NATS nodes clustered (JetStream, routes)
from the shipped deploy/nats/nats-N.conf + accounts.conf + agents.conf (only ports, the monitor
port, route addresses and store dirs rewritten, never the permissions), the services' NKeys from
`cppperf agents service-keys`, and every service as its own `cppperf serve SERVICE` process with
the environment compose gives it (paths under /data moved to a temp folder, the seed file at
CPPPERF_BUS_CREDS as the compose secret is, GitHub at a local fake, the classifier's vLLM
replaced by the heuristic: no GPU here). It mines the demo repository (and, with --repo, any
local clone), kills the NATS node leading the builder's queue while the builder works, then an
external agent process (`cppperf evaluate --nats-url … --creds`, an agent made by
`cppperf agents add`) evaluates the expert's patch and an empty one over the bus. Every log
line, output file and store record is then searched for the run's secrets.

    .venv/bin/python bench/cluster_e2e.py [--repo /tmp/bvh --since 2025-01-01] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cppperf.demo import create_demo_repo
from cppperf.shared.bus import Bus
from cppperf.shared.embedded import find_nats_server, free_port
from cppperf.shared.settings import load_settings
from cppperf.shared.store import BUCKETS, Store
from tests.fake_github import FakeGitHub

DEPLOY = ROOT / "deploy" / "nats"
CLI = [sys.executable, "-m", "cppperf"]
CONSUMERS = ("filter", "classifier", "builder", "evaluator")  # long-running; the crawler is one-shot
NODES = (1, 2, 3)


def cluster_node_config(i: int, ports: dict[int, tuple[int, int]], store: Path) -> str:
    """deploy/nats/nats-<i>.conf on loopback: its client and route ports, no monitor port, its
    store dir and the routes' host names; everything else (accounts, permissions) as shipped."""
    text = (DEPLOY / f"nats-{i}.conf").read_text()
    client, route = ports[i]
    text = text.replace("listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{client}")
    text = text.replace("http: 0.0.0.0:8222", "")
    text = text.replace("listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{route}")
    text = text.replace("/data/jetstream", str(store / f"n{i}"))
    for j, (_c, r) in ports.items():
        text = text.replace(f"//nats-{j}:6222", f"//127.0.0.1:{r}")
    return text


@dataclass
class Secrets:
    """Everything secret this run hands out: the NKey seeds, a GitHub token, an API key."""

    seeds: dict[str, str]  # who -> NKey seed
    github_token: str = field(default_factory=lambda: "ghp_e2e" + secrets.token_hex(16))
    api_key: str = field(default_factory=lambda: "sk-e2e" + secrets.token_hex(16))

    def forms(self) -> dict[str, str]:
        """Each secret as it could leak: raw, URL-encoded, embedded in a URL's userinfo, base64."""
        raw = {**{f"seed:{k}": v for k, v in self.seeds.items()}, "github": self.github_token}
        raw["api_key"] = self.api_key
        found: dict[str, str] = {}
        for name, value in raw.items():
            found[name] = value
            found[f"{name}:url"] = f"x-access-token:{quote(value, safe='')}@"
            found[f"{name}:b64"] = base64.b64encode(value.encode()).decode()[:-4]
        return found


@dataclass
class Result:
    root: str
    timings: dict[str, float] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)  # stream / bucket -> num_replicas
    killed_node: str = ""
    killed_while: str = ""
    instances: dict[str, str] = field(default_factory=dict)  # id -> verdict
    funnel: dict[str, Any] = field(default_factory=dict)
    dead_letters: list[str] = field(default_factory=list)
    agent: dict[str, str] = field(default_factory=dict)  # model -> verdict
    agent_opt: dict[str, bool] = field(default_factory=dict)
    agent_exit: int = -1
    service_exits: dict[str, int] = field(default_factory=dict)
    provisioned_by: str = "services"
    secret_hits: list[str] = field(default_factory=list)  # "<file>: <secret name>"
    control_hits: int = 0  # the same search in the creds folder (must find the seeds)
    github_calls_with_token: int = 0  # requests the fake GitHub got carrying the run's token
    searched_files: int = 0
    searched_bytes: int = 0


class Cluster:
    """Three NATS nodes from the shipped configs, their logs under ROOT/logs."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.ports = {i: (free_port(), free_port()) for i in NODES}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for i in NODES:
            (root / "conf" / f"nats-{i}.conf").write_text(
                cluster_node_config(i, self.ports, root / "jetstream")
            )

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{self.ports[i][0]}" for i in NODES)

    def start(self, i: int) -> None:
        conf = self.root / "conf" / f"nats-{i}.conf"
        check = subprocess.run(
            [find_nats_server(), "-t", "-c", str(conf)],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if check.returncode != 0:
            raise RuntimeError(f"nats-{i}.conf: {check.stderr.strip()}")
        with (self.root / "logs" / f"nats-{i}.log").open("ab") as log:
            self.procs[i] = subprocess.Popen(
                [find_nats_server(), "-c", str(conf)], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(timeout=10)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=20)


def base_env(root: Path) -> dict[str, str]:
    """A container's environment: a PATH, a HOME of its own, nothing of this shell's."""
    home = root / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}


def compose_env(
    service: str, *, root: Path, url: str, creds: Path, github: str, keys: Secrets, extra: dict[str, str]
) -> dict[str, str]:
    """The `environment:` docker-compose.yml gives SERVICE, mapped onto this machine: /data to
    ROOT/data, the secret file to its creds, /leases to the host's lease dir, each container's own
    health dir; the GitHub token and API key are this run's secrets."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env: dict[str, str] = {}
    for key, value in compose["services"][service]["environment"].items():
        text = str(value)
        text = text.replace("/data/", f"{root / 'data'}/")
        if key == "CPPPERF_NATS_URL":
            text = url
        elif key == "CPPPERF_BUS_CREDS":
            text = str(creds)
        elif key == "CPPPERF_BUILDER_LEASE_DIR":  # the host's pool, as compose mounts it: this
            # shell's (a test run's own), else the host default
            text = os.environ.get("CPPPERF_BUILDER_LEASE_DIR") or "/tmp/cppperf-leases"  # noqa: S108
        elif key == "CPPPERF_HEALTH_DIR":
            text = str(root / "health" / service)
        elif key == "CPPPERF_GITHUB_TOKENS":
            text = keys.github_token
        env[key] = text
    if service == "classifier":  # no GPU, no vLLM here: the rules
        env["CPPPERF_CLASSIFIER_BACKEND"] = "heuristic"
        env["CPPPERF_CLASSIFIER_API_KEY"] = keys.api_key
        for k in ("CPPPERF_CLASSIFIER_MODELS", "CPPPERF_CLASSIFIER_BASE_URLS"):
            env.pop(k, None)
    return {**base_env(root), **env, "CPPPERF_GITHUB_API_URL": github, **extra}


def cli(*args: str, env: dict[str, str], log: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    with log.open("a") as f:
        f.write(f"$ cppperf {' '.join(args)}  (exit {proc.returncode})\n{proc.stdout}{proc.stderr}\n")
    return proc


def make_keys(root: Path) -> tuple[dict[str, str], Secrets]:
    """The services' NKeys (`cppperf agents service-keys`) and agent alice (`cppperf agents add`)."""
    conf = root / "conf"
    for name in ("accounts.conf", "agents.conf"):
        shutil.copyfile(DEPLOY / name, conf / name)
    env = base_env(root)
    keys = cli("agents", "service-keys", "--out", str(conf / "creds"), env=env, log=root / "logs" / "cli.log")
    if keys.returncode != 0:
        raise RuntimeError(f"agents service-keys: {keys.stderr.strip()}")
    nkeys = dict(line.split("=", 1) for line in keys.stdout.split() if line.startswith("NKEY_"))
    agent = root / "agent" / "alice.creds"
    added = cli(
        "agents",
        "add",
        "alice",
        "--config",
        str(conf / "agents.conf"),
        "--creds",
        str(agent),
        env=env,
        log=root / "logs" / "cli.log",
    )
    if added.returncode != 0:
        raise RuntimeError(f"agents add: {added.stderr.strip()}")
    seeds = {p.stem: _seed(p) for p in [*sorted((conf / "creds").glob("*.creds")), agent]}
    return {**env, **nkeys}, Secrets(seeds=seeds)


def _seed(creds: Path) -> str:
    mt = re.search(r"^seed: (\S+)$", creds.read_text(), re.MULTILINE)
    assert mt, creds
    return mt.group(1)


async def admin_bus(url: str, creds: Path) -> Bus:
    settings = load_settings(env={"CPPPERF_BUS_CREDS": str(creds), "CPPPERF_BUS_REPLICAS": "3"})
    return await Bus.connect(url, settings.bus, name="e2e-admin")


async def wait_cluster(url: str, creds: Path, timeout: float = 90) -> None:
    """Until the cluster has a JetStream meta leader (account info answers)."""
    deadline = time.monotonic() + timeout
    bus = await admin_bus(url, creds)
    try:
        while True:
            try:
                await bus.js.account_info()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await bus.close()


def provision_verb(env: dict[str, str]) -> bool:
    """Whether this cppperf has the admin-only `cppperf bus provision` verb."""
    return (
        subprocess.run(
            [*CLI, "bus", "provision", "--help"], env=env, capture_output=True, check=False
        ).returncode
        == 0
    )


class Services:
    """`cppperf serve SERVICE` processes, each logging to ROOT/logs/SERVICE.log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, env: dict[str, str]) -> None:
        with (self.root / "logs" / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [*CLI, "serve", name], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
            )

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if name != "crawler" and p.poll() is not None:
                tail = (self.root / "logs" / f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"serve {name} exited {p.returncode}:\n{tail}")

    def stop(self, timeout: float = 90) -> dict[str, int]:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = p.wait()
        return codes


def wait_healthy(services: Services, envs: dict[str, dict[str, str]], timeout: float = 120) -> None:
    """The image's health check (`cppperf health SERVICE --max-age 60`) passes for each service."""
    deadline = time.monotonic() + timeout
    for name in CONSUMERS:
        while True:
            services.check_alive()
            res = subprocess.run(
                [*CLI, "health", name, "--max-age", "60"], env=envs[name], capture_output=True, check=False
            )
            if res.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} never became healthy: {res.stdout!r} {res.stderr!r}")
            time.sleep(0.5)


async def filter_summaries_visible(store: Store, *, timeout: float) -> None:
    """Wait (bounded) until every repository record that got past the crawler shows the filter's
    summary. KV reads are direct gets, which a follower may serve from its own copy before it has
    applied the last writes: a funnel read right after the drain once missed the filter's last
    write (selected 0; the dump a moment later had it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        repos = await store.all("repos")
        if all(r.get("filter") for r in repos if r.get("stage") != "rejected"):
            return
        await asyncio.sleep(0.5)


async def mine_and_kill(
    cluster: Cluster, services: Services, creds: Path, result: Result, *, kill: bool, timeout: float
) -> None:
    """Wait for the builder's queue to carry work, kill the NATS node that leads it, wait until
    every queue is drained; then read the replicas, the records and the dead letters."""
    from cppperf.funnel import compute_funnel
    from cppperf.shared.bus import NOT_READY_ERRORS

    bus = await admin_bus(cluster.url, creds)
    start = time.monotonic()
    try:
        killed = not kill
        quiet = 0
        while quiet < 4:
            services.check_alive()
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"the pipeline did not drain within {timeout:.0f}s")
            try:
                if not killed:
                    info = await bus.js.stream_info("COMMIT_CLASSIFIED")
                    if info.state.messages and info.cluster and info.cluster.leader:
                        result.killed_node = info.cluster.leader
                        result.killed_while = (
                            f"COMMIT_CLASSIFIED held {info.state.messages} message(s) (builder proving)"
                        )
                        cluster.kill(int(result.killed_node.rsplit("-", 1)[1]))
                        result.timings["node_killed_at"] = round(time.monotonic() - start, 1)
                        killed = True
                        quiet = 0
                        continue
                services_done = services.procs["crawler"].poll() is not None
                quiet = quiet + 1 if services_done and await bus.drained() else 0
            except NOT_READY_ERRORS:  # the killed node led JetStream: a new meta leader comes
                quiet = 0
            await asyncio.sleep(1.0)
        result.timings["mine_s"] = round(time.monotonic() - start, 1)
        if kill and not killed:
            raise RuntimeError("the builder's queue never held work: no node was killed")
        for info in await bus.js.streams_info():
            result.replicas[info.config.name or "?"] = info.config.num_replicas or 0
        store = await Store.open(bus.js, replicas=3)
        await filter_summaries_visible(store, timeout=30)
        for rec in await store.all("instances"):
            result.instances[str(rec.get("id"))] = str(rec.get("verdict"))
        total, _per, _reasons = await compute_funnel(store)
        result.funnel = total.as_dict()
        result.dead_letters = [f"{d.letter.subject}: {d.letter.error}" for d in await bus.dead_letters()]
        dump = {b: await store.all(b) for b in BUCKETS}
        (cluster.root / "logs" / "store-dump.json").write_text(json.dumps(dump, default=str))
    finally:
        await bus.close()


def agent_evaluates(root: Path, url: str, instance: str, result: Result) -> None:
    """An external agent process: only its creds and the bus address, no access to /data. It
    sends the expert's patch (from the published record it was given) and an empty patch."""
    record = json.loads((root / "data" / "out" / "instances" / f"{instance}.json").read_text())
    patch = record["commit_info"]["patch"][0]
    agent_dir = root / "agent"
    preds = agent_dir / "preds.jsonl"
    rows = [
        {"instance_id": instance, "model_name_or_path": "expert", "model_patch": patch},
        {"instance_id": instance, "model_name_or_path": "empty", "model_patch": ""},
    ]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = base_env(root)
    start = time.monotonic()
    res = cli(
        "evaluate",
        "--predictions",
        str(preds),
        "--run-id",
        "e2e",
        "--nats-url",
        url,
        "--creds",
        str(agent_dir / "alice.creds"),
        "--out",
        str(agent_dir / "out"),
        "--json",
        env=env,
        log=root / "logs" / "agent.log",
        timeout=900,
    )
    result.timings["agent_s"] = round(time.monotonic() - start, 1)
    result.agent_exit = res.returncode
    if res.returncode != 0 and not res.stdout.strip():
        raise RuntimeError(f"the agent's evaluate failed: {res.stderr.strip()[-2000:]}")
    for rep in json.loads(res.stdout)["reports"]:
        result.agent[str(rep["model"])] = str(rep["verdict"])
        result.agent_opt[str(rep["model"])] = bool(rep.get("opt"))


def files_under(*dirs: Path) -> Iterator[Path]:
    for d in dirs:
        if d.is_dir():
            yield from (p for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def find_secrets(root: Path, keys: Secrets, *dirs: Path) -> tuple[list[str], int, int]:
    """("<file>: <secret form>" for every secret form found, files searched, bytes searched)."""
    forms = {k: v.encode() for k, v in keys.forms().items()}
    hits, files, size = [], 0, 0
    for path in files_under(*dirs):
        data = path.read_bytes()
        files, size = files + 1, size + len(data)
        hits += [f"{path.relative_to(root)}: {name}" for name, needle in forms.items() if needle in data]
    return hits, files, size


def grep_secrets(root: Path, keys: Secrets, result: Result) -> None:
    """Every log (services, nodes, CLI, agent), every file under /data (records, build logs,
    evaluation runs, work trees, mirrors), the agent's output, the heartbeats and the store's
    records (logs/store-dump.json); and, as a control, the creds folder, where the seeds are."""
    dirs = (root / "logs", root / "data", root / "agent" / "out", root / "health")
    result.secret_hits, result.searched_files, result.searched_bytes = find_secrets(root, keys, *dirs)
    result.control_hits = len(find_secrets(root, keys, root / "conf" / "creds")[0])


def run(
    root: Path,
    *,
    repos: list[str] | None = None,
    since: str = "2024-01-09",
    until: str = "2024-01-11",
    runs: int = 11,
    eval_runs: int = 5,
    kill: bool = True,
    timeout: float = 600,
) -> Result:
    """The whole check in ROOT (created); see the module docstring."""
    t0 = time.monotonic()
    for sub in ("conf", "logs", "data", "agent", "health"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    result = Result(root=str(root))
    if not shutil.which("bwrap"):
        raise RuntimeError("bubblewrap (bwrap) is not installed: the image has it, this machine must too")
    demo = create_demo_repo(root / "repos" / "demo", extra_kinds=False)
    server_env, keys = make_keys(root)
    cluster = Cluster(root, server_env)
    services = Services(root)
    creds = root / "conf" / "creds"
    try:
        with FakeGitHub([]) as github:
            for i in NODES:
                cluster.start(i)
            asyncio.run(wait_cluster(cluster.url, creds / "admin.creds"))
            result.timings["cluster_up_s"] = round(time.monotonic() - t0, 1)
            extra = {
                "CPPPERF_MINING_SINCE": since,
                "CPPPERF_MINING_UNTIL": until,
                "CPPPERF_BUILDER_RUNS": str(runs),
                "CPPPERF_EVALUATOR_RUNS": str(eval_runs),
            }
            envs = {
                name: compose_env(
                    name,
                    root=root,
                    url=cluster.url,
                    creds=creds / f"{name}.creds",
                    github=github.url,
                    keys=keys,
                    extra=extra,
                )
                for name in ("crawler", *CONSUMERS)
            }
            envs["crawler"]["CPPPERF_MINING_REPOS"] = ",".join([str(demo.path), *(repos or [])])
            admin_env = {**envs["filter"], "CPPPERF_BUS_CREDS": str(creds / "admin.creds")}
            if provision_verb(admin_env):
                prov = cli("bus", "provision", env=admin_env, log=root / "logs" / "cli.log")
                if prov.returncode != 0:
                    raise RuntimeError(f"bus provision: {prov.stderr.strip()}")
                result.provisioned_by = "cppperf bus provision (admin)"
            for name in CONSUMERS:
                services.start(name, envs[name])
            wait_healthy(services, envs)
            result.timings["services_healthy_s"] = round(time.monotonic() - t0, 1)
            services.start("crawler", envs["crawler"])
            asyncio.run(
                mine_and_kill(cluster, services, creds / "admin.creds", result, kill=kill, timeout=timeout)
            )
            result.service_exits["crawler"] = services.procs["crawler"].wait(timeout=10)
            perf = f"local__demo-{demo.shas['perf'][:12]}"
            if result.instances.get(perf) == "improved":
                agent_evaluates(root, cluster.url, perf, result)
            status = cli("status", "--json", env=admin_env, log=root / "logs" / "cli.log")
            result.timings["status_exit"] = status.returncode
            result.github_calls_with_token = sum(
                keys.github_token in (auth or "") for _p, auth in github.requests
            )
        result.service_exits.update(services.stop())
    finally:
        services.stop(timeout=30)
        cluster.stop()
    grep_secrets(root, keys, result)
    result.timings["total_s"] = round(time.monotonic() - t0, 1)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", action="append", default=[], help="also mine this local clone")
    ap.add_argument("--since", default="2024-01-09")
    ap.add_argument("--until", default="2024-01-11")
    ap.add_argument("--runs", type=int, default=11, help="the builder's rounds")
    ap.add_argument("--eval-runs", type=int, default=5, help="the evaluator's rounds")
    ap.add_argument("--no-kill", action="store_true", help="keep all three NATS nodes up")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the mining to drain")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temp one)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the `finally`s stop every process
    root = a.keep or Path(tempfile.mkdtemp(prefix="cppperf-e2e-"))
    result = run(
        root,
        repos=[str(Path(r).resolve()) for r in a.repo],
        since=a.since,
        until=a.until,
        runs=a.runs,
        eval_runs=a.eval_runs,
        kill=not a.no_kill,
        timeout=a.timeout,
    )
    print(json.dumps(asdict(result), indent=1) if a.json else _summary(result))
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    ok = (
        not result.secret_hits
        and not result.dead_letters
        and result.agent.get("expert") in {"opt", "correct"}
    )
    return 0 if ok else 1


def _summary(r: Result) -> str:
    lines = [
        f"timings: {r.timings}",
        f"replicas: {sorted(set(r.replicas.values()))} over {len(r.replicas)} streams",
        f"killed {r.killed_node or 'no node'} ({r.killed_while})",
        f"instances: {r.instances}",
        f"funnel: {r.funnel}",
        f"dead letters: {r.dead_letters or 'none'}",
        f"agent: {r.agent} (opt {r.agent_opt}, exit {r.agent_exit})",
        f"service exits: {r.service_exits}; streams provisioned by {r.provisioned_by}",
        f"secrets: {len(r.secret_hits)} hit(s) in {r.searched_files} files ({r.searched_bytes} bytes) {r.secret_hits[:10]}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
