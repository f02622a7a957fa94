"""Held request state: bytes per context token the service accounts vs what it costs in RSS.

Starts a real ``drafter serve`` per row (so rows do not share a heap), holds ``contexts``
requests of ``tokens`` tokens each (each sent in one Draft call, as a decode worker's
first step sends its prompt), then reads the server's resident set size (VmRSS) and its
``sssd_drafter_request_state_bytes`` gauge. One JSON line per (kind, tokens):

* ``random``: uniform token ids (every n-gram new: the input trie's worst case);
* ``repetitive``: a 50-token phrase repeated (n-grams shared: its best case);
* ``real``: consecutive documents of ``--corpus`` (model outputs of real chats and code).

``rss_over_accounted`` is what issue 29 bounds (at most 1.5). Run::

    python -m drafter_bench.state_memory \
        --corpus ../shared/data/corpus/datastore_llama3_family.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt

from drafter_bench.token_records import iter_documents
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

VOCAB = 128256


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _gauge(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"no {name}")


def _contexts(kind: str, tokens: int, count: int, corpus: str | None,
              rng: np.random.Generator) -> Iterator[npt.NDArray[np.int32]]:  # fmt: skip
    if kind == "random":
        for _ in range(count):
            yield rng.integers(0, VOCAB, tokens, dtype=np.int32)
    elif kind == "repetitive":
        for _ in range(count):
            phrase = rng.integers(0, VOCAB, 50, dtype=np.int32)
            yield np.resize(phrase, tokens)
    else:
        if corpus is None:
            raise SystemExit("--corpus is needed for real contexts")
        docs = iter_documents(corpus, vocab_size=VOCAB)
        for _ in range(count):
            parts, held = [], 0
            while held < tokens:
                doc = next(docs)
                parts.append(doc)
                held += len(doc)
            yield np.concatenate(parts)[:tokens]


def send_refused_probe(stub: pb_grpc.DrafterServiceStub, tokens: int, vocab_size: int) -> None:
    """Sends one Draft message of a ``tokens``-token context that the service refuses at
    the edge (its last token is out of the vocabulary) before any request state exists:
    its receive buffer, parsed message and token array are then in an RSS baseline taken
    after it, so what grows after that is the state held, not one call's transients.
    Raises unless it was refused INVALID_ARGUMENT."""
    probe = pb.RequestDelta(request_id="probe", budget=8,
                            new_tokens=[*range(tokens - 1), vocab_size])  # fmt: skip
    try:
        stub.Draft(pb.DraftRequest(requests=[probe]), timeout=600)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise
        return
    raise RuntimeError("the out-of-vocabulary probe was not refused")


def measure(kind: str, tokens: int, contexts: int, corpus: str | None) -> dict[str, object]:
    rng = np.random.default_rng(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "drafter_service.drafter_cli", "serve",
               "--host", "127.0.0.1", "--port", "0", "--metrics-port", str(port),
               "--admin-port", "-1", "--data-dir", str(Path(tmp) / "data"),
               "--vocab-size", str(VOCAB), "--max-request-state-bytes", str(64 << 30),
               "--request-ttl-s", "3600"]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            target = line.split()[-1]
            with grpc.insecure_channel(target, options=[
                ("grpc.max_send_message_length", 1 << 30),
                ("grpc.max_receive_message_length", 1 << 30),
            ]) as channel:  # fmt: skip
                stub = pb_grpc.DrafterServiceStub(channel)
                warm = pb.RequestDelta(request_id="warm", budget=8, new_tokens=[1, 2, 3])
                stub.Draft(pb.DraftRequest(requests=[warm]), timeout=60)
                done = pb.FinishedRequest(request_id="warm", reason=pb.FINISH_REASON_ABORTED)
                stub.Finish(pb.FinishRequest(requests=[done]))
                send_refused_probe(stub, tokens, VOCAB)
                time.sleep(0.5)
                before = _rss(proc.pid)
                for i, ctx in enumerate(_contexts(kind, tokens, contexts, corpus, rng)):
                    delta = pb.RequestDelta(request_id=f"r{i}", budget=8,
                                            new_tokens=ctx.tolist())  # fmt: skip
                    stub.Draft(pb.DraftRequest(requests=[delta]), timeout=600)
                time.sleep(0.5)
                after = _rss(proc.pid)
                accounted = _gauge(port, "sssd_drafter_request_state_bytes")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    held = tokens * contexts
    return {
        "bench": "state_memory", "kind": kind, "tokens_per_context": tokens,
        "contexts": contexts, "accounted_bytes": int(accounted),
        "rss_growth_bytes": after - before,
        "accounted_per_token": round(accounted / held, 1),
        "rss_per_token": round((after - before) / held, 1),
        "rss_over_accounted": round((after - before) / accounted, 3),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default="random,repetitive,real")
    p.add_argument("--tokens", default="1000,100000,1000000",
                   help="context lengths (comma-separated)")
    p.add_argument("--total", type=int, default=2_000_000,
                   help="tokens held per row (contexts = total / tokens, at least 1)")
    p.add_argument("--corpus", help="JSONL(.gz) of output_ids records, for real contexts")
    p.add_argument("--out", type=Path, help="append the JSON lines to this file too")
    args = p.parse_args()
    for kind in args.kinds.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            row = measure(kind, tokens, max(1, args.total // tokens), args.corpus)
            text = json.dumps(row)
            print(text, flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(text + "\n")


if __name__ == "__main__":
    main()
