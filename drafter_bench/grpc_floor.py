"""The Python gRPC floor under ``drafter-bench load``: a null DrafterService.

Answers Draft and DraftStream with empty trees (no drafting, no state) on
loopback and runs the same load driver (the real client) against it, so the
step time it prints is what gRPC and protobuf in Python cost on this machine
before any drafting. Compare with
``drafter-bench load`` against the real service.

    python drafter_bench/grpc_floor.py --data ../shared/data/dev/chat_alpacaeval_llama3_8b.jsonl.gz
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import grpc
import numpy as np

from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc


def _null_answer(request: pb.DraftRequest) -> pb.DraftResponse:
    """Every request OK with an empty tree, packed like the real service's answers."""
    packed = request.packed
    n = len(packed.request_ids)
    lengths = np.frombuffer(packed.known_lengths, "<u4") + np.frombuffer(
        packed.new_token_counts, "<u4"
    )
    return pb.DraftResponse(step=request.step, packed=pb.PackedDrafts(
        statuses=bytes([pb.DRAFT_STATUS_OK]) * n, lengths=lengths.astype("<u4").tobytes(),
        node_counts=bytes(4 * n)))  # fmt: skip


class NullService(pb_grpc.DrafterServiceServicer):
    async def DraftStream(
        self, request_iterator: AsyncIterator[pb.DraftRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DraftResponse]:
        async for request in request_iterator:
            yield _null_answer(request)

    async def Finish(
        self, request: pb.FinishRequest, context: grpc.aio.ServicerContext
    ) -> pb.FinishResponse:
        return pb.FinishResponse()

    async def Draft(
        self, request: pb.DraftRequest, context: grpc.aio.ServicerContext
    ) -> pb.DraftResponse:
        return _null_answer(request)

    async def Ingest(
        self, request: pb.IngestRequest, context: grpc.aio.ServicerContext
    ) -> pb.IngestResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the floor serves DraftStream only")
        raise AssertionError("abort raises")

    async def GetServiceInfo(
        self, request: pb.GetServiceInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServiceInfoResponse:
        return pb.GetServiceInfoResponse(
            version="null", tokenizer=pb.TokenizerInfo(vocab_size=128256),
            limits=pb.Limits(max_requests_per_call=4096, max_tokens_per_request=1 << 20,
                             max_budget=64, max_message_bytes=64 << 20))  # fmt: skip


async def serve(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_DrafterServiceServicer_to_server(NullService(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--port", type=int, default=50990)
    parser.add_argument("--mode", choices=("stream", "unary"), default="stream")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.port))
        return
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--data", args.data,
                               "--port", str(args.port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    try:
        subprocess.run([sys.executable, "-m", "drafter_bench.bench_cli", "load", "--json",
                        "--target", f"127.0.0.1:{args.port}", "--data", args.data,
                        "--batch", str(args.batch), "--steps", str(args.steps),
                        "--mode", args.mode], check=True)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
