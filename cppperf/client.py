"""The one evaluator client, for the CLI (`cppperf evaluate`) and the Python API
(`cppperf.evaluate`): `evaluate_rows` scores SWE-bench prediction rows in this process, or, with
`nats_url` set, through the evaluator services on a bus as an agent (`AgentClient` below), and
keeps every report where a local evaluation writes it (OUT/runs/<run_id>/<model>/<id>/report.json).

The agent-side client: submit patches to the evaluators on a cppperf bus and read the results.

Needs only an agent's rights (`cppperf agents add NAME` writes its creds file): it never touches
JetStream, streams or buckets, only the evaluator's request-reply API `eval.api.<agent>.*`.

    async with await AgentClient.connect("nats://bus:4222", creds="alice.creds") as c:
        eid = await c.submit("owner__repo-0123456789ab", patch_text, run_id="r1", model="my-model")
        report = await c.wait(eid)          # or: await c.result(eid) -> None while pending
        rows = await c.results("r1")        # every finished evaluation of run r1 (summaries)

A refusal (patch too large, bad run_id, too many pending, not your id) raises `Refused` with the
evaluator's reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from cppperf.shared import messages as m
from cppperf.shared.bus import credential_options, read_creds, servers
from cppperf.shared.domain import EvalReport
from cppperf.shared.errors import CppPerfError
from cppperf.shared.files import write_atomic
from cppperf.shared.logging import get_logger
from cppperf.shared.settings import Settings

log = get_logger(__name__)
T = TypeVar("T")
Prediction = dict[str, str]  # SWE-bench's row: instance_id, model_name_or_path, model_patch


class Refused(CppPerfError):
    """The evaluator (or the bus) refused a request; the message says why."""


class AgentClient:
    def __init__(self, nc: NatsClient, agent: str, *, timeout: float = 30.0) -> None:
        self.nc = nc
        self.agent = agent
        self.timeout = timeout

    @classmethod
    async def connect(
        cls, url: str, creds: str | None = None, *, request_timeout: float = 30.0
    ) -> AgentClient:
        """Connect as the agent of `creds` (its name is in the file); without creds, as the agent
        `local` of an open development bus."""
        agent = m.LOCAL_AGENT
        if creds:
            name, _ = read_creds(creds)
            if not name.startswith("agent-"):
                raise Refused(f"{creds} holds {name or 'no name'}, not an agent's credentials")
            agent = name.removeprefix("agent-")

        async def error(exc: Exception) -> None:  # a seed-list node away: one line, no traceback
            log.debug("nats_error", error=str(exc) or type(exc).__name__)

        nc = await nats.connect(
            servers(url), connect_timeout=5, error_cb=error, **credential_options(creds or "")
        )
        return cls(nc, agent, timeout=request_timeout)

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.nc.close()

    async def _ask(self, verb: str, msg: m.AgentSubmit | m.AgentQuery) -> m.AgentAnswer:
        subject = m.eval_api_subject(self.agent, verb)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            try:
                raw = await self.nc.request(subject, m.encode(msg), timeout=self.timeout)
                break
            except NoRespondersError:  # nobody got it: safe to ask again while evaluators start
                if loop.time() > deadline:
                    raise Refused(
                        f"no evaluator answers {subject} within {self.timeout:.0f}s "
                        "(none running, or not this agent's subject)"
                    ) from None
                await asyncio.sleep(0.5)
            except (NatsTimeout, TimeoutError):
                raise Refused(f"no answer on {subject} within {self.timeout:.0f}s") from None
        answer = m.decode(raw.data, m.AgentAnswer)
        if not answer.ok:
            raise Refused(answer.error)
        return answer

    async def submit(
        self, instance: str, patch: str, *, run_id: str = "default", model: str = "manual"
    ) -> str:
        """Queue one evaluation; returns its id (the same id again for the same request)."""
        req = m.AgentSubmit(run_id=run_id, model=model, instance_id=instance, patch=patch)
        return (await self._ask("submit", req)).id

    async def result(self, evaluation_id: str, *, patch: str | None = None) -> dict[str, Any] | None:
        """The report of a finished evaluation (verdict, opt, speed-ups), None while pending;
        with `patch`, None too while the id holds another patch's report (one asked before).
        `Refused` when it is neither queued nor stored (never submitted, or its request was
        dead-lettered): `wait` ends with that line instead of polling for ever."""
        digest = "" if patch is None else hashlib.sha256(patch.encode("utf-8", "surrogateescape")).hexdigest()
        answer = await self._ask("result", m.AgentQuery(id=evaluation_id, patch_sha256=digest))
        if answer.status == "lost":  # neither queued nor stored: waiting would never end
            raise Refused(answer.error)
        return answer.result

    async def results(self, run_id: str) -> list[dict[str, Any]]:
        """A summary row (id, instance_id, model, verdict, opt, speed-ups) per finished evaluation
        (every page: the evaluator answers a large run in pages of up to 512 KiB)."""
        rows: list[dict[str, Any]] = []
        after = ""
        while True:
            page = await self._ask("results", m.AgentQuery(run_id=run_id, after=after))
            rows.extend(page.results)
            if not page.more or not page.results:
                return rows
            after = str(page.results[-1]["id"])

    async def wait(
        self,
        evaluation_id: str,
        *,
        poll: float = 1.0,
        max_wait: float | None = None,
        patch: str | None = None,
    ) -> dict[str, Any]:
        """Poll `result` until the evaluation is finished (with `patch`: that patch's evaluation,
        not the report of one submitted before for the same run, model and instance)."""
        async with asyncio.timeout(max_wait):
            while (report := await self.result(evaluation_id, patch=patch)) is None:  # noqa: ASYNC110 - a remote state
                await asyncio.sleep(poll)
        return report


async def evaluate_predictions(
    client: AgentClient,
    rows: list[dict[str, str]],
    run_id: str,
    *,
    on_done: Callable[[int], None] | None = None,
    poll: float = 1.0,
) -> list[dict[str, Any]]:
    """Submit SWE-bench prediction rows (instance_id, model_name_or_path, model_patch) and wait for
    every report; `on_done(n)` after each one. A refusal of any row raises `Refused`."""
    ids = [
        await client.submit(r["instance_id"], r["model_patch"], run_id=run_id, model=r["model_name_or_path"])
        for r in rows
    ]
    reports: list[dict[str, Any]] = []
    for eid, row in zip(ids, rows, strict=True):
        reports.append(await client.wait(eid, poll=poll, patch=row["model_patch"]))
        if on_done is not None:
            on_done(len(reports))
    return reports


async def evaluate_over_bus(
    url: str,
    rows: list[Prediction],
    run_id: str,
    *,
    creds: str | None = None,
    on_done: Callable[[int], None] | None = None,
    poll: float = 1.0,
) -> list[dict[str, Any]]:
    """Submit every row to the evaluators on `url` as the agent of `creds` (agent rights only)
    and wait for every report."""
    async with await AgentClient.connect(url, creds) as client:
        return await evaluate_predictions(client, rows, run_id, on_done=on_done, poll=poll)


def keep_reports(settings: Settings, run_id: str, reports: list[dict[str, Any]]) -> None:
    """Write reports the evaluators returned where a local evaluation writes its own."""
    from cppperf.services.evaluator.pipeline import EvalRequest, run_dir

    for r in reports:
        req = EvalRequest(run_id, str(r["model"]), str(r["instance_id"]), "")
        write_atomic(run_dir(settings, req) / "report.json", json.dumps(r, indent=1))


def report_of(data: Mapping[str, Any]) -> EvalReport:
    """A report from the bus's JSON as its Struct; keys this version does not declare (an
    evaluator of a newer version) are left out (the report.json kept here keeps them)."""
    fields = set(EvalReport.__struct_fields__)
    return msgspec.convert({k: v for k, v in data.items() if k in fields}, EvalReport, strict=False)


def evaluate_rows(
    settings: Settings,
    rows: list[Prediction],
    run_id: str,
    *,
    creds: str | None = None,
    force: bool = False,
    max_workers: int = 1,
    on_done: Callable[[int], None] | None = None,
    run: Callable[[Coroutine[Any, Any, list[dict[str, Any]]]], list[dict[str, Any]]] = asyncio.run,
) -> list[EvalReport]:
    """Every row's report, in order: over the bus when `settings.nats_url` is set (`run` runs the
    coroutine: the CLI's handles Ctrl-C), else here, `max_workers` at a time (finished reports
    are reused unless `force`). `on_done(n)` after each report. A `run_id` that cannot name its
    run folder unchanged is BadInput (`messages.check_run_id`), before anything is sent or run."""
    m.check_run_id(run_id)
    if settings.nats_url:
        reports = run(evaluate_over_bus(settings.nats_url, rows, run_id, creds=creds, on_done=on_done))
        keep_reports(settings, run_id, reports)
        return [report_of(r) for r in reports]
    from cppperf.services.evaluator.pipeline import EvalRequest, evaluate_report

    reqs = [EvalRequest(run_id, r["model_name_or_path"], r["instance_id"], r["model_patch"]) for r in rows]
    done: list[EvalReport] = []
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        for rep in pool.map(lambda q: evaluate_report(q, settings, force=force), reqs):
            done.append(rep)
            if on_done is not None:
                on_done(len(done))
    return done
