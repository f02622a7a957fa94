"""Request state is bounded in bytes (issue 17, item 4), against the real `drafter serve`:
abandoned long requests are evicted least recently used first (their clients get RESYNC),
a call that alone needs more than the budget is RESOURCE_EXHAUSTED with the budget named,
and the budget and its use are metrics."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from client_servers import VOCAB_SIZE, DrafterProcess

from drafter_bench.state_memory import send_refused_probe
from drafter_service.engine.request_table import RECENT_BYTES_PER_TOKEN
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

pytestmark = pytest.mark.system

BUDGET = 16 << 20  # bytes: ~27,000 context tokens of random text
LONG = 10_000  # tokens per abandoned request: ~6 MB of state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        lines = page.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + " ")
               or line.startswith(name + "{"))  # fmt: skip


@contextmanager
def _serving(
    tmp_path: Path, *extra: str
) -> Iterator[tuple[DrafterProcess, pb_grpc.DrafterServiceStub, int]]:
    """`drafter serve` with ``extra`` flags, a stub on it and its metrics port."""
    port = _free_port()
    server = DrafterProcess(tmp_path / "data", *extra, "--metrics-port", str(port))
    try:
        with grpc.insecure_channel(server.target) as channel:
            yield server, pb_grpc.DrafterServiceStub(channel), port
    finally:
        server.stop()


def test_request_state_stays_within_its_byte_budget(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with _serving(tmp_path, "--max-request-state-bytes", str(BUDGET)) as (server, stub, port):
        for i in range(60):  # 60 abandoned 10k-token requests: ~380 MB asked for
            tokens = rng.integers(0, VOCAB_SIZE, LONG).tolist()
            delta = pb.RequestDelta(request_id=f"r{i}", budget=4, new_tokens=tokens)
            stub.Draft(pb.DraftRequest(requests=[delta]), timeout=10)
        assert _metric(port, "sssd_drafter_request_state_bytes") <= BUDGET
        assert _metric(port, "sssd_drafter_request_state_budget_bytes") == BUDGET
        evicted = _metric(port, 'sssd_drafter_request_states_evicted_total{reason="bytes"}')
        assert evicted >= 60 - BUDGET // (400 * LONG)  # >= 400 bytes a random token

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


def _rss(server: DrafterProcess) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _held(stub: pb_grpc.DrafterServiceStub, rid: str, tokens: np.ndarray) -> bool:
    """Starts request ``rid`` with ``tokens``; whether it was answered OK."""
    delta = pb.RequestDelta(request_id=rid, budget=4, new_tokens=tokens.tolist())
    answer = stub.Draft(pb.DraftRequest(requests=[delta]), timeout=60)
    return bool(answer.drafts[0].status == pb.DRAFT_STATUS_OK)


def test_the_budget_counts_what_held_context_really_costs(tmp_path: Path) -> None:
    """Issue 29, item 1: 8 bytes a token were counted where a context of new n-grams costs
    ~600 (its input trie holds every n-gram up to 16 tokens); now the drafter measures
    each state, so the gauge follows RSS for random and repetitive contexts alike."""
    rng = np.random.default_rng(1)
    with _serving(tmp_path) as (server, stub, port):
        _held(stub, "warm", np.arange(100, dtype=np.int32))
        base_rss = _rss(server)
        base = _metric(port, "sssd_drafter_request_state_bytes")
        for i in range(4):  # 200k tokens of random context
            assert _held(stub, f"random{i}", rng.integers(0, VOCAB_SIZE, 50_000))
        random_bytes = _metric(port, "sssd_drafter_request_state_bytes") - base
        random_rss = _rss(server) - base_rss
        phrase = rng.integers(0, VOCAB_SIZE, 50)
        assert _held(stub, "repetitive", np.resize(phrase, 200_000))
        repetitive_bytes = (_metric(port, "sssd_drafter_request_state_bytes") - base
                            - random_bytes)  # fmt: skip
    tier = RECENT_BYTES_PER_TOKEN  # the recent tier's bound, counted for every token
    assert 400 + tier <= random_bytes / 200_000 <= 1300 + tier  # 8 before
    assert repetitive_bytes / 200_000 <= 40 + tier  # shared n-grams cost little
    assert random_rss <= 1.5 * random_bytes  # the measured figure bounds memory


def test_a_small_budget_bounds_resident_memory(tmp_path: Path) -> None:
    """30 abandoned 20k-token random contexts (~380 MB of input tries) under a 32 MiB
    budget: the held states stay within it, and so does the process's growth (1.5x)."""
    budget = 32 << 20
    rng = np.random.default_rng(2)
    with _serving(tmp_path, "--max-request-state-bytes", str(budget)) as (server, stub, port):
        _held(stub, "warm", np.arange(100, dtype=np.int32))
        base_rss = _rss(server)
        for i in range(30):
            assert _held(stub, f"r{i}", rng.integers(0, VOCAB_SIZE, 20_000))
            assert _metric(port, "sssd_drafter_request_state_bytes") <= budget
        growth = _rss(server) - base_rss
        evicted = _metric(port, 'sssd_drafter_request_states_evicted_total{reason="bytes"}')
    assert evicted >= 20
    assert growth <= 1.5 * budget


def test_a_call_that_may_need_more_than_the_budget_is_refused_before_it_allocates(
    tmp_path: Path,
) -> None:
    """One call may allocate up to 1,288 bytes a new token before the drafter measures
    it: 4 requests of 100k tokens (~0.5 GB at worst) under a 64 MiB budget are refused
    whole, before anything is held (8 bytes a token admitted them: 3.2 MB)."""
    budget = 64 << 20
    rng = np.random.default_rng(3)
    with _serving(tmp_path, "--max-request-state-bytes", str(budget)) as (_, stub, port):
        deltas = [pb.RequestDelta(request_id=f"big{i}", budget=4,
                                  new_tokens=rng.integers(0, VOCAB_SIZE, 100_000).tolist())
                  for i in range(4)]  # fmt: skip
        with pytest.raises(grpc.RpcError) as refused:
            stub.Draft(pb.DraftRequest(requests=deltas), timeout=60)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-request-state-bytes" in str(refused.value.details())
        assert _metric(port, "sssd_drafter_request_state_bytes") == 0
        assert _metric(port, "sssd_drafter_active_requests") == 0
        assert _held(stub, "small", rng.integers(0, VOCAB_SIZE, 1_000))


def test_million_token_contexts_of_repetitive_text_stay_within_the_bound(tmp_path: Path) -> None:
    """Repetitive text holds ~4 bytes a token, so one large call's freed buffers, if
    kept resident, dwarf it: glibc's dynamic mmap threshold kept them (two 1M-token
    contexts: 1.8x the counted bytes in RSS) until `drafter serve` fixed the threshold."""
    rng = np.random.default_rng(2)
    with _serving(tmp_path) as (server, stub, port):
        _held(stub, "warm", np.arange(100, dtype=np.int32))
        send_refused_probe(stub, 1_000_000, VOCAB_SIZE)  # one call's buffers: baseline
        base_rss = _rss(server)
        base = _metric(port, "sssd_drafter_request_state_bytes")
        for i in range(2):
            assert _held(stub, f"long{i}", np.resize(rng.integers(0, VOCAB_SIZE, 50),
                                                     1_000_000))  # fmt: skip
        held = _metric(port, "sssd_drafter_request_state_bytes") - base
        growth = _rss(server) - base_rss
    assert held >= 8_000_000  # the token buffers at least
    assert growth <= 1.5 * held, (growth, held)
