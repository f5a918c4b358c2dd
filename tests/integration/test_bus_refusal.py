"""A JetStream call the server refuses (its store full, a limit it cannot give) ends a CLI verb
with one line that says what the server said and what to do, and exit 1, never a traceback."""

from __future__ import annotations

import nats
import pytest
import typer
from nats.js.api import StorageType, StreamConfig

from cppperf.cli.common import run_async
from cppperf.shared.embedded import EmbeddedNats

pytestmark = pytest.mark.nats


async def _ask_for_more_than_the_disk(url: str) -> None:
    nc = await nats.connect(url)
    try:
        config = StreamConfig(
            name="TOO_BIG", subjects=["too.big"], storage=StorageType.FILE, max_bytes=1 << 60
        )
        await nc.jetstream().add_stream(config)
    finally:
        await nc.close()


def test_a_store_without_room_is_one_line_with_the_remedy(
    nats_server: EmbeddedNats, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as exited:
        run_async(_ask_for_more_than_the_disk(nats_server.url))
    assert exited.value.exit_code == 1
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "insufficient storage" in lines[0] and "JetStream error 10047" in lines[0]
    assert "free disk" in lines[0] and "Traceback" not in out.err
