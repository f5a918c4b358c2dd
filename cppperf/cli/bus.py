"""`bus provision`: the operator creates every stream, KV bucket and the object store with their
limits (and brings existing ones to the current limits) with the admin credentials; on a secured
bus the services may not (shared/provision.py)."""

from __future__ import annotations

import typer
from rich.table import Table

from cppperf.cli.common import (
    AdminCreds,
    AsJson,
    Config,
    NatsUrl,
    WholeHelpGroup,
    _fail,
    _settings,
    app,
    cli_nats,
    not_admin,
    out,
    print_json,
    run_async,
)
from cppperf.shared.errors import CppPerfError

bus_app = typer.Typer(
    cls=WholeHelpGroup, help="The bus itself: `cppperf bus provision` (admin).", no_args_is_help=True
)
app.add_typer(bus_app, name="bus")


@bus_app.command("provision")
def provision(
    nats_url: NatsUrl = None,
    creds: AdminCreds = None,
    as_json: AsJson = False,
    config: Config = None,
) -> None:
    """Create or update every stream, KV bucket and the object store to the configured limits
    (`bus.stream_max_bytes`, `bus.kv_max_bytes`, …); idempotent. Run once before the services
    start on a secured bus, and again after changing a limit.

    \b
    Example:
      cppperf bus provision --nats-url nats://nats-1:4222 --creds admin.creds
    """
    from cppperf.shared.bus import AWAY_ERRORS, Bus
    from cppperf.shared.provision import provision_all

    s = _settings(config, nats_url=nats_url, bus__creds=str(creds) if creds else None)

    async def main(url: str) -> list[tuple[str, str]]:
        bus = await Bus.connect(url, s.bus, name="cppperf-provision")
        try:
            return [(p.name, p.action) for p in await provision_all(bus)]
        except AWAY_ERRORS:
            refused = str(bus.nc.last_error or "")
            if "permissions violation" in refused.lower():  # the server said why the call went unanswered
                raise CppPerfError(
                    f"the server refused provisioning ({refused}): use the admin's credentials"
                ) from None
            raise
        finally:
            await bus.close()

    with cli_nats(s) as url:
        try:
            done = run_async(main(url), waiting_for="provisioning to stop")
        except CppPerfError as exc:
            raise _fail(exc) from None
        except AWAY_ERRORS as exc:  # a refused $JS.API call times out: not the admin's rights
            raise not_admin(exc) from None
        except Exception as exc:  # nats' APIError and friends: one line
            raise _fail(f"provisioning failed: {exc}") from None
    if as_json:
        print_json([{"stream": n, "action": a} for n, a in done])
        return
    t = Table(title="bus provisioned")
    t.add_column("stream")
    t.add_column("action")
    for name, action in done:
        t.add_row(name, action)
    out.print(t)
