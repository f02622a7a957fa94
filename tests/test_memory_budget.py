"""Request state is bounded in bytes (issue 17, item 4), against the real `drafter serve`:
abandoned long requests are evicted least recently used first (their clients get RESYNC),
a call that alone needs more than the budget is RESOURCE_EXHAUSTED with the budget named,
and the budget and its use are metrics."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from client_servers import VOCAB_SIZE, DrafterProcess

from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc

BUDGET = 1 << 20  # bytes: 131,072 context tokens at 8 bytes each
LONG = 10_000  # tokens per abandoned request: 80 KB of state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        lines = page.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + " ")
               or line.startswith(name + "{"))  # fmt: skip


def test_request_state_stays_within_its_byte_budget(tmp_path: Path) -> None:
    port = _free_port()
    server = DrafterProcess(tmp_path / "data", "--max-request-state-bytes", str(BUDGET),
                            "--metrics-port", str(port))  # fmt: skip
    rng = np.random.default_rng(0)
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.DrafterServiceStub(channel)
            for i in range(60):  # 60 abandoned 10k-token requests: 4.8 MB asked for
                tokens = rng.integers(0, VOCAB_SIZE, LONG).tolist()
                delta = pb.RequestDelta(request_id=f"r{i}", budget=4, new_tokens=tokens)
                stub.Draft(pb.DraftRequest(requests=[delta]), timeout=10)
            assert _metric(port, "sssd_drafter_request_state_bytes") <= BUDGET
            assert _metric(port, "sssd_drafter_request_state_budget_bytes") == BUDGET
            evicted = _metric(port, 'sssd_drafter_request_states_evicted_total{reason="bytes"}')
            assert evicted >= 60 - BUDGET // (8 * LONG)

            def status(rid: str) -> int:
                delta = pb.RequestDelta(request_id=rid, known_length=LONG, new_tokens=[1])
                answer = stub.Draft(pb.DraftRequest(requests=[delta]), timeout=10)
                return int(answer.drafts[0].status)

            assert status("r0") == pb.DRAFT_STATUS_RESYNC  # the least recently used: evicted
            assert status("r59") == pb.DRAFT_STATUS_OK  # the newest: kept

            tokens = rng.integers(0, VOCAB_SIZE, 200_000).tolist()
            huge = pb.RequestDelta(request_id="huge", new_tokens=tokens)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Draft(pb.DraftRequest(requests=[huge]), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"budget of {BUDGET} bytes (--max-request-state-bytes)" in str(
                refused.value.details()
            )
        server.info()  # still serving
    finally:
        server.stop()
