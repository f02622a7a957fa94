"""What token-less callers sending big messages cost `drafter serve` and its clients.

Starts `drafter serve` with a tokens file, times an authenticated client's Draft calls
alone, then again while ``--flooders`` callers without a token each send
``--message-mb`` MB Ingest requests in a loop (each on its own connection), sampling the
server's resident memory. The server refuses those calls before reading their messages
(``CallGate`` in drafter_service/edge/wire.py), so its memory and the Draft latency
should barely move. One JSON line:

    python drafter_bench/unauth_flood.py --flooders 8 --message-mb 48 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import grpc

from drafter_bench.redis_server import listening_address
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

TOKEN = "bench-token-0123456789"
CONTEXT = [10, 11, 12, 13, 14, 15] * 4


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A field of /proc/PID/status (VmRSS: resident now, VmHWM: peak), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(root: Path) -> tuple[subprocess.Popen[str], str]:
    tokens = root / "tokens"
    tokens.write_text(f"bench {TOKEN}\n")
    exe = Path(sys.executable).with_name("drafter")
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", "0", "--data-dir", str(root / "data"), "--vocab-size",
         "1000", "--metrics-port", "-1", "--admin-port", "-1", "--grpc-tokens-file", str(tokens)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    return proc, listening_address(proc)


def draft_ms(stub: pb_grpc.DrafterServiceStub, seconds: float) -> list[float]:
    """Latencies of back-to-back one-request Draft calls for ``seconds``."""
    bearer = (("authorization", f"Bearer {TOKEN}"),)
    step = pb.DraftRequest(requests=[pb.RequestDelta(request_id="r", known_length=len(CONTEXT),
                                                     budget=8)])  # fmt: skip
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        stub.Draft(step, metadata=bearer, timeout=30)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def flood(target: str, megabytes: int, stop: EventType, refused: Synchronized[int]) -> None:
    """One token-less caller (a process of its own): big Ingest calls until ``stop``."""
    message = b"\x00" * (megabytes << 20)  # never parsed by the server
    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) as channel:
        ingest = channel.unary_unary("/sssd_drafter.v1.DrafterService/Ingest")
        while not stop.is_set():
            try:
                ingest(message, timeout=30)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    with refused.get_lock():
                        refused.value += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flooders", type=int, default=8)
    parser.add_argument("--message-mb", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, target = start_server(Path(tmp))
        try:
            with grpc.insecure_channel(target) as channel:
                stub = pb_grpc.DrafterServiceStub(channel)
                grpc.channel_ready_future(channel).result(timeout=30)
                bearer = (("authorization", f"Bearer {TOKEN}"),)
                first = pb.RequestDelta(request_id="r", new_tokens=CONTEXT, budget=8)
                stub.Draft(pb.DraftRequest(requests=[first]), metadata=bearer, timeout=30)
                cpu_alone = cpu_s(proc.pid)
                alone = draft_ms(stub, args.seconds / 2)
                cpu_alone = cpu_s(proc.pid) - cpu_alone
                idle_mb = rss_mb(proc.pid)
                spawn = multiprocessing.get_context("spawn")
                stop, refused = spawn.Event(), spawn.Value("q", 0)
                flooders = [
                    spawn.Process(target=flood, args=(target, args.message_mb, stop, refused))
                    for _ in range(args.flooders)
                ]
                for flooder in flooders:
                    flooder.start()
                deadline = time.monotonic() + 120  # measure once every flooder is sending
                while refused.value < args.flooders and time.monotonic() < deadline:
                    time.sleep(0.1)
                refused_before = refused.value
                samples: list[float] = []
                sampler_stop = threading.Event()

                def sample() -> None:
                    while not sampler_stop.wait(0.1):
                        samples.append(rss_mb(proc.pid))

                sampler = threading.Thread(target=sample)
                sampler.start()
                cpu_flood = cpu_s(proc.pid)
                flooded = draft_ms(stub, args.seconds)
                cpu_flood = cpu_s(proc.pid) - cpu_flood
                refused_during = refused.value - refused_before
                stop.set()
                sampler_stop.set()
                sampler.join()
                for flooder in flooders:
                    flooder.join(60)
                peak_mb = rss_mb(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(30)
    q = statistics.quantiles
    print(json.dumps({
        "benchmark": "unauth_flood", "grpc": grpc.__version__, "flooders": args.flooders,
        "message_mb": args.message_mb, "seconds": args.seconds,
        "refused_calls_during_flood": refused_during, "server_rss_mb_idle": round(idle_mb, 1),
        "server_rss_mb_max_flood": round(max(samples, default=idle_mb), 1),
        "server_peak_rss_mb": round(peak_mb, 1),
        "draft_p50_ms_alone": round(statistics.median(alone), 3),
        "draft_p50_ms_flood": round(statistics.median(flooded), 3),
        "draft_p99_ms_alone": round(q(alone, n=100)[98], 3) if len(alone) > 1 else None,
        "draft_p99_ms_flood": round(q(flooded, n=100)[98], 3) if len(flooded) > 1 else None,
        "draft_calls_alone": len(alone), "draft_calls_flood": len(flooded),
        "server_cpu_s_alone": round(cpu_alone, 2), "server_cpu_s_flood": round(cpu_flood, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
