"""``drafter-bench load``: step latency of the real drafting service under a decode-like load.

Drives ``--batch`` concurrent requests through one long-lived stream (or unary
calls), one DraftRequest per decode step, exactly as a decode worker would:
each request replays a real recorded generation, sends only the tokens
committed since its last step, and advances by the accepted length of the tree
it got back (plus the bonus token), so trees and deltas are real. Finished
requests are finished (ingested) and replaced by the next record.

Without ``--target`` a service is started as a subprocess (``drafter serve``) on
loopback, with a datastore prebuilt from ``--corpus`` if given.
"""

from __future__ import annotations

import argparse
import itertools
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from drafter_service.bench.data import Record, iter_documents, read_records
from drafter_service.bench.replay import accepted_length
from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc


def add_load_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("load", help="step latency of the gRPC service under load",
                              description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, metavar="FILE", help="records to replay (.jsonl[.gz])")
    p.add_argument("--target", metavar="HOST:PORT", help="a running service (default: start one)")
    p.add_argument("--corpus", metavar="FILE",
                   help="without --target: the started service's datastore is prebuilt from "
                        "these records' output_ids")
    p.add_argument("--batch", type=int, default=64, help="concurrent requests (default 64)")
    p.add_argument("--budget", type=int, default=16, help="draft budget per request (default 16)")
    p.add_argument("--steps", type=int, default=2000, help="measured steps (default 2000)")
    p.add_argument("--warmup", type=int, default=100, help="unmeasured first steps (default 100)")
    p.add_argument("--deadline-ms", type=float, default=3.0,
                   help="a step slower than this counts as a fallback (default 3)")
    p.add_argument("--mode", choices=("stream", "unary"), default="stream")
    p.add_argument("--vocab-size", type=int, default=128256)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_load)


@dataclass(slots=True)
class _Lane:
    request_id: str
    record: Record
    output: list[int]
    p: int = 0
    known_length: int = 0  # what the service holds; 0 = send the whole context
    delta: list[int] = field(default_factory=list)


class _Stream:
    """One bidirectional DraftStream: send a request, wait for its answer."""

    def __init__(self, stub: pb_grpc.DrafterServiceStub) -> None:
        self._requests: queue.Queue[pb.DraftRequest | None] = queue.Queue()
        self._responses: Iterator[pb.DraftResponse] = stub.DraftStream(self._iterate())

    def _iterate(self) -> Iterator[pb.DraftRequest]:
        while (request := self._requests.get()) is not None:
            yield request

    def __call__(self, request: pb.DraftRequest) -> pb.DraftResponse:
        self._requests.put(request)
        return next(self._responses)

    def close(self) -> None:
        self._requests.put(None)


def run_load(args: argparse.Namespace) -> int:
    records = [r for r in read_records(args.data, vocab_size=args.vocab_size) if len(r.output_ids)]
    if not records:
        raise ValueError(f"{args.data}: no record with output tokens")
    with tempfile.TemporaryDirectory(prefix="drafter-bench-load-") as tmp:
        proc: subprocess.Popen[str] | None = None
        target = args.target
        if target is None:
            proc, target = _start_server(args, Path(tmp))
        try:
            report = _drive(args, target, records)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>22}: {value}")
    return 0


