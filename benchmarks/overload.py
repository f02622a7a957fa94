"""Goodput under overload: calls completed per second at 1x, 10x and 50x the service's
capacity, and how soon light calls are answered once the load stops.

A real ``drafter serve`` (empty live datastore). A *heavy* call restarts ``--requests``
requests with ``--context`` random tokens each and drafts ``--budget`` nodes for each
(what a decode worker's first step of a batch of long prompts sends). Capacity is what
one caller gets back to back; each overload row then offers ``factor x capacity`` heavy
calls per second for ``--seconds``, open loop (a new call on schedule whether or not the
earlier ones were answered), each with a ``--deadline-s`` gRPC deadline, and counts the
answers by status. ``goodput_over_capacity`` is what issue 29 bounds (at least 0.8 at
10x). After each row, a light call (one request, one token) is sent every 10 ms until
one is answered: ``recovery_s`` is how long after the load stopped that took.

The load generator runs in this process, on the same 2 cores as the service: at 50x it
takes a share of them too. Run::

    python -m benchmarks.overload --out benchmarks/results/overload.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np

from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc

VOCAB = 128256


def heavy_request(rng: np.random.Generator, slot: int, requests: int, context: int,
                  budget: int) -> pb.DraftRequest:  # fmt: skip
    deltas = [
        pb.RequestDelta(request_id=f"h{slot}-{j}", budget=budget,
                        new_tokens=rng.integers(0, VOCAB, context).tolist())
        for j in range(requests)
    ]  # fmt: skip
    return pb.DraftRequest(requests=deltas)


async def _call(stub: pb_grpc.DrafterServiceStub, request: pb.DraftRequest,
                deadline_s: float, counts: Counter[str]) -> None:  # fmt: skip
    try:
        await stub.Draft(request, timeout=deadline_s)
        counts["OK"] += 1
    except grpc.aio.AioRpcError as exc:
        counts[exc.code().name] += 1


async def capacity(stub: pb_grpc.DrafterServiceStub, requests: list[pb.DraftRequest],
                   seconds: float) -> float:  # fmt: skip
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        await stub.Draft(requests[done % len(requests)], timeout=60)
        done += 1
    return done / (time.perf_counter() - start)


async def offered(stub: pb_grpc.DrafterServiceStub, requests: list[pb.DraftRequest],
                  rate: float, seconds: float, deadline_s: float) -> dict[str, object]:  # fmt: skip
    counts: Counter[str] = Counter()
    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    sent = 0
    while (now := time.perf_counter() - start) < seconds:
        while sent < now * rate:
            tasks.append(asyncio.create_task(
                _call(stub, requests[sent % len(requests)], deadline_s, counts)))
            sent += 1
        await asyncio.sleep(0.002)
    load_end = time.perf_counter()
    # Answers that came in during the load window are goodput; the rest still count below.
    ok_in_window = counts["OK"]
    light = pb.DraftRequest(requests=[pb.RequestDelta(request_id="light", budget=8,
                                                      new_tokens=[1])])  # fmt: skip
    recovery = None
    while time.perf_counter() - load_end < 30:
        try:
            await stub.Draft(light, timeout=0.5)
            recovery = time.perf_counter() - load_end
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    return {"sent": sent, "ok_in_window": ok_in_window, "codes": dict(counts),
            "goodput_per_s": round(ok_in_window / seconds, 2),
            "recovery_s": None if recovery is None else round(recovery, 3)}  # fmt: skip


async def run(args: argparse.Namespace, target: str) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    requests = [heavy_request(rng, slot, args.requests, args.context, args.budget)
                for slot in range(8)]  # fmt: skip
    options = [("grpc.max_send_message_length", 1 << 28)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        stub = pb_grpc.DrafterServiceStub(channel)
        await capacity(stub, requests, 1.0)  # warm up
        cap = await capacity(stub, requests, args.capacity_s)
        rows = []
        for factor in args.factors:
            row = await offered(stub, requests, factor * cap, args.seconds, args.deadline_s)
            row.update({
                "bench": "overload", "factor": factor, "capacity_per_s": round(cap, 2),
                "goodput_over_capacity": round(float(row["goodput_per_s"]) / cap, 3),  # type: ignore[arg-type]
                "requests": args.requests, "context": args.context, "budget": args.budget,
                "deadline_s": args.deadline_s, "seconds": args.seconds, "pinned": args.pin,
            })  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--factors", type=lambda t: [float(x) for x in t.split(",")],
                   default=[1.0, 10.0, 50.0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--context", type=int, default=2000)
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--deadline-s", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--capacity-s", type=float, default=5.0)
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra drafter serve argument (repeatable)")
    p.add_argument("--pin", action="store_true",
                   help="the service on the last core, this load generator on the others "
                        "(as a separate client host would be; needs 2+ cores)")
    p.add_argument("--out", type=Path, help="append the JSON lines to this file too")
    args = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus: set[int] | None = None
    if args.pin:
        if len(cpus) < 2:
            p.error(f"--pin needs 2 or more cores; this process may use {len(cpus)}")
        server_cpus = {cpus[-1]}
        os.sched_setaffinity(0, set(cpus[:-1]))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "drafter_service.drafter_cli", "serve",
               "--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1",
               "--admin-port", "-1", "--data-dir", str(Path(tmp) / "data"),
               "--vocab-size", str(VOCAB), *args.serve_arg]  # fmt: skip
        pin = None if server_cpus is None else lambda: os.sched_setaffinity(0, server_cpus)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=pin)
        try:
            assert proc.stdout is not None
            target = proc.stdout.readline().split()[-1]
            rows = asyncio.run(run(args, target))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    if args.out:
        with args.out.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
