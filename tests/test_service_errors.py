"""Every refusal of the service has its own status code, names the bad value, changes no
state and leaves the server answering; a fuzzed stream of odd requests proves it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from packed import pack_deltas, unpack_drafts
from service_support import (
    VOCAB,
    LoopThread,
    Running,
    config,
    delta,
    draft_held,
    read_only_catalog,
    rpc_error,
    serving,
)

from drafter_service import Datastore
from drafter_service.edge.validation import parse_draft_request
from drafter_service.engine.call_errors import InvalidArgument, ServiceError
from drafter_service.engine.calls import CallLimits
from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot
from sssd_drafter.v1 import drafter_pb2 as pb

Code = grpc.StatusCode
MAX_REQUESTS, MAX_TOKENS, MAX_BUDGET = 6, 64, 32


@pytest.fixture(scope="module")
def strict(loop_thread: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server with a known tokenizer fingerprint, a named datastore and small limits."""
    root = tmp_path_factory.mktemp("strict")
    (root / "tokenizer.json").write_text('{"model": "test"}')
    identity = TokenizerIdentity.from_file(root / "tokenizer.json", "test", VOCAB)
    write_snapshot(root / "named", Datastore.from_documents([[1, 2, 3]], VOCAB), identity)
    cfg = config(
        root / "data",
        tokenizer=root / "tokenizer.json",
        vocab_size=VOCAB,
        datastores=(("named", root / "named"),),
        max_requests_per_call=MAX_REQUESTS,
        max_tokens_per_request=MAX_TOKENS,
        max_budget=MAX_BUDGET,
        max_resident_bytes=8 * 100 + 4 * (VOCAB + 1),
    )
    with serving(loop_thread, cfg) as s:
        yield s, identity.fingerprint


def draft_error(s: Running, *deltas: pb.RequestDelta, fingerprint: str = "") -> grpc.RpcError:
    return rpc_error(s.draft, *deltas, fingerprint=fingerprint)


@pytest.mark.parametrize(
    ("deltas", "code", "needle"),
    [
        ([delta("a", [1, VOCAB])], Code.INVALID_ARGUMENT, f"'a': token id {VOCAB} at index 1"),
        ([delta("ok", [1]), delta("b", [5, -3])], Code.INVALID_ARGUMENT, "'b': token id -3"),
        ([delta("", [1])], Code.INVALID_ARGUMENT, "requests[0]: request_id is empty"),
        ([delta("x" * 1025)], Code.INVALID_ARGUMENT, "1025 characters"),
        ([delta("d", [1]), delta("d", [2])], Code.INVALID_ARGUMENT, "'d' appears twice"),
        ([delta("e", budget=MAX_BUDGET + 1)], Code.INVALID_ARGUMENT, "budget 33"),
        ([delta(f"r{i}") for i in range(MAX_REQUESTS + 1)], Code.INVALID_ARGUMENT, "7 requests"),
        ([delta("f", [1] * (MAX_TOKENS + 1))], Code.INVALID_ARGUMENT, "65 new tokens"),
        ([delta("g", [1], known_length=MAX_TOKENS)], Code.INVALID_ARGUMENT, "known_length 64"),
        ([delta("h", [1, 2], prompt_length=3)], Code.INVALID_ARGUMENT, "prompt_length 3"),
        ([delta("i", [1], datastore="nope")], Code.NOT_FOUND, "'i': unknown datastore 'nope'"),
    ],
)
@pytest.mark.parametrize("packed", [False, True], ids=["messages", "packed"])
def test_draft_refusals(
    strict: Any, deltas: list[pb.RequestDelta], code: Code, needle: str, packed: bool
) -> None:
    s, _ = strict
    if packed:
        err = rpc_error(s.stub.Draft, pack_deltas(deltas), timeout=10)
    else:
        err = draft_error(s, *deltas)
    assert err.code() == code and needle in err.details(), err.details()


