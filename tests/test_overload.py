"""Overload degrades gracefully (issue 29, item 8): a Draft call whose deadline passes
while it waits for the drafting thread is skipped, not run for nobody; one that arrives
behind more queued work than its deadline (or ``max_queue_s``) leaves time for is refused
at once, before it changes anything. The real engine, job runner and native drafter; the
drafting thread is held busy by a gate the test opens, never by a sleep."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from service_support import (
    LoopThread,
    config,
    datastore_held,
    delta,
    draft_held,
    rpc_error,
    serving,
    wait_until_taken,
)

from drafter_service import Drafter
from drafter_service.edge.validation import parse_draft_request
from drafter_service.edge.wire import SERVICE_NAME
from drafter_service.engine.call_errors import DeadlineExceeded, ResourceExhausted
from drafter_service.engine.calls import CallLimits, DraftCall
from drafter_service.engine.catalog import Catalog, DatastoreSlot
from drafter_service.engine.draft_engine import DraftEngine
from drafter_service.engine.ingest_queue import GenerationIngester
from drafter_service.engine.request_table import RequestTable
from drafter_service.metrics.drafter_metrics import DrafterMetrics
from drafter_service.snapshot.store import TokenizerIdentity
from sssd_drafter.v1 import drafter_pb2 as pb

VOCAB = 1000
NAME = "default"
_GATES: list[threading.Event] = []
NOW = [1000.0]  # the engine's clock: moved by the tests only


@pytest.fixture
def engine() -> Iterator[DraftEngine]:
    drafter = Drafter(VOCAB, num_threads=1)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-test")
    catalog = Catalog(TokenizerIdentity("test", VOCAB, ""),
                      {NAME: DatastoreSlot(NAME, drafter, None, executor)})  # fmt: skip
    ingester = GenerationIngester(16)
    yield DraftEngine(catalog, RequestTable(600, 1000), ingester,
                      max_inflight_calls=64, metrics=DrafterMetrics(), inline_max_work=0,
                      max_queue_s=1.0,
                      clock=lambda: NOW[0])  # fmt: skip
    for gate in _GATES:  # a failed test leaves none closed
        gate.set()
    executor.shutdown(wait=True)
    ingester.close()


def parsed(engine: DraftEngine, request: pb.DraftRequest) -> DraftCall:
    """``request`` validated as the gRPC edge does, against the fixture's limits."""
    return parse_draft_request(request, CallLimits(engine.catalog, 1024, 1 << 20, 256, NAME))


def call(request_id: str, tokens: int, budget: int = 16) -> pb.DraftRequest:
    rng = np.random.default_rng(len(request_id))
    delta = pb.RequestDelta(request_id=request_id, budget=budget,
                            new_tokens=rng.integers(0, VOCAB, tokens).tolist())  # fmt: skip
    return pb.DraftRequest(requests=[delta])


def hold_drafting_thread(engine: DraftEngine) -> threading.Event:
    """Occupies the datastore's worker thread until the returned event is set."""
    gate = threading.Event()
    _GATES.append(gate)
    engine.catalog.slots[NAME].executor.submit(gate.wait)
    return gate


def test_a_call_whose_deadline_passed_in_the_queue_is_skipped(engine: DraftEngine) -> None:
    async def go() -> None:
        gate = hold_drafting_thread(engine)
        deadline = NOW[0] + 0.05
        draft = asyncio.ensure_future(
            engine.draft(parsed(engine, call("late", 5_000)), deadline)
        )
        await asyncio.sleep(0)  # planned and queued behind the gate
        assert engine.table.get("late") is not None
        NOW[0] += 0.1  # the deadline passes while the call waits for its turn
        gate.set()
        with pytest.raises(DeadlineExceeded, match="deadline passed before its turn"):
            await draft
        # Nothing was built for nobody; the table forgot it too (RESYNC next time).
        assert "late" not in engine.catalog.slots[NAME].drafter
        assert engine.table.get("late") is None and engine.table.bytes == 0
        # The next call is served as usual.
        answer = await engine.draft(parsed(engine, call("next", 100)))
        assert answer.places[0] is not None
        await engine.close()

    asyncio.run(go())


def test_a_call_that_cannot_be_answered_in_time_is_refused_at_once(engine: DraftEngine) -> None:
    async def go() -> None:
        gate = hold_drafting_thread(engine)
        queued = [asyncio.ensure_future(engine.draft(
            parsed(engine, call(f"q{i}", 20_000)))) for i in range(4)
        ]  # fmt: skip
        await asyncio.sleep(0)
        wait = engine._runner.expected_wait_s()
        assert wait > 0  # 4 x 2,500 units at the measured (seeded) speed
        soon = NOW[0] + wait / 4  # the queue takes 4x the time left: hopeless
        with pytest.raises(DeadlineExceeded, match="queued ahead of this call"):
            await engine.draft(parsed(engine, call("hurry", 10)), soon)
        assert engine.table.get("hurry") is None  # refused before anything changed
        engine.max_queue_s = wait / 2
        with pytest.raises(ResourceExhausted, match="over max_queue_ms"):
            await engine.draft(parsed(engine, call("patient", 10)))
        assert engine.table.get("patient") is None
        gate.set()
        for answer in await asyncio.gather(*queued):  # no deadline: all answered
            assert answer.places[0] is not None
        # The queue drained: the next call is taken, whatever its deadline.
        assert engine._runner.expected_wait_s() == 0
        answer = await engine.draft(parsed(engine, call("after", 10)),
                                    NOW[0] + 5)  # fmt: skip
        assert answer.places[0] is not None
        await engine.close()

    asyncio.run(go())


