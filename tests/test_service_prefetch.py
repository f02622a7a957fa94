"""The service's side of pre-drafting (drafter_service.service.prefetch): resolving a
client's prefetched row to the pre-draft it took, and the pre-draft response's layout."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
from service_support import LoopThread, config, delta, rpc_error, serving

from drafter_service.drafting.drafter import DraftTree
from drafter_service.drafting.predraft import Outcome, Predraft, node_depth, path_tokens
from drafter_service.service.prefetch import RequestTrees, prefetch_response, resolve_prefetched
from sssd.drafter.v1 import drafter_pb2 as pb


def tree(tokens: list[int], parents: list[int], scores: list[float] | None = None) -> DraftTree:
    scores = scores if scores is not None else [0.5] * len(tokens)
    return DraftTree(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32),
                     np.array(scores, dtype=np.float32))


T = tree([5, 6, 7], [-1, -1, 0])  # root -> 5 -> 7, root -> 6
A, B = tree([1, 2], [-1, 0]), tree([3], [-1])


def toks(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def test_a_prefetched_row_resolves_to_the_predraft_of_its_outcome() -> None:
    trees = RequestTrees(T, {(0, 9): A, (-1, 4): B})
    assert resolve_prefetched(trees, toks(5, 9)) is A  # 5 accepted, bonus 9
    assert resolve_prefetched(trees, toks(4)) is B  # nothing accepted, bonus 4
    assert resolve_prefetched(trees, toks(5, 7, 1)) is None  # an outcome not pre-drafted
    assert resolve_prefetched(trees, toks(5, 9, 9)) is None  # more than path + bonus
    assert resolve_prefetched(trees, toks(5)) is None  # no bonus token
    assert resolve_prefetched(RequestTrees(None, {(0, 9): A}), toks(5, 9)) is None
    assert resolve_prefetched(None, toks(4)) is None


def unpack(resp) -> dict[str, list[tuple[int, int, list[int], list[int]]]]:  # type: ignore[no-untyped-def]
    p = resp.prefetch
    counts = np.frombuffer(p.outcome_counts, "<u4")
    nodes = np.frombuffer(p.accepted_nodes, "<i4")
    bonus = np.frombuffer(p.bonus_tokens, "<i4")
    sizes = np.frombuffer(p.node_counts, "<u4")
    tokens, parents = np.frombuffer(p.tokens, "<i4"), np.frombuffer(p.parents, "<i4")
    assert len(np.frombuffer(p.scores, "<f4")) == len(tokens) == sizes.sum()
    out: dict[str, list[tuple[int, int, list[int], list[int]]]] = {}
    k = at = 0
    for rid, c in zip(p.request_ids, counts, strict=True):
        rows = []
        for _ in range(int(c)):
            n = int(sizes[k])
            rows.append((int(nodes[k]), int(bonus[k]), tokens[at:at + n].tolist(),
                         parents[at:at + n].tolist()))
            k, at = k + 1, at + n
        out[rid] = rows
    return out


def test_prefetch_response_layout_and_byte_budget() -> None:
    pre = [
        [Predraft(Outcome(0, 9, 0.3), A), Predraft(Outcome(-1, 4, 0.1), B)],
        [],
        [Predraft(Outcome(2, 8, 0.2), B)],
    ]
    resp, kept = prefetch_response(7, ["a", "b", "c"], pre, max_bytes=1 << 20)
    assert kept == [pre[0], [], pre[2]]
    assert resp is not None and resp.step == 7 and not resp.drafts and not resp.HasField("packed")
    assert unpack(resp) == {
        "a": [(0, 9, [1, 2], [-1, 0]), (-1, 4, [3], [-1])],
        "c": [(2, 8, [3], [-1])],
    }
    # 60 bytes: a's best (12 + 2 nodes * 12 = 36) and c's (24), not a's second (24 more).
    tight, kept = prefetch_response(7, ["a", "b", "c"], pre, max_bytes=60)
    assert kept == [pre[0][:1], [], pre[2]]
    assert tight is not None and unpack(tight) == {"a": [(0, 9, [1, 2], [-1, 0])],
                                                  "c": [(2, 8, [3], [-1])]}
    assert prefetch_response(7, ["a"], [[]], max_bytes=1 << 20) == (None, [[]])
    assert prefetch_response(7, ["a", "b", "c"], pre, max_bytes=10) == (None, [[], [], []])


# --- end to end: a real service on a stream ---------------------------------------------

CONTEXT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 4, 7, 1, 2, 3]


class Conversation:
    """A DraftStream whose next message is sent only when the test says so."""

    def __init__(self, stub) -> None:  # type: ignore[no-untyped-def]
        self._out: queue.Queue[pb.DraftRequest | None] = queue.Queue()
        self._responses = stub.DraftStream(self._messages(), timeout=30)

    def _messages(self) -> Iterator[pb.DraftRequest]:
        while (m := self._out.get()) is not None:
            yield m

    def send(self, request: pb.DraftRequest) -> None:
        self._out.put(request)

    def receive(self) -> pb.DraftResponse:
        return next(self._responses)

    def close(self) -> None:
        self._out.put(None)
        assert list(self._responses) == []


def as_tree(d: pb.RequestDraft) -> DraftTree:
    return tree(list(d.tokens), list(d.parents), list(d.scores))


def test_a_stream_gets_predrafts_after_each_answer_and_a_hit_drafts_nothing(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        talk = Conversation(s.stub)
        talk.send(pb.DraftRequest(step=1, requests=[delta("r", CONTEXT, budget=8)],
                                  prefetch_fan_out=4))
        answer = talk.receive()
        assert answer.step == 1 and not answer.HasField("prefetch")
        first = as_tree(answer.drafts[0])
        assert len(first.tokens) > 0  # the context repeats: the input trie drafts
        pre = talk.receive()  # then the pre-drafts of step 1's tree
        assert pre.step == 1 and pre.HasField("prefetch") and not pre.drafts
        outcomes = unpack(pre)["r"]
        assert 1 <= len(outcomes) <= 4
        for node, bonus, _, parents in outcomes:
            assert -1 <= node < len(first.tokens)
            drafted = {int(t) for t, p in zip(first.tokens, first.parents, strict=True)
                       if p == node}
            assert bonus not in drafted  # greedy verification would have accepted it
            assert all(p < i for i, p in enumerate(parents))
        # The target accepts the first outcome's path and emits its bonus: a hit.
        node, bonus, _, _ = outcomes[0]
        new = [*path_tokens(first, node), bonus]
        assert len(new) == node_depth(first, node) + 1
        talk.send(pb.DraftRequest(step=2, prefetch_fan_out=4, requests=[
            delta("r", new, known_length=len(CONTEXT), budget=8, prefetched=True)]))
        answer = talk.receive()
        assert answer.step == 2 and answer.drafts[0].status == pb.DRAFT_STATUS_OK
        assert list(answer.drafts[0].tokens) == []  # the client drafts from the pre-draft
        assert answer.drafts[0].length == len(CONTEXT) + len(new)
        pre = talk.receive()  # pre-drafts of the pre-draft the client took
        assert pre.step == 2 and len(unpack(pre)["r"]) >= 1
        # An outcome nobody pre-drafted, sent as prefetched: nothing drafted, no pre-drafts
        # (the service does not know the tree the client drafts from).
        talk.send(pb.DraftRequest(step=3, prefetch_fan_out=4, requests=[
            delta("r", [999, 998], known_length=len(CONTEXT) + len(new), prefetched=True)]))
        answer = talk.receive()
        assert list(answer.drafts[0].tokens) == [] and answer.drafts[0].status == 1
        # Without pre-drafting the stream is one answer per step again.
        length = answer.drafts[0].length
        talk.send(pb.DraftRequest(step=4, requests=[delta("r", [1, 2], known_length=length)]))
        answer = talk.receive()
        assert answer.step == 4 and len(answer.drafts[0].tokens) > 0
        talk.close()
        metrics = s.server.metrics
        assert metrics._prefetched == {"hit": 1, "miss": 1}


def test_a_bad_prefetched_column_is_refused(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        packed = pb.PackedDeltas(
            request_ids=["r"], known_lengths=np.array([0], "<u4").tobytes(),
            new_token_counts=np.array([2], "<u4").tobytes(),
            new_tokens=np.array([1, 2], "<i4").tobytes(), budgets=np.array([4], "<u4").tobytes(),
            prefetched=bytes([2]),
        )  # fmt: skip
        err = rpc_error(s.stub.Draft, pb.DraftRequest(packed=packed), timeout=10)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "prefetched is 2, must be 0 or 1" in err.details()
        packed.prefetched = bytes([1, 1])
        err = rpc_error(s.stub.Draft, pb.DraftRequest(packed=packed), timeout=10)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "prefetched" in err.details()
