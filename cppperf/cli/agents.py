"""`agents`: the bus identities. `add|remove|list` for external agents (deploy/nats/agents.conf
plus a creds file per agent), `service-keys` for the services (compose .env lines or a k8s Secret),
`forget` for an agent's stored evaluations (the operator's, as admin on the bus)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cppperf.cli.common import (
    AdminCreds,
    Config,
    NatsUrl,
    WholeHelpGroup,
    _fail,
    _settings,
    app,
    cli_nats,
    console,
    not_admin,
    out,
    run_async,
)
from cppperf.shared.errors import CppPerfError

if TYPE_CHECKING:
    from cppperf.services.evaluator.forget import Forgotten

agents_app = typer.Typer(
    cls=WholeHelpGroup, help="Bus identities: external agents and the services' NKeys.", no_args_is_help=True
)
app.add_typer(agents_app, name="agents")

Conf = Annotated[Path, typer.Option("--config", help="the agents' accounts (included by accounts.conf)")]
DEFAULT_CONF = Path("deploy/nats/agents.conf")
RELOAD = (
    "reload the servers to apply: `nats-server --signal reload` twice (a new agent's account gets its"
    " imports only at the second), or restart them (compose: docker compose restart nats-1 nats-2 nats-3)"
)


@agents_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="the agent's name: 1-32 of [a-z0-9_-]")],
    creds: Annotated[Path | None, typer.Option("--creds", help="where to write its creds file")] = None,
    rotate: Annotated[bool, typer.Option("--rotate", help="replace an existing agent's key")] = False,
    config: Conf = DEFAULT_CONF,
) -> None:
    """Give an agent an NKey: its public key and permissions into --config, its seed into --creds
    (default NAME.creds, mode 0600: hand it to the agent, never commit it).

    \b
    Examples:
      cppperf agents add alice
      cppperf evaluate --predictions preds.jsonl --run-id r --nats-url nats://bus:4222 --creds alice.creds
    """
    from cppperf.agents import add_agent

    path = creds or Path(f"{name}.creds")
    try:
        key = add_agent(config, name, path, rotate=rotate)
    except CppPerfError as exc:
        raise typer.BadParameter(str(exc)) from None
    out.print(f"agent {name}: {key.public} in {config}; credentials in {path}", soft_wrap=True)
    console.print(RELOAD, soft_wrap=True)


@agents_app.command("remove")
def remove(
    name: Annotated[str, typer.Argument(help="the agent to revoke (as given to `agents add`)")],
    config: Conf = DEFAULT_CONF,
) -> None:
    """Revoke an agent: its entry leaves --config; its key stops working at the next reload."""
    from cppperf.agents import remove_agent

    try:
        remove_agent(config, name)
    except CppPerfError as exc:
        raise typer.BadParameter(str(exc)) from None
    out.print(f"agent {name} removed from {config}", soft_wrap=True)
    console.print(RELOAD, soft_wrap=True)


@agents_app.command("list")
def list_(config: Conf = DEFAULT_CONF) -> None:
    """Every agent in --config with its public key."""
    from cppperf.agents import list_agents

    agents = list_agents(config)
    for name, key in sorted(agents.items()):
        out.print(f"{name} {key}", markup=False, highlight=False)
    if not agents:
        where = "" if config.is_file() else " (no such file: pass the --config `agents add` wrote)"
        console.print(f"no agents in {config}{where}", soft_wrap=True, markup=False, highlight=False)


@agents_app.command("service-keys")
def service_keys_cmd(
    out_dir: Annotated[Path, typer.Option("--out", help="where each service's creds file goes")] = Path(
        "deploy/nats/creds"
    ),
    k8s: Annotated[
        bool,
        typer.Option(
            "--k8s",
            help="print deploy/k8s's ConfigMap and Secrets (kubectl apply -f -) instead of .env lines",
        ),
    ] = False,
) -> None:
    """New NKeys for the service users (admin, crawler, filter, classifier, builder, evaluator):
    seeds into --out/<service>.creds; prints the servers' NKEY_* lines for compose's .env, or with
    --k8s what deploy/k8s reads: the ConfigMap `cppperf-nats-users` (public keys) and per namespace
    the Secret `cppperf-nats-creds` (its services' creds files). Running it again rotates them all."""
    from cppperf.agents import k8s_objects, new_service_keys

    keys = new_service_keys(out_dir)
    if k8s:
        out.print(k8s_objects(keys), end="", markup=False, highlight=False, soft_wrap=True)
        return
    for service, key in keys.items():
        out.print(f"NKEY_{service.upper()}={key.public}", markup=False, highlight=False)


@agents_app.command("forget")
def forget_cmd(
    name: Annotated[str, typer.Argument(help="the agent whose evaluations go (as given to `agents add`)")],
    run: Annotated[str | None, typer.Option("--run", help="only this run of the agent's")] = None,
    runs_dir: Annotated[
        Path | None,
        typer.Option(
            "--runs-dir",
            help="this evaluator's runs directory (evaluator.runs_dir, OUT/runs): remove the run folders too",
            file_okay=False,
            exists=True,
        ),
    ] = None,
    nats_url: NatsUrl = None,
    creds: AdminCreds = None,
    config: Config = None,
) -> None:
    """Forget an agent's evaluations (all, or one --run's): their records in the `evaluations`
    bucket with every revision and marker, their report objects and, with --runs-dir, their run
    folders on this evaluator. They stop counting against evaluator.agent_max_evaluations. Run
    it for a finished run (an evaluation still running is recorded again when it ends), on each
    evaluator host for its --runs-dir.

    \b
    Examples:
      cppperf agents forget alice --run r1 --nats-url nats://nats-1:4222 --creds admin.creds
      cppperf agents forget alice --runs-dir /var/lib/cppperf/runs --nats-url … --creds admin.creds
    """
    from cppperf.runtime import connect
    from cppperf.services.evaluator.forget import check_names, forget
    from cppperf.shared.bus import AWAY_ERRORS

    try:
        check_names(name, run)
    except CppPerfError as exc:
        raise typer.BadParameter(str(exc)) from None
    s = _settings(config, nats_url=nats_url, bus__creds=str(creds) if creds else None)

    async def main(url: str) -> Forgotten:
        async with connect(s, url) as ctx:
            return await forget(ctx.store, name, run, runs_dir)

    with cli_nats(s) as url:
        try:
            done = run_async(main(url), waiting_for="the removal to stop")
        except CppPerfError as exc:
            raise _fail(exc) from None
        except AWAY_ERRORS as exc:  # a refused $JS.API call times out
            raise not_admin(exc) from None
        except Exception as exc:  # nats' APIError and friends: one line
            raise _fail(f"forgetting failed: {exc}") from None
    what = f"{name}'s run {run}" if run else name
    folders = f", {len(done.folders)} run folder(s)" if runs_dir is not None else ""
    kept = f"; {done.kept} operator's run(s) named {name}.… kept" if done.kept else ""
    out.print(
        f"{what}: {done.records} evaluation record(s), {done.reports} report object(s){folders} removed{kept}"
    )
