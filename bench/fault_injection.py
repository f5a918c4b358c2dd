"""Fault injection on real nats-server and real builder processes: k/N trials that lost nothing,
stuck nothing and ended with one consistent result.

Usage: python bench/fault_injection.py [--kill-trials 10] [--dup-trials 5] [--term-trials 3]
                                      [--big-trials 3] [--json]

Workers are `tests/fault_worker.py` processes: the real runtime and builder handler (claims,
per-process workspaces, store before publish, SIGTERM handling) around a stand-in build that
sleeps. Faults:
  kill9     SIGKILL the worker building a job; a second worker must finish it exactly once
  dup-ids   the same commit under two Nats-Msg-Ids, two replicas: one build, one patch.built
  sigterm   SIGTERM mid-build: exit within the grace, job nak'ed and rebuilt by the other worker
  big-msg   ~1 MiB garbage on commit.classified: dead-lettered, payload by reference, restored
  outage    NATS down 9 s (~90 reconnect attempts at 0.1 s; nats-py's default gives up at 60):
            workers consume again afterwards
A trial passes when: the instance has one KV record, exactly one patch.built, the JSON record
and both agree on the verdict, the work queue is drained, and (kill9) the dead worker's
workspace is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from cppperf.runtime import connect
from cppperf.shared import messages as m
from cppperf.shared.bus import wait_drained
from cppperf.shared.embedded import EmbeddedNats
from cppperf.shared.logging import configure_logging
from cppperf.shared.service import ServiceContext
from cppperf.shared.settings import load_settings
from tests.gitrepo import commit_files

ROOT = Path(__file__).resolve().parents[1]


class Pool:
    def __init__(self, url: str, tmp: Path, sleep: float, **bus: Any) -> None:
        self.url, self.tmp, self.sleep = url, tmp, sleep
        self.markers = tmp / "markers"
        self.markers.mkdir(exist_ok=True)
        self.overrides = {
            "out_dir": str(tmp / "out"),
            "health_dir": str(tmp / "health"),
            "bus": {
                "ack_wait": 3.0,
                "max_deliver": 5,
                "nak_delay": 0.2,
                "claim_lease": 2.0,
                "stop_grace": 1.0,
                "health_interval": 0.5,
                "reconnect_wait": 0.1,
                **bus,
            },
            "builder": {"work_dir": str(tmp / "work")},
            "mining": {"mirror_dir": str(tmp / "mirrors")},
        }
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: list[Any] = []

    def spawn(self) -> int:
        log = (self.markers / f"log-{len(self.logs)}.txt").open("wb")
        self.logs.append(log)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fault_worker",
                self.url,
                str(self.markers),
                str(self.sleep),
                json.dumps(self.overrides),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        self.procs[proc.pid] = proc
        return proc.pid

    async def ready(self, pid: int, timeout: float = 600) -> None:
        await wait_file(self.markers / f"ready-{pid}", timeout)

    def alive(self) -> list[int]:
        return [pid for pid, p in self.procs.items() if p.poll() is None]

    def builds_of(self, iid: str) -> int:
        return sum(1 for f in self.markers.glob("built-*") if f.read_text().split()[0] == iid)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in self.logs:
            f.close()


async def wait_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} did not appear in {timeout:.0f}s")
        await asyncio.sleep(0.05)


def new_job(repo: Path, n: int) -> tuple[m.CommitClassified, str]:
    sha = commit_files(repo, {"a.cpp": f"int f() {{ return {n}; }}\n"}, f"faster {n}")
    commit = m.CommitSelected(
        repo="o/bench", url=str(repo), sha=sha, parent="0" * 40, date="2024-01-01T00:00:00+00:00", message="x"
    )
    return m.CommitClassified(commit=commit, label=True, backend="heuristic"), m.instance_id(commit.repo, sha)


async def consistent(ctx: ServiceContext, pool: Pool, iid: str) -> tuple[bool, str]:
    rec = await ctx.store.get("instances", iid)
    msgs = []
    info = await ctx.bus.js.stream_info("PATCH_BUILT")
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await ctx.bus.js.get_msg("PATCH_BUILT", seq)
        msg = msgspec.json.decode(raw.data or b"", type=m.PatchBuilt)
        if msg.instance_id == iid:
            msgs.append(msg)
    path = pool.tmp / "out" / "instances" / f"{iid}.json"
    if rec is None:
        return False, "no KV record"
    if len(msgs) != 1:
        return False, f"{len(msgs)} patch.built messages"
    on_disk = json.loads(path.read_text())["cppperf"]["verdict"] if path.exists() else None
    if not rec["verdict"] == msgs[0].verdict == on_disk:
        return False, f"disagree: kv={rec['verdict']} msg={msgs[0].verdict} json={on_disk}"
    return True, ""


async def trial_kill9(ctx: ServiceContext, pool: Pool, repo: Path, n: int) -> tuple[bool, str]:
    item, iid = new_job(repo, n)
    await ctx.bus.publish(m.COMMIT_CLASSIFIED, item)
    deadline = time.monotonic() + 600
    while not (starts := list(pool.markers.glob(f"start-{iid}-*"))):
        if time.monotonic() > deadline:
            return False, "never started"
        await asyncio.sleep(0.05)
    victim = int(starts[0].read_text())
    os.kill(victim, signal.SIGKILL)
    pool.procs[victim].wait()
    pool.spawn()  # the replacement; the other live worker takes the job over meanwhile
    deadline = time.monotonic() + 600
    while pool.builds_of(iid) == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await wait_drained(ctx.bus, timeout=600)
    ok, why = await consistent(ctx, pool, iid)
    if ok and pool.builds_of(iid) != 1:
        ok, why = False, f"{pool.builds_of(iid)} builds"
    return ok, why  # the dead attempt's workspace: counted at the end (`stale-workspaces-left`)


async def trial_dup(ctx: ServiceContext, pool: Pool, repo: Path, n: int) -> tuple[bool, str]:
    item, iid = new_job(repo, 1000 + n)
    await ctx.bus.publish(m.COMMIT_CLASSIFIED, item, msg_id=f"a-{n}")
    await ctx.bus.publish(m.COMMIT_CLASSIFIED, item, msg_id=f"b-{n}")
    await wait_drained(ctx.bus, timeout=600)
    ok, why = await consistent(ctx, pool, iid)
    if ok and pool.builds_of(iid) != 1:
        ok, why = False, f"{pool.builds_of(iid)} builds"
    return ok, why


async def trial_term(ctx: ServiceContext, pool: Pool, repo: Path, n: int) -> tuple[bool, str]:
    item, iid = new_job(repo, 2000 + n)
    await ctx.bus.publish(m.COMMIT_CLASSIFIED, item)
    deadline = time.monotonic() + 600
    while not (starts := list(pool.markers.glob(f"start-{iid}-*"))):
        if time.monotonic() > deadline:
            return False, "never started"
        await asyncio.sleep(0.05)
    victim = int(starts[0].read_text())
    t0 = time.monotonic()
    os.kill(victim, signal.SIGTERM)
    code = await asyncio.to_thread(pool.procs[victim].wait, 30)
    took = time.monotonic() - t0
    pool.spawn()
    await wait_drained(ctx.bus, timeout=600)
    ok, why = await consistent(ctx, pool, iid)
    if ok and (code != 0 or took > 60):
        ok, why = False, f"exit {code} after {took:.1f}s"
    return ok, why


async def trial_big(ctx: ServiceContext, n: int) -> tuple[bool, str]:
    """~1 MiB of garbage on commit.classified (the workers' input; tests/integration/test_faults.py covers
    every input subject): dead-lettered, payload by reference, restored exactly."""
    limit = ctx.bus.nc.max_payload
    body = b'{"junk":"' + bytes([97 + n % 26]) * (limit - 256) + b'"}'
    await ctx.bus.publish_raw(m.COMMIT_CLASSIFIED, body, msg_id=f"big-{n}")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        for rec in await ctx.bus.dead_letters(m.COMMIT_CLASSIFIED):
            if rec.letter.msg_id == f"big-{n}":
                if rec.letter.payload_ref is None:
                    return False, "payload inline"
                if await ctx.bus.letter_payload(rec.letter) != body:
                    return False, "payload differs"
                await wait_drained(ctx.bus, timeout=600)
                return True, ""
        await asyncio.sleep(0.2)
    return False, "never dead-lettered"


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cppperf-faults-") as d:
        tmp = Path(d)
        server = EmbeddedNats(tmp / "nats").start()
        repo = tmp / "repo"
        pool = Pool(server.url, tmp, sleep=args.sleep)
        try:
            settings = load_settings(env={}, nats_url=server.url)
            async with connect(settings, server.url) as ctx:
                for _ in range(2):
                    pool.spawn()
                for pid in list(pool.procs):
                    await pool.ready(pid)
                for name, trials, fn in (
                    ("kill9", args.kill_trials, trial_kill9),
                    ("dup-ids", args.dup_trials, trial_dup),
                    ("sigterm", args.term_trials, trial_term),
                ):
                    ok = 0
                    why: list[str] = []
                    for n in range(trials):
                        while len(pool.alive()) < 2:
                            pool.spawn()
                        try:
                            good, reason = await fn(ctx, pool, repo, n)
                        except TimeoutError as exc:
                            good, reason = False, str(exc)
                        ok += good
                        if not good:
                            why.append(reason)
                        print(
                            f"  {name} trial {n + 1}/{trials}: {'ok' if good else 'FAIL ' + reason}",
                            file=sys.stderr,
                        )
                    results[name] = {"ok": ok, "trials": trials, "failures": why}
                # a dead attempt's workspace is removed once its lease ran out
                attempts = tmp / "work" / "attempts"
                await asyncio.sleep(3)
                live = {str(p) for p in pool.alive()}
                stale = (
                    [p.name for p in attempts.iterdir() if p.name.split("-")[-2] not in live]
                    if attempts.exists()
                    else []
                )
                results["stale-workspaces-left"] = len(stale)
                ok = 0
                for n in range(args.big_trials):
                    good, _ = await trial_big(ctx, n)
                    ok += good
                results["big-msg"] = {"ok": ok, "trials": args.big_trials}
            # outage: stop the server 9 s, restart on the same port and store, then one more job
            server.stop()
            await asyncio.sleep(9)
            server = EmbeddedNats(tmp / "nats", port=server.port).start()
            async with connect(settings, server.url) as ctx:
                item, iid = new_job(repo, 9999)
                await ctx.bus.publish(m.COMMIT_CLASSIFIED, item)
                try:
                    await wait_drained(ctx.bus, timeout=600)
                    good, _ = await consistent(ctx, pool, iid)
                except TimeoutError:
                    good = False
                results["outage"] = {"ok": int(good), "trials": 1}
        finally:
            pool.close()
            server.stop()
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kill-trials", type=int, default=10)
    ap.add_argument("--dup-trials", type=int, default=5)
    ap.add_argument("--term-trials", type=int, default=3)
    ap.add_argument("--big-trials", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=2.0, help="seconds a stand-in build takes")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    configure_logging("warning", json=True)
    res = asyncio.run(main(a))
    if a.json:
        print(json.dumps(res))
    else:
        for name, r in res.items():
            if isinstance(r, dict):
                extra = f"  ({'; '.join(r['failures'])})" if r.get("failures") else ""
                print(f"{name:10s} {r['ok']}/{r['trials']}{extra}")
            else:
                print(f"{name:10s} {r}")