def test_a_call_past_its_deadline_on_arrival_is_not_started(engine: DraftEngine) -> None:
    async def go() -> None:
        with pytest.raises(DeadlineExceeded, match="deadline"):
            await engine.draft(parsed(engine, call("gone", 10)),
                               NOW[0] - 0.001)  # fmt: skip
        assert engine.table.get("gone") is None
        await engine.close()

    asyncio.run(go())


def step(request_id: str, known: int, tokens: list[int]) -> pb.DraftRequest:
    delta = pb.RequestDelta(request_id=request_id, budget=16, known_length=known,
                            new_tokens=tokens)  # fmt: skip
    return pb.DraftRequest(requests=[delta])


def test_an_expired_call_leaves_a_later_restart_of_its_request_alone(
    engine: DraftEngine,
) -> None:
    """A client that restarts one request in two calls at once (the overload benchmark's
    callers reuse request ids) whose first call expires in the queue: the second call's
    restart stands, in the table and in the drafter, and the request can be restarted
    again (it was forgotten by the table but kept by the drafter: 'already started',
    INTERNAL, on every later restart)."""

    async def go() -> None:
        gate = hold_drafting_thread(engine)
        first = asyncio.ensure_future(engine.draft(
            parsed(engine, call("r", 500)), NOW[0] + 0.05))  # fmt: skip
        second = asyncio.ensure_future(
            engine.draft(parsed(engine, call("r", 500)))
        )
        await asyncio.sleep(0)
        NOW[0] += 0.1  # the first call's deadline passes in the queue
        gate.set()
        with pytest.raises(DeadlineExceeded):
            await first
        assert (await second).places[0] is not None
        assert engine.table.get("r") is not None and "r" in engine.catalog.slots[NAME].drafter
        again = await engine.draft(parsed(engine, call("r", 500)))
        assert again.places[0] is not None and again.lengths == [500]
        await engine.close()

    asyncio.run(go())


def test_an_append_to_a_request_an_expired_call_dropped_answers_resync(
    engine: DraftEngine,
) -> None:
    """Two appends to one request in flight at once, the first expiring in the queue: it
    drops the request, so the second finds nothing to append to and answers RESYNC (not
    INTERNAL); the request then restarts as usual."""

    async def go() -> None:
        await engine.draft(parsed(engine, step("r", 0, [1, 2, 3])))
        gate = hold_drafting_thread(engine)
        first = asyncio.ensure_future(engine.draft(
            parsed(engine, step("r", 3, [4])), NOW[0] + 0.05))  # fmt: skip
        second = asyncio.ensure_future(
            engine.draft(parsed(engine, step("r", 4, [5])))
        )
        await asyncio.sleep(0)
        NOW[0] += 0.1
        gate.set()
        with pytest.raises(DeadlineExceeded):
            await first
        answer = await second
        assert answer.places == [None] and answer.lengths == [0]  # RESYNC
        assert engine.table.get("r") is None and "r" not in engine.catalog.slots[NAME].drafter
        again = await engine.draft(parsed(engine, step("r", 0, [1, 2, 3, 4, 5])))
        assert again.places[0] is not None and again.lengths == [5]
        await engine.close()

    asyncio.run(go())


# -- through a real server ------------------------------------------------------------


