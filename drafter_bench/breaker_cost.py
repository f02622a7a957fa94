"""What a decode step costs while the drafter is unreachable and the circuit is open.

Points ``verifier_client`` (sync and asyncio, default breaker settings) at a
loopback port nothing listens on, steps until the circuit opens, then times
``step()`` with the real per-step input (one committed token per request) and
prints one JSON line per client and batch size. The issue's target is at most
50 µs added per step once the circuit is open.

    python drafter_bench/breaker_cost.py --steps 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time

import numpy as np

from verifier_client import AioDrafterClient, BreakerState, DrafterClient, Outcome

TARGET_US = 50.0
PROMPT = list(range(100, 200))


def _dead_target() -> str:
    """A loopback address with nothing listening (bound for a moment, then freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


def _report(client: str, batch: int, durations_ns: list[int], outcomes: set[Outcome]) -> None:
    us = np.asarray(durations_ns, dtype=np.float64) / 1e3
    print(json.dumps({
        "bench": "breaker_open", "client": client, "batch": batch, "steps": len(us),
        "step_us_p50": round(float(np.percentile(us, 50)), 2),
        "step_us_p99": round(float(np.percentile(us, 99)), 2),
        "step_us_mean": round(float(us.mean()), 2),
        "outcomes": sorted(o.value for o in outcomes), "target_us": TARGET_US,
    }), flush=True)  # fmt: skip


def run_sync(batch: int, steps: int) -> None:
    with DrafterClient(_dead_target(), deadline_ms=3.0) as client:
        ids = [f"r{i}" for i in range(batch)]
        for rid in ids:
            client.add_request(rid, PROMPT)
        while client.breaker_state is BreakerState.CLOSED:
            client.step({rid: [7] for rid in ids})
        durations_ns, outcomes = [], set()
        for _ in range(steps):
            commits = {rid: [7] for rid in ids}
            start = time.perf_counter_ns()
            result = client.step(commits)
            durations_ns.append(time.perf_counter_ns() - start)
            outcomes.add(result.outcome)
    _report("sync", batch, durations_ns, outcomes)


async def run_aio(batch: int, steps: int) -> None:
    async with AioDrafterClient(_dead_target(), deadline_ms=3.0) as client:
        ids = [f"r{i}" for i in range(batch)]
        for rid in ids:
            client.add_request(rid, PROMPT)
        while client.breaker_state is BreakerState.CLOSED:
            await client.step({rid: [7] for rid in ids})
        durations_ns, outcomes = [], set()
        for _ in range(steps):
            commits = {rid: [7] for rid in ids}
            start = time.perf_counter_ns()
            result = await client.step(commits)
            durations_ns.append(time.perf_counter_ns() - start)
            outcomes.add(result.outcome)
    _report("asyncio", batch, durations_ns, outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000, help="timed steps per case")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 1, 64)")
    args = parser.parse_args()
    for batch in args.batch or [1, 64]:
        run_sync(batch, args.steps)
        asyncio.run(run_aio(batch, args.steps))


if __name__ == "__main__":
    main()