def packed_request(**columns: Any) -> pb.DraftRequest:
    """Two valid requests as columns, with ``columns`` replaced."""
    fields: dict[str, Any] = dict(
        request_ids=["a", "b"],
        known_lengths=np.array([0, 0], "<u4").tobytes(),
        new_token_counts=np.array([2, 1], "<u4").tobytes(),
        new_tokens=np.array([1, 2, 3], "<i4").tobytes(),
        budgets=np.array([4, 4], "<u4").tobytes(),
    )
    fields.update(columns)
    return pb.DraftRequest(packed=pb.PackedDeltas(**fields))


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (packed_request(known_lengths=b"\0" * 4), "packed.known_lengths has 4 bytes: 2 entries"),
        (packed_request(budgets=b"\0" * 9), "packed.budgets has 9 bytes"),
        (packed_request(new_token_counts=b""), "packed.new_token_counts has 0 bytes"),
        (
            packed_request(new_tokens=np.array([1, 2], "<i4").tobytes()),
            "packed.new_tokens has 8 bytes: 3 entries of 4 bytes expected (the sum of "
            "new_token_counts is 3)",
        ),
        (packed_request(new_tokens=b"\0" * 13), "packed.new_tokens has 13 bytes"),
        (packed_request(prompt_lengths=b"\0" * 4), "packed.prompt_lengths has 4 bytes"),
        (packed_request(datastores=["named"]), "packed.datastores has 1 names for 2 requests"),
        (
            packed_request(new_token_counts=np.array([2**32 - 1, 1], "<u4").tobytes()),
            "new_tokens has 12 bytes: 4294967296 entries",
        ),
    ],
)
def test_packed_column_refusals(strict: Any, request_: pb.DraftRequest, needle: str) -> None:
    s, _ = strict
    err = rpc_error(s.stub.Draft, request_, timeout=10)
    assert err.code() == Code.INVALID_ARGUMENT and needle in err.details(), err.details()


def test_packed_and_messages_together_are_refused(strict: Any) -> None:
    s, _ = strict
    request = packed_request()
    request.requests.append(delta("c", [1]))
    err = rpc_error(s.stub.Draft, request, timeout=10)
    assert err.code() == Code.INVALID_ARGUMENT and "either requests (1) or packed" in err.details()
    answer = unpack_drafts(s.stub.Draft(packed_request(), timeout=10))
    assert [(d.status, d.length) for d in answer] == [(1, 2), (1, 1)]


def test_tokenizer_mismatch_is_failed_precondition(strict: Any) -> None:
    s, fingerprint = strict
    err = draft_error(s, delta("a", [1]), fingerprint="0" * 64)
    assert err.code() == Code.FAILED_PRECONDITION and "0" * 64 in err.details()
    assert s.draft(delta("fp", [1]), fingerprint=fingerprint).drafts[0].status == 1


def test_a_refused_call_changes_no_state(strict: Any) -> None:
    s, _ = strict
    s.draft(delta("keep", [1, 2, 3]))
    err = draft_error(s, delta("keep", [4], known_length=3), delta("new", [VOCAB]))
    assert err.code() == Code.INVALID_ARGUMENT
    r = s.draft(delta("keep", [4], known_length=3), delta("new", [1], known_length=1))
    assert [(d.status, d.length) for d in r.drafts] == [(1, 4), (2, 0)]  # neither was touched


@pytest.mark.parametrize(
    ("items", "code", "needle"),
    [
        ([pb.FinishedRequest(request_id="a")], Code.INVALID_ARGUMENT, "reason 0"),
        ([pb.FinishedRequest(request_id="", reason=2)], Code.INVALID_ARGUMENT, "empty"),
        (
            [pb.FinishedRequest(request_id="a", reason=1, final_tokens=[VOCAB + 5])],
            Code.INVALID_ARGUMENT,
            f"'a': token id {VOCAB + 5}",
        ),
        ([pb.FinishedRequest(request_id="a", reason=2)] * 2, Code.INVALID_ARGUMENT, "twice"),
        (
            [pb.FinishedRequest(request_id=f"r{i}", reason=2) for i in range(MAX_REQUESTS + 1)],
            Code.INVALID_ARGUMENT,
            "max_requests_per_call",
        ),
    ],
)
def test_finish_refusals(
    strict: Any, items: list[pb.FinishedRequest], code: Code, needle: str
) -> None:
    s, _ = strict
    err = rpc_error(s.stub.Finish, pb.FinishRequest(requests=items))
    assert err.code() == code and needle in err.details(), err.details()