def test_past_max_concurrent_rpcs_grpc_refuses_before_the_service_sees_the_call(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """``max_concurrent_rpcs``: with one call open (held on the drafting thread), the next
    is RESOURCE_EXHAUSTED by gRPC itself, without a message parsed or an engine call."""
    with serving(loop_thread, config(tmp_path, max_concurrent_rpcs=1, inline_max_work=0)) as s:
        with draft_held(s, delta("a", [1, 2, 3])) as first:
            refused = rpc_error(s.draft, delta("b", [1, 2, 3]))
            assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused
            assert s.server.engine is not None and s.server.engine.inflight_calls == 1
        assert first.result(timeout=60).drafts[0].length == 3
        assert s.draft(delta("b", [1, 2, 3])).drafts[0].length == 3  # the slot is free again


def test_an_overloaded_service_refuses_before_parsing_the_message(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """At ``max_inflight_calls`` a Draft call is refused for the load before its message is
    received (a unary call: the load gate; a stream's step: before it is parsed), so a
    refusal under overload costs no parsing: an invalid message, and bytes that are no
    message at all, answer RESOURCE_EXHAUSTED, and INVALID_ARGUMENT once there is room."""
    with serving(loop_thread, config(tmp_path, max_inflight_calls=1, inline_max_work=0)) as s:
        bad = delta("bad", [VOCAB + 5])  # a token outside the vocabulary
        raw = s.channel.unary_unary(f"/{SERVICE_NAME}/Draft")  # bytes both ways
        raw_stream = s.channel.stream_stream(f"/{SERVICE_NAME}/DraftStream")

        def stream_error(message: bytes) -> grpc.RpcError:
            return rpc_error(lambda: list(raw_stream(iter([message]), timeout=60)))

        gate = s.server.gate
        with draft_held(s, delta("a", [1, 2, 3])) as first:
            unary = (rpc_error(s.draft, bad), rpc_error(raw, b"\xff" * 6))
            assert gate.refused_unread == 2  # neither message was read
            for refused in (*unary, stream_error(b"\xff" * 6)):
                assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused
                assert "max_inflight_calls (1)" in str(refused.details())
        assert first.result(timeout=60).drafts[0].length == 3
        assert rpc_error(s.draft, bad).code() is grpc.StatusCode.INVALID_ARGUMENT
        for garbage in (rpc_error(raw, b"\xff" * 6), stream_error(b"\xff" * 6)):
            assert garbage.code() is grpc.StatusCode.INVALID_ARGUMENT, garbage
            assert "not a valid" in str(garbage.details())
        assert gate.refused_unread == 2


def test_with_authentication_an_overloaded_service_refuses_a_unary_draft_for_its_load(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """With bearer tokens on, the load gate's refusal of a unary Draft call still answers
    RESOURCE_EXHAUSTED to an authenticated caller (and UNAUTHENTICATED to a stranger)."""
    tokens = tmp_path / "tokens"
    tokens.write_text("alpha alpha-token-0123456789\n")
    bearer = (("authorization", "Bearer alpha-token-0123456789"),)
    settings = config(tmp_path / "data", max_inflight_calls=1, inline_max_work=0,
                      grpc_tokens_file=tokens)  # fmt: skip
    with serving(loop_thread, settings) as s:
        request = pb.DraftRequest(requests=[delta("a", [1, 2, 3])])
        with datastore_held(s):
            first = s.stub.Draft.future(request, metadata=bearer, timeout=60)
            wait_until_taken(s)
            refused = rpc_error(s.stub.Draft, request, metadata=bearer, timeout=60)
            assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused
            assert "max_inflight_calls (1)" in str(refused.details())
            stranger = rpc_error(s.stub.Draft, request, timeout=60)
            assert stranger.code() is grpc.StatusCode.UNAUTHENTICATED, stranger
        assert first.result(timeout=60).drafts[0].length == 3
        assert s.server.gate.refused_unread == 1


def test_calls_past_max_pending_rpcs_are_refused_by_grpc_while_the_loop_is_busy(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """``max_pending_rpcs``: while the service's event loop is busy (held here by a
    callback the test releases), calls it has not taken up wait in gRPC's core; past the
    bound, gRPC's core refuses them (the client sees CANCELLED), at once and without the
    loop (a call refused while the loop is held cannot have reached Python). Once the loop is
    free the waiting calls are served. Without the bound (gRPC's own: 3,000) none of the
    20 calls would be refused, and they would wait out their deadlines under a flood."""
    with serving(loop_thread, config(tmp_path, max_pending_rpcs=4)) as s:
        assert s.draft(delta("warm", [1, 2, 3])).drafts[0].length == 3  # connected
        held, release = threading.Event(), threading.Event()

        def hold_the_loop() -> None:
            held.set()
            release.wait(600)  # a bound on failure only

        loop_thread.loop.call_soon_threadsafe(hold_the_loop)
        assert held.wait(60)
        try:
            done: list[grpc.Future] = []
            ten_done = threading.Event()

            def count(call: grpc.Future) -> None:
                done.append(call)
                if len(done) >= 10:
                    ten_done.set()

            calls = []
            for i in range(20):
                call = s.stub.Draft.future(pb.DraftRequest(requests=[delta(f"r{i}", [1, 2, 3])]))
                call.add_done_callback(count)
                calls.append(call)
            # 20 calls, at most 4 pending and a few taken up by gRPC's own requests for
            # calls: at least 10 are refused, all while the loop is still held.
            assert ten_done.wait(60), f"{len(done)} of 20 calls answered while the loop was held"
            refused = [call.exception() for call in list(done)]
            assert not release.is_set()
            # gRPC's core resets the stream: no status of the service's, so CANCELLED.
            assert all(e is not None and e.code() is grpc.StatusCode.CANCELLED for e in refused)
        finally:
            release.set()
        answered = [c.result(timeout=60) for c in calls if c.exception(timeout=60) is None]
        assert answered and all(r.drafts[0].length == 3 for r in answered)
        assert len(answered) + sum(c.exception() is not None for c in calls) == 20
