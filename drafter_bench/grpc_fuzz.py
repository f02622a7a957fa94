"""Fuzzes the gRPC surface of a running `drafter serve` with random and mutated messages.

Every method gets raw bytes (random, or a valid message with a few bytes changed); the
answer's status code is counted. The service must never answer UNKNOWN or INTERNAL
(a bug: an exception escaped), and must still serve afterwards. Prints one JSON line.

    python drafter_bench/grpc_fuzz.py --target 127.0.0.1:50051 --messages 40000

The test suite runs it with 2,000 messages (tests/test_undecodable.py); longer runs are
a benchmark (the number of messages per second is reported too).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import grpc

METHODS = ("Draft", "Finish", "Ingest", "GetServiceInfo")
SERVICE = "/sssd_drafter.v1.DrafterService/"
SEEDS = (
    bytes.fromhex("0a0a0a0172120501020304051810"),  # a DraftRequest with one delta
    bytes.fromhex("0a03726571"),
    b"",
)


def payload(rng: random.Random) -> bytes:
    """Random bytes, or a seed message with one to three bytes changed or added."""
    if rng.random() < 0.5:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
    base = bytearray(rng.choice(SEEDS))
    for _ in range(rng.randrange(1, 4)):
        if base and rng.random() < 0.8:
            base[rng.randrange(len(base))] = rng.getrandbits(8)
        else:
            base.insert(rng.randrange(len(base) + 1), rng.getrandbits(8))
    return bytes(base)


def fuzz(target: str, messages: int, seed: int) -> dict[str, object]:
    """Sends ``messages`` payloads round-robin over the methods; counts the answers."""
    rng = random.Random(seed)
    codes: dict[str, int] = {}
    start = time.perf_counter()
    with grpc.insecure_channel(target) as channel:
        calls = {m: channel.unary_unary(SERVICE + m) for m in METHODS}
        for i in range(messages):
            try:
                calls[METHODS[i % len(METHODS)]](payload(rng), timeout=10)
                code = "OK"
            except grpc.RpcError as err:
                code = err.code().name
            codes[code] = codes.get(code, 0) + 1
        seconds = time.perf_counter() - start
        info = channel.unary_unary(SERVICE + "GetServiceInfo")
        try:
            info(b"", timeout=10)
            alive = True
        except grpc.RpcError:
            alive = False
    return {
        "messages": messages,
        "codes": dict(sorted(codes.items())),
        "unknown_or_internal": codes.get("UNKNOWN", 0) + codes.get("INTERNAL", 0),
        "alive": alive,
        "messages_per_s": round(messages / seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port of a running drafter")
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    result = fuzz(args.target, args.messages, args.seed)
    print(json.dumps(result), flush=True)
    return 0 if result["alive"] and not result["unknown_or_internal"] else 1


if __name__ == "__main__":
    sys.exit(main())