def seqs(*token_lists: list[int]) -> list[pb.TokenSequence]:
    return [pb.TokenSequence(tokens=t) for t in token_lists]


@pytest.mark.parametrize(
    ("request_", "code", "needle"),
    [
        (pb.IngestRequest(datastore="nope", sequences=seqs([1])), Code.NOT_FOUND, "'nope'"),
        (
            pb.IngestRequest(datastore="named", sequences=seqs([1])),
            Code.FAILED_PRECONDITION,
            "'named' is read-only",
        ),
        (pb.IngestRequest(sequences=seqs([1], [])), Code.INVALID_ARGUMENT, "sequences[1] has 0"),
        (
            pb.IngestRequest(sequences=seqs([1], [2, -1])),
            Code.INVALID_ARGUMENT,
            "sequences[1]: token id -1 at index 1",
        ),
        (pb.IngestRequest(sequences=seqs([1] * (MAX_TOKENS + 1))), Code.INVALID_ARGUMENT, "65"),
        (
            pb.IngestRequest(sequences=seqs([1] * 60, [2] * 60)),
            Code.RESOURCE_EXHAUSTED,
            "after 1 of 2 sequences",
        ),
    ],
)
def test_ingest_refusals(strict: Any, request_: pb.IngestRequest, code: Code, needle: str) -> None:
    s, _ = strict
    err = rpc_error(s.stub.Ingest, request_)
    assert err.code() == code and needle in err.details(), err.details()


def test_bad_message_ends_a_stream_with_its_code(strict: Any) -> None:
    s, _ = strict
    requests = [
        pb.DraftRequest(step=1, requests=[delta("st", [1, 2])]),
        pb.DraftRequest(step=2, requests=[delta("st", [3], known_length=2, datastore="x")]),
        pb.DraftRequest(step=3, requests=[delta("st", [3], known_length=2)]),
    ]
    responses = s.stub.DraftStream(iter(requests), timeout=10)
    assert next(responses).step == 1
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == Code.NOT_FOUND and "'x'" in info.value.details()
    # the step-2 refusal changed nothing: the request still holds 2 tokens
    assert s.draft(delta("st", [3], known_length=2)).drafts[0].length == 3


def test_overload_is_resource_exhausted(loop_thread: LoopThread, tmp_path: Path) -> None:
    """With the one call slot taken by a call held on the drafting thread (in flight
    however fast or slow the machine), the next call is RESOURCE_EXHAUSTED, names the
    bound and changes nothing; once the slot is free, calls are served again."""
    # inline_max_work=0: a call's work goes to the drafting thread, where it is held. The
    # queued-work bound (--max-queue-ms) is out of the way: this is about calls in flight.
    cfg = config(tmp_path, max_inflight_calls=1, inline_max_work=0, max_queue_ms=600_000)
    with serving(loop_thread, cfg) as s:
        with draft_held(s, delta("big", [1, 2, 3])) as first:
            err = rpc_error(s.draft, delta("small", [1, 2]))
            assert err.code() == Code.RESOURCE_EXHAUSTED, err
            assert "max_inflight_calls (1)" in err.details()
        assert first.result(timeout=60).drafts[0].length == 3
        assert s.draft(delta("small", [1, 2])).drafts[0].length == 2  # nothing was kept of it
        assert s.draft(delta("after", [1])).drafts[0].status == 1


# -- fuzzing ------------------------------------------------------------------------------

