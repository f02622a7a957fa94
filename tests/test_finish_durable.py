"""A Finish acknowledgement says whether the generation is durable (issue 17, item 3).

The issue's reproduction against the real `drafter serve`: finishes acknowledged, then
kill -9. Without asking, a Finish only queues (the answer says durable = 0); with
``wait_durable`` (per call) or ``--finish-durable true`` (service-wide) it answers once
every generation is in the ingest log, and none is lost to the kill.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from client_servers import VOCAB_SIZE, DrafterProcess

from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc
from verifier_client import BudgetRule, DrafterClient

pytestmark = pytest.mark.system

PROMPT, OUTPUT = 6, 20


def _generations(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB_SIZE, PROMPT + OUTPUT).tolist() for _ in range(n)]


def _finish(stub: pb_grpc.DrafterServiceStub, rid: str, tokens: list[int],
            wait: bool) -> pb.FinishResponse:  # fmt: skip
    delta = pb.RequestDelta(request_id=rid, new_tokens=tokens, prompt_length=PROMPT)
    stub.Draft(pb.DraftRequest(requests=[delta]), timeout=10)
    done = pb.FinishedRequest(request_id=rid, reason=pb.FINISH_REASON_FINISHED)
    answer: pb.FinishResponse = stub.Finish(
        pb.FinishRequest(requests=[done], wait_durable=wait), timeout=10
    )
    return answer


def _stored_after_kill_9(server: DrafterProcess) -> int:
    """Tokens the datastore holds after kill -9 (no shutdown, no drain) and a restart."""
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    server.proc = None
    server.start()
    try:
        return sum(d.num_tokens for d in server.info().datastores)
    finally:
        server.stop()


# Each stored generation: its OUTPUT tokens, the prompt's last 3 as context, one separator.
PER_GENERATION = OUTPUT + 3 + 1


def test_wait_durable_finishes_survive_kill_9(tmp_path: Path) -> None:
    server = DrafterProcess(tmp_path / "data", "--rebuild-min-tokens", "1000000000")
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.DrafterServiceStub(channel)
        for i, tokens in enumerate(_generations(100, seed=1)):
            answer = _finish(stub, f"r{i}", tokens, wait=True)
            assert (answer.ingested, answer.durable) == (1, 1)
    assert _stored_after_kill_9(server) == 100 * PER_GENERATION - 1  # none lost


def test_a_plain_finish_says_it_only_queued_and_the_service_flag_waits(tmp_path: Path) -> None:
    plain = DrafterProcess(tmp_path / "plain")
    try:
        with grpc.insecure_channel(plain.target) as channel:
            answer = _finish(pb_grpc.DrafterServiceStub(channel), "q", _generations(1, 2)[0],
                             wait=False)  # fmt: skip
        assert (answer.ingested, answer.durable) == (1, 0)  # queued, nothing promised
    finally:
        plain.stop()
    durable = DrafterProcess(tmp_path / "durable", "--finish-durable", "true",
                             "--rebuild-min-tokens", "1000000000")  # fmt: skip
    with grpc.insecure_channel(durable.target) as channel:
        stub = pb_grpc.DrafterServiceStub(channel)
        for i, tokens in enumerate(_generations(30, seed=3)):
            assert _finish(stub, f"d{i}", tokens, wait=False).durable == 1
    assert _stored_after_kill_9(durable) == 30 * PER_GENERATION - 1


def test_the_client_finishes_durably_on_request(tmp_path: Path) -> None:
    server = DrafterProcess(tmp_path / "data", "--rebuild-min-tokens", "1000000000")
    client = DrafterClient(server.target, deadline_ms=60_000, budget=BudgetRule.fixed(4))
    client.wait_ready()
    for i, tokens in enumerate(_generations(40, seed=4)):
        client.add_request(f"c{i}", tokens[:PROMPT])
        assert client.step({f"c{i}": tokens[PROMPT:]}).ok
        client.finish(f"c{i}", durable=True)
    assert client.flush(30)  # every Finish answered: each generation was in the log
    client.close()
    assert _stored_after_kill_9(server) == 40 * PER_GENERATION - 1
