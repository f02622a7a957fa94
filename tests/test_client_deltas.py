"""Per-request delta tracking of verifier_client: whole contexts first, then only new tokens."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pytest
from packed import pack_drafts, unpack_deltas

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.deltas import (
    DeltaTracker,
    ProtocolError,
    RequestState,
    as_token_list,
    checked_commits,
)
from verifier_client.results import Tree


def commit(tracker: DeltaTracker, commits: Mapping[str, Iterable[int]]) -> None:
    """Records ``commits`` as a step does: checked first (nothing is recorded on an error)."""
    tracker.commit_many(checked_commits(tracker.states, commits, None))


def answer(step: int, *drafts: tuple[str, int, int]) -> pb.DraftResponse:
    """(request_id, status, length) per request; OK drafts get a one-node tree. The packed
    answer carries no ids: position i answers request i."""
    return pack_drafts(
        [
            pb.RequestDraft(status=status, length=length, tokens=[7], parents=[-1], scores=[0.5])
            if status == pb.DRAFT_STATUS_OK
            else pb.RequestDraft(status=status, length=length)
            for _, status, length in drafts
        ],
        step,
    )


class Built:
    """A built DraftRequest with its packed deltas readable per request."""

    def __init__(self, message: pb.DraftRequest) -> None:
        self.message = message
        self.requests = unpack_deltas(message)


def build(tracker: DeltaTracker, *ids: str) -> tuple[Built, list[RequestState]]:
    packed, sent, refused = tracker.build(ids, None, 4)
    assert refused == []
    return Built(pb.DraftRequest(step=1, packed=packed)), sent


OK, RESYNC = pb.DRAFT_STATUS_OK, pb.DRAFT_STATUS_RESYNC


def test_whole_context_first_then_only_new_tokens() -> None:
    tracker = DeltaTracker()
    tracker.add(RequestState.new("a", [1, 2, 3, 4], datastore="code", prompt_length=3))
    tracker.commit_many({"a": [5]})
    message, sent = build(tracker, "a")
    (delta,) = message.requests
    assert (delta.known_length, list(delta.new_tokens), delta.prompt_length) == (
        0,
        [1, 2, 3, 4, 5],
        3,
    )
    assert (delta.budget, delta.datastore) == (4, "code")
    trees, resynced = tracker.apply(answer(1, ("a", OK, 5)), sent)
    assert list(trees["a"].tokens) == [7] and resynced == []
    # A tree of the answer's columns compares by value with one built from lists.
    assert trees["a"] == Tree.of([7], [-1], [0.5]) and trees["a"] != Tree.of([7], [-1], [0.25])
    assert tracker.get("a").known_length == 5

    tracker.commit_many({"a": [6, 7]})
    message, sent = build(tracker, "a")
    (delta,) = message.requests
    assert (delta.known_length, list(delta.new_tokens), delta.prompt_length) == (5, [6, 7], 0)
    tracker.apply(answer(2, ("a", OK, 7)), sent)
    assert tracker.stats.tokens_sent == 7 and tracker.stats.full_resends == 0


def test_requests_join_and_leave_at_different_steps() -> None:
    tracker = DeltaTracker()
    tracker.add(RequestState.new("a", [1, 2]))
    message, sent = build(tracker, "a")
    tracker.apply(answer(1, ("a", OK, 2)), sent)
    tracker.add(RequestState.new("b", [9, 9, 9]))
    tracker.commit_many({"a": [3], "b": []})
    message, sent = build(tracker, "b", "a")  # any order; "a" is a delta, "b" whole
    assert [(d.request_id, d.known_length, list(d.new_tokens)) for d in message.requests] == [
        ("b", 0, [9, 9, 9]), ("a", 2, [3])]  # fmt: skip
    tracker.apply(answer(2, ("b", OK, 3), ("a", OK, 3)), sent)
    # "a" sits out two steps (not finished: lifecycle is explicit), its commits accumulate.
    for _ in range(2):
        tracker.commit_many({"a": [4], "b": [8]})
        message, sent = build(tracker, "b")
        tracker.apply(answer(3, ("b", OK, tracker.get("b").pending_length)), sent)
    message, sent = build(tracker, "a")
    assert (message.requests[0].known_length, list(message.requests[0].new_tokens)) == (3, [4, 4])
    state = tracker.finish("b")
    assert state.tokens == [9, 9, 9, 8, 8] and tracker.get("a").tokens == [1, 2, 3, 4, 4]
    with pytest.raises(KeyError, match="'b'"):
        tracker.get("b")


def synced_then_sent() -> tuple[DeltaTracker, list[RequestState]]:
    """Request "a": [1, 2, 3] held by the drafter (answered OK), then [4] committed and
    sent; returns the tracker and the states of that last send, whose answer is due."""
    tracker = DeltaTracker()
    tracker.add(RequestState.new("a", [1, 2, 3]))
    _, sent = build(tracker, "a")
    tracker.apply(answer(1, ("a", OK, 3)), sent)
    tracker.commit_many({"a": [4]})
    _, sent = build(tracker, "a")
    return tracker, sent


def test_resync_sends_the_whole_context_next_time() -> None:
    tracker, sent = synced_then_sent()
    trees, resynced = tracker.apply(answer(2, ("a", RESYNC, 0)), sent)
    assert trees == {} and resynced == ["a"]
    message, _ = build(tracker, "a")
    assert (message.requests[0].known_length, list(message.requests[0].new_tokens)) == (
        0,
        [1, 2, 3, 4],
    )
    assert tracker.stats.full_resends == 1


def test_a_lost_answer_means_a_whole_resend() -> None:
    tracker, sent = synced_then_sent()
    # Its answer is out, and never applied (a deadline): the drafter may or may not hold it.
    assert sent[0].known_length == 0
    message, _ = build(tracker, "a")
    assert message.requests[0].known_length == 0 and len(message.requests[0].new_tokens) == 4


@pytest.mark.parametrize("length", [0, 4])  # nothing held, or more than was ever sent
def test_an_impossible_ok_length_is_a_resync(length: int) -> None:
    tracker = DeltaTracker()
    tracker.add(RequestState.new("a", [1, 2, 3]))
    _, sent = build(tracker, "a")
    trees, resynced = tracker.apply(answer(1, ("a", OK, length)), sent)
    assert trees == {} and resynced == ["a"] and tracker.get("a").known_length == 0


def test_an_answer_of_another_shape_is_a_protocol_error() -> None:
    tracker = DeltaTracker()
    tracker.add(RequestState.new("a", [1]))
    tracker.add(RequestState.new("b", [2]))
    _, sent = build(tracker, "a", "b")
    with pytest.raises(ProtocolError, match="does not match the 2 requests sent: 1 statuses"):
        tracker.apply(answer(1, ("b", OK, 1)), sent)
    assert all(s.known_length == 0 for s in sent)
    _, sent = build(tracker, "a", "b")
    torn = answer(2, ("a", OK, 1), ("b", OK, 1))
    torn.packed.scores = torn.packed.scores[:-2]  # not a whole float32
    with pytest.raises(ProtocolError, match="6 bytes of tokens/parents/scores"):
        tracker.apply(torn, sent)
    assert all(s.known_length == 0 for s in sent)


def test_empty_contexts_are_not_sent() -> None:
    tracker = DeltaTracker()
    tracker.add(RequestState.new("a", []))
    tracker.add(RequestState.new("b", [5]))
    message, sent = build(tracker, "a", "b")
    assert [d.request_id for d in message.requests] == ["b"] and len(sent) == 1


def test_numpy_and_any_int_sequence() -> None:
    tracker = DeltaTracker()
    tracker.add(RequestState.new("a", np.arange(4, dtype=np.int32)))
    commit(tracker, {"a": np.array([9], dtype=np.int64)})
    commit(tracker, {"a": range(10, 12)})
    commit(tracker, {"a": (12,)})
    assert tracker.get("a").tokens == [0, 1, 2, 3, 9, 10, 11, 12]
    assert all(type(t) is int for t in tracker.get("a").tokens)


def test_validation_names_the_bad_value() -> None:
    tracker = DeltaTracker()
    tracker.add(RequestState.new("a", [1]))
    with pytest.raises(ValueError, match="'a' is already live"):
        tracker.add(RequestState.new("a", [1]))
    with pytest.raises(ValueError, match="non-empty str"):
        tracker.add(RequestState.new("", [1]))
    with pytest.raises(ValueError, match="prompt_length 3 of 'b'"):
        tracker.add(RequestState.new("b", [1, 2], prompt_length=3))
    with pytest.raises(ValueError, match=r"commit of 'a': token id -1"):
        commit(tracker, {"a": [4, -1]})
    with pytest.raises(ValueError, match="token id 2147483648"):
        as_token_list([2**31])
    with pytest.raises(KeyError, match=r"unknown request_id\(s\) \['zz'\]"):
        commit(tracker, {"zz": [1]})
    with pytest.raises(KeyError, match="zz"):
        commit(tracker, {"a": [2], "zz": [1]})
    assert tracker.get("a").tokens == [1]  # a refused batch commits nothing


def test_requests_the_drafter_would_refuse_are_never_sent() -> None:
    tracker = DeltaTracker()
    tracker.max_token_id, tracker.max_context_tokens = 99, 5  # vocab_size 100
    tracker.add(RequestState.new("ok", [1, 2]))
    tracker.add(RequestState.new("vocab", [1, 100]))  # past the vocabulary from the start
    tracker.add(RequestState.new("long", [1, 2, 3]))
    tracker.add(RequestState.new("later", [1]))
    tracker.commit_many({"long": [4, 5, 6], "later": [150], "ok": [3]})
    packed, sent, refused = tracker.build(["ok", "vocab", "long", "later"], None, 4)
    assert list(packed.request_ids) == ["ok"] and len(sent) == 1
    assert refused == ["vocab", "long", "later"] and tracker.stats.refused == 3
    assert tracker.get("later").tokens == [1, 150]  # still tracked: finish/abort stay explicit


def test_a_refused_commit_batch_changes_nothing() -> None:
    tracker = DeltaTracker()
    tracker.max_token_id = 99
    tracker.add(RequestState.new("a", [1]))
    tracker.add(RequestState.new("b", [1]))
    with pytest.raises(ValueError, match="commit of 'b': token id -5"):
        commit(tracker, {"a": [500], "b": [-5]})
    assert tracker.get("a").tokens == [1] and not tracker.get("a").refused