def _start_server(args: argparse.Namespace, tmp: Path) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "drafter_service.service.cli", "serve", "--host", "127.0.0.1",
           "--port", "0", "--data-dir", str(tmp / "data"), "--vocab-size", str(args.vocab_size)]
    if args.corpus:
        from drafter_service.datastore import Datastore, SubIndex
        from drafter_service.snapshot import TokenizerIdentity, write_snapshot

        index = SubIndex.build(iter_documents(args.corpus, vocab_size=args.vocab_size),
                               args.vocab_size)
        write_snapshot(tmp / "corpus", Datastore([index], args.vocab_size),
                       TokenizerIdentity("bench", args.vocab_size, ""))
        cmd += ["--snapshot", str(tmp / "corpus")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("drafter listening on "):
        proc.kill()
        raise RuntimeError(f"drafter serve did not start: {line!r}")
    return proc, line.split()[-1]


def _drive(args: argparse.Namespace, target: str, records: Sequence[Record]) -> dict[str, Any]:
    channel = grpc.insecure_channel(target, options=[
        ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])
    stub = pb_grpc.DrafterServiceStub(channel)
    call = _Stream(stub) if args.mode == "stream" else stub.Draft
    finisher = _Finisher(stub)
    serial = itertools.count()
    source = itertools.cycle(records)

    def new_lane() -> _Lane:
        record = next(source)
        return _Lane(f"load-{next(serial)}", record, record.output_ids.tolist())

    lanes = [new_lane() for _ in range(args.batch)]
    latencies_ns: list[int] = []
    resyncs = accepted = committed = 0
    wall_start = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            wall_start = time.perf_counter()
        request = pb.DraftRequest(step=step, requests=[_delta(lane, args.budget) for lane in lanes])
        start = time.perf_counter_ns()
        response = call(request)
        elapsed = time.perf_counter_ns() - start
        if step >= args.warmup:
            latencies_ns.append(elapsed)
        for i, (lane, draft) in enumerate(zip(lanes, response.drafts, strict=True)):
            if draft.status == pb.DRAFT_STATUS_RESYNC:
                resyncs += step >= args.warmup
                lane.known_length, lane.delta = 0, []
                continue
            lane.known_length = draft.length
            got = accepted_length(list(draft.tokens), list(draft.parents), lane.output, lane.p)
            commit = min(got + 1, len(lane.output) - lane.p)
            lane.delta = lane.output[lane.p : lane.p + commit]
            lane.p += commit
            if step >= args.warmup:
                accepted, committed = accepted + got, committed + commit
            if lane.p == len(lane.output):
                finisher.finish(lane.request_id, lane.delta)
                lanes[i] = new_lane()
    wall = time.perf_counter() - wall_start
    if isinstance(call, _Stream):
        call.close()
    finisher.close()
    channel.close()
    lat_ms = np.asarray(latencies_ns, dtype=np.float64) / 1e6
    return {
        "mode": args.mode, "batch": args.batch, "budget": args.budget, "steps": len(lat_ms),
        "step_ms_p50": round(float(np.percentile(lat_ms, 50)), 3),
        "step_ms_p99": round(float(np.percentile(lat_ms, 99)), 3),
        "step_ms_p999": round(float(np.percentile(lat_ms, 99.9)), 3),
        "step_ms_max": round(float(lat_ms.max()), 3),
        "steps_per_s": round(len(lat_ms) / wall, 1),
        "fallbacks": int(np.count_nonzero(lat_ms > args.deadline_ms)),
        "deadline_ms": args.deadline_ms, "resyncs": resyncs,
        "tau": round(committed / max(1, len(lat_ms) * args.batch - resyncs), 4),
        "accepted_tokens": accepted, "finished": finisher.sent,
    }


def _delta(lane: _Lane, budget: int) -> pb.RequestDelta:
    if lane.known_length == 0:  # first call or resync: the whole context
        context = lane.record.prompt_ids.tolist() + lane.output[: lane.p]
        return pb.RequestDelta(request_id=lane.request_id, known_length=0, new_tokens=context,
                               budget=budget, prompt_length=len(lane.record.prompt_ids))
    return pb.RequestDelta(request_id=lane.request_id, known_length=lane.known_length,
                           new_tokens=lane.delta, budget=budget)


class _Finisher:
    """Sends Finish calls from a background thread, as a worker would."""

    def __init__(self, stub: pb_grpc.DrafterServiceStub) -> None:
        self._stub = stub
        self._queue: queue.Queue[pb.FinishedRequest | None] = queue.Queue()
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def finish(self, request_id: str, final_tokens: list[int]) -> None:
        self._queue.put(pb.FinishedRequest(request_id=request_id, final_tokens=final_tokens,
                                           reason=pb.FINISH_REASON_FINISHED))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._stub.Finish(pb.FinishRequest(requests=[item]), timeout=10)
            self.sent += 1

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
