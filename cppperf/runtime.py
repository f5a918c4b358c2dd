"""Run services in this process on a (possibly embedded) NATS: used by `mine` and `serve`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from faststream.nats import NatsBroker

from cppperf.shared.bus import Bus, servers
from cppperf.shared.embedded import EmbeddedNats
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import Settings
from cppperf.shared.store import Store

CONSUMING_SERVICES = ("filter", "classifier", "builder")
ALL_SERVICES = ("crawler", "filter", "classifier", "builder", "evaluator")
NOT_YET: dict[str, str] = {}


@contextlib.contextmanager
def nats_endpoint(settings: Settings) -> Iterator[str]:
    """The configured NATS URL, or an embedded nats-server for the duration of the block."""
    if settings.nats_url:
        yield settings.nats_url
        return
    with EmbeddedNats(settings.nats_data_dir()) as server:
        yield server.url


@contextlib.asynccontextmanager
async def connect(settings: Settings, url: str) -> AsyncIterator[ServiceContext]:
    bus = await Bus.connect(url, settings.bus)
    try:
        await bus.provision()
        store = await Store.open(bus.js, replicas=settings.bus.replicas)
        yield ServiceContext(settings=settings, bus=bus, store=store)
    finally:
        await bus.close()


@dataclass
class Running:
    ctx: ServiceContext
    broker: NatsBroker


@contextlib.asynccontextmanager
async def run_services(settings: Settings, url: str, services: list[str]) -> AsyncIterator[Running]:
    """Start the consuming services named in `services` on one broker; stop them on exit."""
    from cppperf.services.builder import app as builder_app
    from cppperf.services.classifier import app as classifier_app
    from cppperf.services.evaluator import app as evaluator_app
    from cppperf.services.filter import app as filter_app

    async with connect(settings, url) as ctx:
        broker = NatsBroker(servers(url), logger=None)
        closers = []
        if "filter" in services:
            filter_app.register(broker, ctx)
        if "classifier" in services:
            closers.append(classifier_app.register(broker, ctx))
        if "builder" in services:
            builder_app.register(broker, ctx)
        if "evaluator" in services:
            evaluator_app.register(broker, ctx)
        await broker.start()
        try:
            yield Running(ctx, broker)
        finally:
            await broker.stop()
            for c in closers:
                await c.close()