REQUEST_IDS = st.sampled_from(["r1", "r2", "r3", "", "x" * 1025]) | st.text(max_size=5)
TOKENS = st.lists(st.integers(-3, VOCAB + 2) | st.sampled_from([-(2**31), 2**31 - 1]), max_size=6)
DELTAS = st.builds(
    pb.RequestDelta,
    request_id=REQUEST_IDS,
    known_length=st.sampled_from([0, 0, 1, 2, 3, 5, MAX_TOKENS, 2**63]) | st.integers(0, 8),
    new_tokens=TOKENS,
    budget=st.integers(0, MAX_BUDGET + 2) | st.just(2**32 - 1),
    datastore=st.sampled_from(["", "", "default", "named", "nope"]),
    prompt_length=st.integers(0, 7),
)


def expected_codes(request: pb.DraftRequest, fingerprint: str) -> set[Code]:
    """Every code that describes something wrong with ``request`` (empty: it is valid)."""
    codes = set()
    if len(request.requests) > MAX_REQUESTS:
        codes.add(Code.INVALID_ARGUMENT)
    if request.tokenizer_fingerprint not in ("", fingerprint):
        codes.add(Code.FAILED_PRECONDITION)
    ids = [d.request_id for d in request.requests]
    for d in request.requests:
        n = len(d.new_tokens)
        if (
            not d.request_id
            or len(d.request_id) > 1024
            or ids.count(d.request_id) > 1
            or d.budget > MAX_BUDGET
            or d.known_length + n > MAX_TOKENS
            or (d.known_length == 0 and d.prompt_length > n)
            or any(not 0 <= t < VOCAB for t in d.new_tokens)
        ):
            codes.add(Code.INVALID_ARGUMENT)
        if d.datastore not in ("", "default", "named"):
            codes.add(Code.NOT_FOUND)
    return codes


def check_answer(request: pb.DraftRequest, response: pb.DraftResponse) -> None:
    assert response.step == request.step
    assert [d.request_id for d in response.drafts] == [d.request_id for d in request.requests]
    for asked, draft in zip(request.requests, response.drafts, strict=True):
        n = len(draft.tokens)
        assert draft.status in (pb.DRAFT_STATUS_OK, pb.DRAFT_STATUS_RESYNC)
        if asked.known_length == 0:
            assert draft.status == pb.DRAFT_STATUS_OK and draft.length == len(asked.new_tokens)
        if draft.status == pb.DRAFT_STATUS_RESYNC:
            assert n == 0 and draft.length == 0
        else:
            assert (
                draft.length == asked.known_length + len(asked.new_tokens)
                or asked.known_length == 0
            )
        assert n <= asked.budget and len(draft.parents) == n == len(draft.scores)
        assert all(-1 <= p < i for i, p in enumerate(draft.parents))
        assert all(0 <= t < VOCAB for t in draft.tokens)


