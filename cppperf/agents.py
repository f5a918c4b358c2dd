"""NKey identities for the bus: `cppperf agents add|remove|list` and the services' keys.

An agent is an account of its own in `deploy/nats/agents.conf` (`agent_<name>`: one user, public
key only, with the permissions of `agent_permissions`, importing only its own API and
announcements) and a creds file the agent keeps (`name: agent-<n>` and `seed: SU…`). One account
per agent, not one shared account: NATS delivers a reply inside the requester's account on
whatever reply subject the requester chose, so in a shared account an agent could have the
evaluator answer into another agent's inbox or `eval.completed.<other>`. Services get one key each (`service_keys`): the public keys go to the servers'
environment (`NKEY_<SERVICE>`), the seeds to each service's creds file (a Secret).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import nkeys  # type: ignore[import-untyped]  # no stubs; two functions used

from cppperf.shared import messages as m
from cppperf.shared.bus import agent_inbox
from cppperf.shared.errors import BadInput
from cppperf.shared.files import write_atomic

SERVICE_USERS: Final = ("admin", "crawler", "filter", "classifier", "builder", "evaluator")
# reads this file's entries and those of the older one-shared-account format (rewritten on add/remove)
_ENTRY = re.compile(r"^\s*# agent (?P<name>\S+)\n[^\n]*?\{nkey: \"(?P<key>U[A-Z2-7]+)\"", re.MULTILINE)
_HEADER: Final = (
    "# The external agents, one NATS account each (`agent_<name>`, included inside accounts.conf's\n"
    "# `accounts` block): written by `cppperf agents add|remove` (public keys only: the seed is in the\n"
    "# agent's creds file). Reload the servers twice after a change (`nats-server --signal reload`: a new\n"
    "# account gets its imports only at the second reload), or restart the pods/containers.\n"
)


@dataclass(frozen=True)
class KeyPair:
    seed: str
    public: str


def new_key() -> KeyPair:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()
    public = nkeys.from_seed(seed.encode()).public_key.decode()
    return KeyPair(seed=seed, public=public)


def creds_text(name: str, seed: str) -> str:
    return (
        "# cppperf NATS credentials: an NKey seed. Keep it secret (chmod 600); never commit it.\n"
        f"name: {name}\nseed: {seed}\n"
    )


def write_creds(path: Path, name: str, seed: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(creds_text(name, seed))


def agent_permissions(name: str) -> str:
    """What an agent may do: call the evaluator's API on its own name, read its own inbox and
    its own announcements. Nothing else (no JetStream, no KV, no other agent's subjects)."""
    api = ", ".join(f'"{m.eval_api_subject(name, verb)}"' for verb in m.AGENT_VERBS)
    return (
        f"{{publish: {{allow: [{api}]}}, "
        f'subscribe: {{allow: ["{agent_inbox(name)}.>", "{m.eval_completed_subject(name)}"]}}}}'
    )


# Each agent account's share of the servers (NATS account `limits`, enforced by the server on every
# node): connections at once and subscriptions in all (the client needs 1-2 per connection: its
# reply inbox, and `eval.completed.<name>` when it listens). Unbounded, one creds file could take
# every file descriptor or fill the sublist. Above the pending cap there is nothing to gain from
# more connections. Payloads keep the server's max_payload (1 MiB): the gateway refuses a body past
# `agent_max_patch_bytes` itself, with a reason the agent sees.
AGENT_LIMITS: Final = {"max_connections": 16, "max_subscriptions": 128}


def agent_account(name: str) -> str:
    return f"agent_{name}"


def agent_entry(name: str, public: str) -> str:
    """The agent's account: its one user, the imports of its own API and announcements, and its
    limits (`AGENT_LIMITS`)."""
    imports = (
        f'{{service: {{account: SERVICES, subject: "{m.eval_api_service_subject(name, "*")}"}}, '
        f'to: "{m.eval_api_subject(name, "*")}"}}, '
        f'{{stream: {{account: SERVICES, subject: "{m.eval_completed_subject(name)}"}}}}'
    )
    user = f'{{nkey: "{public}", permissions: {agent_permissions(name)}}}'
    limits = ", ".join(f"{k}: {v}" for k, v in AGENT_LIMITS.items())
    return (
        f"# agent {name}\n{agent_account(name)}: "
        f"{{users: [{user}], imports: [{imports}], limits: {{{limits}}}}}\n"
    )


def list_agents(conf: Path) -> dict[str, str]:
    """name → public key of every agent in `conf` (empty when the file does not exist)."""
    if conf.is_dir():
        raise BadInput(f"{conf} is a folder: --config names the agents file (deploy/nats/agents.conf)")
    if not conf.is_file():
        return {}
    try:
        text = conf.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise BadInput(f"{conf}: cannot read the agents file: {why}") from None
    return {mt["name"]: mt["key"] for mt in _ENTRY.finditer(text)}


def render(agents: dict[str, str]) -> str:
    body = "".join(agent_entry(n, k) for n, k in sorted(agents.items()))
    return f"{_HEADER}{body}"


def check_name(name: str) -> str:
    if not m.AGENT_NAME.fullmatch(name):
        raise BadInput(f"agent name {name!r}: use 1-32 of [a-z0-9_-], starting with a letter or digit")
    return name


def add_agent(conf: Path, name: str, creds: Path, *, rotate: bool = False) -> KeyPair:
    """A new key for `name`: its entry in `conf`, its seed in `creds`. An existing agent is
    refused unless `rotate` (then its old key stops working at the next server reload)."""
    agents = list_agents(conf)
    if check_name(name) in agents and not rotate:
        raise BadInput(f"agent {name} exists in {conf} (--rotate gives it a new key)")
    key = new_key()
    write_creds(creds, f"agent-{name}", key.seed)
    agents[name] = key.public
    write_atomic(conf, render(agents))
    return key


def remove_agent(conf: Path, name: str) -> None:
    agents = list_agents(conf)
    if name not in agents:
        raise BadInput(f"no agent {name} in {conf}")
    del agents[name]
    write_atomic(conf, render(agents))


def new_service_keys(creds_dir: Path) -> dict[str, KeyPair]:
    """A fresh key per service user, its seed written to `creds_dir/<service>.creds` (0600)."""
    keys: dict[str, KeyPair] = {}
    for service in SERVICE_USERS:
        keys[service] = key = new_key()
        write_creds(creds_dir / f"{service}.creds", f"service-{service}", key.seed)
    return keys


def service_keys(creds_dir: Path) -> dict[str, str]:
    """`new_service_keys`, returning the servers' environment (`NKEY_<SERVICE>=<public key>`)."""
    return {f"NKEY_{s.upper()}": k.public for s, k in new_service_keys(creds_dir).items()}


# deploy/k8s: the builder and evaluator run in namespace cppperf-build, the others in cppperf
K8S_NAMESPACES: Final = {
    "cppperf": ("admin", "crawler", "filter", "classifier"),
    "cppperf-build": ("builder", "evaluator"),
}


def k8s_objects(keys: dict[str, KeyPair]) -> str:
    """What deploy/k8s reads: the servers' public keys (ConfigMap `cppperf-nats-users`, not
    secret) and, in each namespace, the Secret `cppperf-nats-creds` holding the creds files of the
    services that run there (`<service>.creds`; each pod mounts only its own)."""
    users = "\n".join(f"  NKEY_{s.upper()}: {k.public}" for s, k in keys.items())
    docs = [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cppperf-nats-users\n  namespace: cppperf\ndata:\n{users}\n"
    ]
    for namespace, services in K8S_NAMESPACES.items():
        lines = [
            f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: cppperf-nats-creds\n  namespace: {namespace}\n"
            "type: Opaque\nstringData:\n"
        ]
        for service in services:
            body = creds_text(f"service-{service}", keys[service].seed)
            lines.append(f"  {service}.creds: |\n" + "".join(f"    {line}\n" for line in body.splitlines()))
        docs.append("".join(lines))
    return "---\n".join(docs)
