"""Does a job starve on a build node's timing core? Mining proofs beside evaluations, old vs new lease policy.

Usage: python bench/lease_fairness.py [--seconds 20] [--miners 2] [--rounds 8] [--round-s 0.15]
                                      [--eval-every 0.6] [--eval-rounds 3] [--json]

One host, one timing core, a fresh lease directory per policy. `--miners` prover processes prove
back to back: a proof is `--rounds` interleaved rounds of `--round-s` seconds on the core (a small
generated workload: the holder sleeps, so the shared machine stays idle). One evaluator process
asks for the core every `--eval-every` seconds and holds it for `--eval-rounds` short rounds
(0.05 s each), as the evaluator holds its lease for its whole measurement. Policies:
  old  (`builder.lease_policy=poll`): every waiter polls every 0.25 s, a proof holds the core for
       its whole measurement, no priority (what cppperf did before);
  new  (`round`, the default): a ticket queue in arrival order, evaluations first
       (`evaluator.lease_priority=0` before `builder.lease_priority=1`), a proof leases per round.
Printed per policy: proofs/hour, evaluations done, longest and median evaluation wait (request to
lease), and the new/old ratios side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cppperf.shared.engine.leases import acquire

POLICIES = {"old": ("poll", False), "new": ("fifo", True)}  # acquire policy, per-round leases


def miner(directory: Path, policy: str, until: float, rounds: int, round_s: float) -> None:
    how, per_round = POLICIES[policy]
    while time.time() < until:
        start = time.time()
        if per_round:
            for _ in range(rounds):
                lease = acquire(directory, [0], timeout=3600, policy=how, priority=1)
                time.sleep(round_s)
                lease.release()
        else:
            lease = acquire(directory, [0], timeout=3600, policy=how, priority=1)
            time.sleep(round_s * rounds)
            lease.release()
        if time.time() <= until:
            print(json.dumps({"proof_s": time.time() - start}), flush=True)


def evaluator(directory: Path, policy: str, until: float, every: float, rounds: int) -> None:
    how, per_round = POLICIES[policy]
    while time.time() < until:
        asked = time.time()
        lease = acquire(directory, [0], timeout=3600, policy=how, priority=0 if per_round else 1)
        waited = time.time() - asked
        time.sleep(0.05 * rounds)
        lease.release()
        print(json.dumps({"wait_s": waited}), flush=True)
        time.sleep(max(0.0, every - (time.time() - asked)))


def run_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cppperf-lease-bench-") as tmp:
        until = time.time() + args.seconds
        me = [sys.executable, __file__, "--role"]
        common = ["--dir", tmp, "--policy", policy, "--until", str(until)]
        procs = [
            subprocess.Popen(
                [*me, "miner", *common, "--rounds", str(args.rounds), "--round-s", str(args.round_s)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(args.miners)
        ]
        time.sleep(0.3)  # the miners hold the core first, as on a node already mining
        procs.append(
            subprocess.Popen(
                [
                    *me,
                    "evaluator",
                    *common,
                    "--eval-every",
                    str(args.eval_every),
                    "--eval-rounds",
                    str(args.eval_rounds),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        lines = [
            json.loads(x) for p in procs for x in p.communicate(timeout=args.seconds * 20)[0].splitlines()
        ]
    proofs = [x["proof_s"] for x in lines if "proof_s" in x]
    waits = [x["wait_s"] for x in lines if "wait_s" in x]
    return {
        "policy": policy,
        "proofs": len(proofs),
        "proofs_per_hour": round(len(proofs) * 3600 / args.seconds),
        "evaluations": len(waits),
        "eval_wait_max_s": round(max(waits, default=0.0), 3),
        "eval_wait_median_s": round(statistics.median(waits), 3) if waits else 0.0,
        "one_round_s": args.round_s,
        "one_proof_s": args.round_s * args.rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--miners", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--round-s", type=float, default=0.15)
    ap.add_argument("--eval-every", type=float, default=0.6)
    ap.add_argument("--eval-rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--role", choices=["miner", "evaluator"], help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--policy", choices=sorted(POLICIES), help=argparse.SUPPRESS)
    ap.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "miner":
        return miner(Path(args.dir), args.policy, args.until, args.rounds, args.round_s)
    if args.role == "evaluator":
        return evaluator(Path(args.dir), args.policy, args.until, args.eval_every, args.eval_rounds)
    old, new = run_policy("old", args), run_policy("new", args)
    if args.json:
        print(json.dumps({"old": old, "new": new}, indent=1))
        return None
    print(f"{'':24}{'old (poll, whole)':>20}{'new (queue, round)':>20}{'new/old':>10}")
    for key in ("proofs_per_hour", "evaluations", "eval_wait_max_s", "eval_wait_median_s"):
        a, b = old[key], new[key]
        print(f"{key:24}{a:>20}{b:>20}{(b / a if a else float('nan')):>10.2f}")
    print(f"(one proof round {args.round_s} s, one proof {old['one_proof_s']:.2f} s, {args.miners} miners)")
    return None


if __name__ == "__main__":
    main()
