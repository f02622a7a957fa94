"""Goodput under overload: calls completed per second at 1x, 10x and 50x the service's
capacity, and how soon light calls are answered once the load stops.

A real ``drafter serve`` (empty live datastore). A *heavy* call restarts ``--requests``
requests with ``--context`` random tokens each and drafts ``--budget`` nodes for each
(what a decode worker's first step of a batch of long prompts sends). Capacity is what
one caller gets back to back; each overload row then offers ``factor x capacity`` heavy
calls per second for ``--seconds``, open loop (a new call on schedule whether or not the
earlier ones were answered), each with a ``--deadline-s`` gRPC deadline, and counts the
answers by status. ``goodput_over_capacity`` is what issue 29 bounds (at least 0.8 at
10x). After each row, a light call (one request, one token) is sent every 10 ms, on a
connection of its own, until one is answered: ``recovery_s`` is how long after the load
stopped that took. ``server_cpu_per_s`` is the service's CPU over the load window (1.0: a
core).

The load generator runs in this process, on the same 2 cores as the service: at 50x it
takes a share of them too. Run::

    python -m drafter_bench.overload --out benchmarks/results/overload.jsonl
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
from typing import TypeAlias

import grpc
import numpy as np

from drafter_service.edge.wire import SERVICE_NAME
from sssd_drafter.v1 import drafter_pb2 as pb

from .unauth_flood import cpu_s

VOCAB = 128256


def heavy_request(rng: np.random.Generator, slot: int, requests: int, context: int,
                  budget: int) -> pb.DraftRequest:  # fmt: skip
    deltas = [
        pb.RequestDelta(request_id=f"h{slot}-{j}", budget=budget,
                        new_tokens=rng.integers(0, VOCAB, context).tolist())
        for j in range(requests)
    ]  # fmt: skip
    return pb.DraftRequest(requests=deltas)


Draft: TypeAlias = "grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]"
"""Draft with bytes in and out: the generator sends each heavy message serialized once,
so at 50x its own serializing and parsing (1.6 ms a heavy message) do not limit what it
offers or how soon it sees an answer."""


def raw_draft(channel: grpc.aio.Channel) -> Draft:
    return channel.unary_unary(f"/{SERVICE_NAME}/Draft")


async def _call(draft: Draft, request: bytes, deadline_s: float, counts: Counter[str],
                answered: list[float]) -> None:  # fmt: skip
    try:
        await draft(request, timeout=deadline_s)
        counts["OK"] += 1
        answered.append(time.perf_counter())
    except grpc.aio.AioRpcError as exc:
        counts[exc.code().name] += 1


async def capacity(draft: Draft, requests: list[bytes], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        await draft(requests[done % len(requests)], timeout=60)
        done += 1
    return done / (time.perf_counter() - start)


async def offered(
    drafts: list[Draft], probe: Draft, requests: list[bytes], rate: float, seconds: float,
    deadline_s: float, server_pid: int,
) -> dict[str, object]:  # fmt: skip
    counts: Counter[str] = Counter()
    answered: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    cpu_start = cpu_s(server_pid)
    start = time.perf_counter()
    sent = 0
    while (now := time.perf_counter() - start) < seconds:
        while sent < now * rate:
            call = _call(drafts[sent % len(drafts)], requests[sent % len(requests)],
                         deadline_s, counts, answered)  # fmt: skip
            tasks.append(asyncio.create_task(call))
            sent += 1
        await asyncio.sleep(0.002)
    load_end = time.perf_counter()
    window = load_end - start
    server_cpu = cpu_s(server_pid) - cpu_start
    one = pb.RequestDelta(request_id="light", budget=8, new_tokens=[1])
    light = pb.DraftRequest(requests=[one]).SerializeToString()
    recovery = None
    while time.perf_counter() - load_end < 30:
        try:
            await probe(light, timeout=0.5)
            recovery = time.perf_counter() - load_end
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    # Answers that came in during the load window are goodput; the rest still count below.
    ok_in_window = sum(t <= load_end for t in answered)
    return {"sent": sent, "ok_in_window": ok_in_window, "codes": dict(counts),
            "window_s": round(window, 3), "goodput_per_s": round(ok_in_window / window, 2),
            "server_cpu_per_s": round(server_cpu / window, 3),
            "recovery_s": None if recovery is None else round(recovery, 3)}  # fmt: skip


async def run(args: argparse.Namespace, target: str, server_pid: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    requests = [heavy_request(rng, slot, args.requests, args.context, args.budget)
                .SerializeToString() for slot in range(8)]  # fmt: skip
    options = [("grpc.max_send_message_length", 1 << 28)]
    channels = [grpc.aio.insecure_channel(target, options=[*options, ("grpc.channel_id", i)])
                for i in range(args.channels)]  # fmt: skip
    drafts = [raw_draft(c) for c in channels]
    # Recovery is asked on a connection of its own, connected before the load: the
    # generator's own backlog of calls on its connections is not the service's.
    channels.append(grpc.aio.insecure_channel(target, options=[("grpc.channel_id", -1)]))
    probe = raw_draft(channels[-1])
    try:
        await capacity(drafts[0], requests, 1.0)  # warm up
        await probe(b"", timeout=60)  # connected (an empty request drafts nothing)
        cap = await capacity(drafts[0], requests, args.capacity_s)
        rows = []
        for factor in args.factors:
            row = await offered(drafts, probe, requests, factor * cap, args.seconds,
                                args.deadline_s, server_pid)  # fmt: skip
            row.update({
                "bench": "overload", "factor": factor, "capacity_per_s": round(cap, 2),
                "goodput_over_capacity": round(float(row["goodput_per_s"]) / cap, 3),  # type: ignore[arg-type]
                "requests": args.requests, "context": args.context, "budget": args.budget,
                "deadline_s": args.deadline_s, "seconds": args.seconds, "pinned": args.pin,
                "channels": args.channels, "serve_args": args.serve_arg,
            })  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        return rows
    finally:
        for c in channels:
            await c.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--factors", type=lambda t: [float(x) for x in t.split(",")], default=[1.0, 10.0, 50.0]
    )
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--context", type=int, default=2000)
    p.add_argument("--budget", type=int, default=64)
    p.add_argument(
        "--channels",
        type=int,
        default=1,
        help="client connections the load is spread over (each its own HTTP/2 "
        "connection, as separate decode workers have)",
    )
    p.add_argument("--deadline-s", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--capacity-s", type=float, default=5.0)
    p.add_argument(
        "--serve-arg", action="append", default=[], help="extra drafter serve argument (repeatable)"
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="the service on the last core, this load generator on the others "
        "(as a separate client host would be; needs 2+ cores)",
    )
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
            rows = asyncio.run(run(args, target, proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    if args.out:
        with args.out.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