@pytest.mark.parametrize("packed", [False, True], ids=["messages", "packed"])
@given(
    requests=st.lists(
        st.builds(
            pb.DraftRequest,
            requests=st.lists(DELTAS, max_size=MAX_REQUESTS + 1),
            step=st.integers(0, 2**64 - 1),
            tokenizer_fingerprint=st.sampled_from(["", "", "FP", "bad"]),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_fuzzed_stream_gets_answers_or_the_right_code(
    strict: Any, requests: list[pb.DraftRequest], packed: bool
) -> None:
    s, fingerprint = strict
    for r in requests:
        if r.tokenizer_fingerprint == "FP":
            r.tokenizer_fingerprint = fingerprint
    sent = requests
    if packed:
        sent = []
        for r in requests:
            p = pack_deltas(r.requests, r.step)
            p.tokenizer_fingerprint = r.tokenizer_fingerprint
            sent.append(p)
    responses = s.stub.DraftStream(iter(sent), timeout=10)
    for request in requests:
        codes = expected_codes(request, fingerprint)
        try:
            response = next(responses)
        except grpc.RpcError as exc:
            assert codes and exc.code() in codes, (exc.code(), exc.details(), codes)
            break
        assert not codes, f"accepted a request that deserves {codes}"
        if packed:
            drafts = unpack_drafts(response)
            for asked, draft in zip(request.requests, drafts, strict=True):
                draft.request_id = asked.request_id  # packed answers are positional
            response = pb.DraftResponse(step=response.step, drafts=drafts)
        check_answer(request, response)
    # the server still answers a good request
    assert s.draft(delta("alive", [1, 2, 3])).drafts[0].status == pb.DRAFT_STATUS_OK


@given(
    st.lists(st.binary(max_size=24), min_size=6, max_size=6),
    st.lists(REQUEST_IDS, max_size=3),
    st.lists(st.sampled_from(["", "named", "nope"]), max_size=3),
)
def test_fuzzed_packed_columns_get_answers_or_invalid_argument(
    strict: Any, columns: list[bytes], ids: list[str], names: list[str]
) -> None:
    """Arbitrary bytes in every column: an answer whose shape matches, or a refusal with
    INVALID_ARGUMENT / NOT_FOUND; never a crash or INTERNAL."""
    s, _ = strict
    knowns, counts, tokens, budgets, prompts, _ = columns
    packed = pb.PackedDeltas(
        request_ids=ids, known_lengths=knowns, new_token_counts=counts,
        new_tokens=tokens, budgets=budgets, prompt_lengths=prompts, datastores=names,
    )  # fmt: skip
    request = pb.DraftRequest(packed=packed)
    try:
        response = s.stub.Draft(request, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() in (Code.INVALID_ARGUMENT, Code.NOT_FOUND), (exc.code(), exc.details())
        return
    drafts = unpack_drafts(response)
    assert len(drafts) == len(ids)
    assert all(d.status in (pb.DRAFT_STATUS_OK, pb.DRAFT_STATUS_RESYNC) for d in drafts)


LIMITS = CallLimits(
    read_only_catalog(VOCAB, "default", "named"), max_requests_per_call=MAX_REQUESTS,
    max_tokens_per_request=MAX_TOKENS, max_budget=MAX_BUDGET, default_datastore="default",
)  # fmt: skip


def parsed(request: pb.DraftRequest) -> Any:
    """What validation makes of ``request``: the call, or the refusal's type and text."""
    try:
        return parse_draft_request(request, LIMITS)
    except ServiceError as exc:
        return type(exc), str(exc)


@given(st.lists(DELTAS.filter(lambda d: d.known_length < 2**32), max_size=MAX_REQUESTS + 1))
def test_both_wire_forms_validate_alike(deltas: list[pb.RequestDelta]) -> None:
    """One validation path: the same requests as messages or as packed columns give the
    same call, or the same refusal word for word."""
    by_message = parsed(pb.DraftRequest(requests=deltas))
    by_column = parsed(pack_deltas(deltas))
    if isinstance(by_message, tuple) or isinstance(by_column, tuple):
        assert by_message == by_column
        return
    for field in dataclasses.fields(by_message):
        want, got = getattr(by_message, field.name), getattr(by_column, field.name)
        if isinstance(want, np.ndarray):
            want, got = want.tolist(), got.tolist()
        assert want == got, field.name


def test_a_uint64_known_length_is_refused_with_its_value() -> None:
    """known_length is uint64 in a RequestDelta: checked without wrapping around."""
    for known in (2**32, 2**63, 2**64 - 1):
        request = pb.DraftRequest(requests=[delta("k", [1], known_length=known)])
        assert parsed(request) == (
            InvalidArgument,
            f"request 'k': known_length {known} + 1 new tokens is over max_tokens_per_request "
            f"({MAX_TOKENS})",
        )


def test_message_size_limit_is_enforced_and_reported(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    with serving(loop_thread, config(tmp_path, max_message_bytes=4096)) as s:
        info = s.stub.GetServiceInfo(pb.GetServiceInfoRequest())
        assert info.limits.max_message_bytes == 4096
        err = draft_error(s, delta("big", [5] * 5000))
        assert err.code() == Code.RESOURCE_EXHAUSTED
        assert s.draft(delta("small", [5] * 100)).drafts[0].length == 100
