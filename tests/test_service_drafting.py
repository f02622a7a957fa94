"""The drafting service over loopback: deltas equal full-context drafting, RESYNC on
mismatch and eviction, finish → ingest → later drafts, durable Ingest, datastores."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from packed import pack_deltas, unpack_drafts
from service_support import (
    VOCAB,
    FakeClock,
    LoopThread,
    Running,
    config,
    delta,
    rpc_error,
    serving,
)

from drafter_bench.acceptance import accepted_length
from drafter_service import Datastore, DraftConfig, Drafter
from drafter_service.drafting.node_score import default_node_score
from drafter_service.live.live_datastore import LiveDatastore
from drafter_service.snapshot.store import TokenizerIdentity, load_snapshot, write_snapshot
from sssd_drafter.v1 import drafter_pb2 as pb

OK, RESYNC = pb.DRAFT_STATUS_OK, pb.DRAFT_STATUS_RESYNC
UNKNOWN_TOKENIZER = TokenizerIdentity("unknown", VOCAB, "")
SHIPPED = DraftConfig(node_score=default_node_score().as_config())


def phrases_corpus(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Documents made of recurring phrases, so contexts match the datastore often."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, VOCAB, size=8).astype(np.int32) for _ in range(12)]
    docs = [np.concatenate([phrases[i] for i in rng.integers(0, 12, size=25)]) for _ in range(30)]
    return phrases, docs


@pytest.fixture
def snapshot_dir(tmp_path: Path) -> Path:
    _, docs = phrases_corpus(0)
    path = tmp_path / "snap-001"
    write_snapshot(path, Datastore.from_documents(docs, VOCAB), UNKNOWN_TOKENIZER)
    return path


def trees_equal(
    draft: pb.RequestDraft, tokens: np.ndarray, parents: np.ndarray, scores: np.ndarray
) -> bool:
    return (
        list(draft.tokens) == tokens.tolist()
        and list(draft.parents) == parents.tolist()
        and np.array_equal(np.array(draft.scores, np.float32), scores)
    )


def test_deltas_draft_like_the_full_context(
    loop_thread: LoopThread, tmp_path: Path, snapshot_dir: Path
) -> None:
    phrases, _ = phrases_corpus(0)
    rng = np.random.default_rng(1)
    contexts = {
        f"req-{i}": np.concatenate([phrases[j] for j in rng.integers(0, 12, size=12)])
        for i in range(3)
    }
    datastore, _ = load_snapshot(snapshot_dir)
    held = {rid: 10 + 3 * i for i, rid in enumerate(contexts)}
    # No recent tier: the other requests of the batch do not change a request's tree.
    with serving(loop_thread, config(tmp_path / "data", snapshot=snapshot_dir,
                                     draft_config=[("recent_samples", "0")])) as s:  # fmt: skip
        first = s.draft(
            *(delta(rid, ctx[: held[rid]], prompt_length=5) for rid, ctx in contexts.items()),
            step=1,
        )
        assert [d.length for d in first.drafts] == list(held.values()) and first.step == 1
        nonempty = 0
        for step in range(2, 14):
            deltas = []
            for rid, ctx in contexts.items():
                k = int(rng.integers(0, 4))
                deltas.append(
                    delta(
                        rid,
                        ctx[held[rid] : held[rid] + k],
                        known_length=held[rid],
                        budget=0 if step == 5 else 16,
                    )
                )
                held[rid] += k
            response = s.draft(*deltas, step=step)
            assert response.step == step
            for draft, rid in zip(response.drafts, contexts, strict=True):
                assert draft.request_id == rid and draft.status == OK
                assert draft.length == held[rid]
                # The service drafts with the shipped node score (the snapshot has none).
                local = Drafter(VOCAB, SHIPPED, datastore=datastore)
                local.start(rid, contexts[rid][: held[rid]])
                tree = local.speculate([rid], [[]], budgets=0 if step == 5 else 16).tree(0)
                assert trees_equal(draft, tree.tokens, tree.parents, tree.scores), (step, rid)
                nonempty += len(draft.tokens) > 0
                if step == 5:
                    assert len(draft.tokens) == 0  # budget 0: no tree, state still advanced
        assert nonempty > 20  # the comparison was not vacuous


def test_length_mismatch_and_unknown_ids_resync(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        s.draft(delta("a", [1, 2, 3, 4]))
        r = s.draft(delta("a", [5], known_length=3), delta("ghost", [1], known_length=9))
        assert [(d.status, d.length, len(d.tokens)) for d in r.drafts] == [(RESYNC, 0, 0)] * 2
        # the mismatch dropped the state: even the right length resyncs now
        assert s.draft(delta("a", [5], known_length=4)).drafts[0].status == RESYNC
        r = s.draft(delta("a", [1, 2, 3, 4, 5]))  # resend the full context
        assert r.drafts[0].status == OK and r.drafts[0].length == 5
        assert s.draft(delta("a", [6], known_length=5)).drafts[0].length == 6


def test_restart_with_known_length_zero_replaces_the_state(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        s.draft(delta("a", [1, 2, 3, 4, 5, 6]))
        assert s.draft(delta("a", [7, 8])).drafts[0].length == 2
        assert s.draft(delta("a", [9], known_length=2)).drafts[0].length == 3
        assert s.server.engine is not None
        assert s.server.engine.catalog.slots["default"].drafter.num_requests == 1


def test_lru_bound_evicts_the_least_recent(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path, max_request_states=2)) as s:
        for rid in ("a", "b"):
            s.draft(delta(rid, [1, 2, 3]))
        s.draft(delta("a", [4], known_length=3))  # a is now more recent than b
        s.draft(delta("c", [1, 2, 3]))  # evicts b
        r = s.draft(
            delta("a", [5], known_length=4),
            delta("b", [4], known_length=3),
            delta("c", [4], known_length=3),
        )
        assert [d.status for d in r.drafts] == [OK, RESYNC, OK]
        assert s.server.engine is not None
        assert s.server.engine.catalog.slots["default"].drafter.num_requests == 2
        # one call may hold more than the bound; the next call trims back to it
        r = s.draft(*(delta(f"n{i}", [1, 2]) for i in range(4)))
        assert [d.status for d in r.drafts] == [OK] * 4
        assert len(s.server.engine.table) == 4


def test_idle_requests_expire(loop_thread: LoopThread, tmp_path: Path) -> None:
    clock = FakeClock()  # idleness is measured on it: no call is ever late by the wall
    with serving(loop_thread, config(tmp_path, request_ttl_s=0.6), clock) as s:
        s.draft(delta("idle", [1, 2, 3]), delta("busy", [1, 2, 3]))
        for i in range(5):  # busy is never idle for long, idle is idle for 0.75 s
            clock.now += 0.15
            s.draft(delta("busy", [4], known_length=3 + i))
        r = s.draft(delta("idle", [4], known_length=3), delta("busy", [4], known_length=8))
        assert [d.status for d in r.drafts] == [RESYNC, OK]
        assert s.server.engine is not None
        drafter = s.server.engine.catalog.slots["default"].drafter
        assert drafter.num_requests == 1  # busy, until it too is idle past the TTL
        clock.now += 0.61
        deadline = time.monotonic() + 60  # a bound on failure only
        while drafter.num_requests and time.monotonic() < deadline:
            time.sleep(0.05)  # no calls: the sweeper frees the native state too
        assert drafter.num_requests == 0 and len(s.server.engine.table) == 0


def wait_for_tokens(s: Running, at_least: int, timeout_s: float = 10) -> pb.DatastoreInfo:
    deadline = time.monotonic() + timeout_s
    while True:
        info = {d.name: d for d in s.stub.GetServiceInfo(pb.GetServiceInfoRequest()).datastores}
        if info["default"].num_tokens >= at_least or time.monotonic() > deadline:
            return info["default"]
        time.sleep(0.02)


def test_finished_generation_is_ingested_and_drafted_from(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 500, size=20).tolist()
    output = rng.integers(500, 1000, size=30).tolist()  # disjoint from every other context
    cfg = config(tmp_path, rebuild_min_tokens=1, store="prompt+output")
    with serving(loop_thread, cfg) as s:
        s.draft(delta("gen", prompt + output[:2], prompt_length=20))
        s.draft(delta("gen", output[2:25], known_length=22))
        s.draft(delta("private", [1, 2, 3]), delta("aborted", [4, 5, 6]))
        r = s.stub.Finish(
            pb.FinishRequest(
                requests=[
                    pb.FinishedRequest(
                        request_id="gen", reason=pb.FINISH_REASON_FINISHED, final_tokens=output[25:]
                    ),
                    pb.FinishedRequest(
                        request_id="private", reason=pb.FINISH_REASON_FINISHED, do_not_store=True
                    ),
                    pb.FinishedRequest(request_id="aborted", reason=pb.FINISH_REASON_ABORTED),
                    pb.FinishedRequest(request_id="never-seen", reason=pb.FINISH_REASON_ABORTED),
                ]
            )
        )
        assert r.ingested == 1 and list(r.unknown_request_ids) == ["never-seen"]
        assert wait_for_tokens(s, 50).num_tokens == 50  # prompt + output, one document
        r2 = s.draft(delta("later", [7, 8, *output[10:14]], budget=8))
        tree = r2.drafts[0]
        chain = [t for t, p in zip(tree.tokens, tree.parents, strict=True) if p == -1][:1]
        assert chain == [output[14]]  # the datastore continues the stored generation
        assert list(tree.tokens[:4]) == output[14:18]
        # finished requests are gone
        assert s.draft(delta("gen", [1], known_length=50)).drafts[0].status == RESYNC


def test_ingest_is_durable_when_acknowledged(loop_thread: LoopThread, tmp_path: Path) -> None:
    seqs = [list(range(10, 30)), list(range(40, 45))]
    with serving(loop_thread, config(tmp_path)) as s:
        r = s.stub.Ingest(pb.IngestRequest(sequences=[pb.TokenSequence(tokens=t) for t in seqs]))
        assert r.accepted == 2 and r.wal_position == 2
        empty = s.stub.Ingest(pb.IngestRequest(datastore="default"))
        assert empty.accepted == 0 and empty.wal_position == 2
    with LiveDatastore(tmp_path, UNKNOWN_TOKENIZER, background=False) as reopened:
        assert reopened.stats().wal_position == 2
        assert reopened.datastore.num_tokens == 20 + 1 + 5  # replayed from the log


def test_named_datastore_is_read_only_and_fixed_per_request(
    loop_thread: LoopThread, tmp_path: Path, snapshot_dir: Path
) -> None:
    phrases, _ = phrases_corpus(0)
    cfg = config(tmp_path / "data", datastores=(("code", snapshot_dir),))
    with serving(loop_thread, cfg) as s:
        info = s.stub.GetServiceInfo(pb.GetServiceInfoRequest())
        by_name = {d.name: d for d in info.datastores}
        assert by_name["default"].is_default and by_name["default"].live
        assert not by_name["code"].is_default and not by_name["code"].live
        assert by_name["code"].num_tokens == 30 * 200 + 29 and by_name["code"].sub_indices == 1
        assert info.tokenizer.vocab_size == VOCAB and info.limits.max_budget == 256
        ctx = phrases[3][:5].tolist()
        r = s.draft(delta("c", ctx, datastore="code"), delta("d", ctx))
        # The snapshot's continuation is a path of the tree.
        truth = phrases[3][5:8].tolist()
        assert accepted_length(r.drafts[0].tokens, r.drafts[0].parents, truth, 0) == 3
        assert len(r.drafts[1].tokens) == 0  # empty live datastore, no repeats in ctx
        # a continuing request keeps its datastore whatever the delta names
        r = s.draft(delta("c", [], known_length=5, datastore="default"))
        assert r.drafts[0].status == OK
        assert accepted_length(r.drafts[0].tokens, r.drafts[0].parents, truth, 0) == 3
        finished = s.stub.Finish(
            pb.FinishRequest(
                requests=[
                    pb.FinishedRequest(
                        request_id="c", reason=pb.FINISH_REASON_FINISHED, final_tokens=[1, 2]
                    )
                ]
            )
        )
        assert finished.ingested == 0  # read-only: nothing stored
        err = rpc_error(
            s.stub.Ingest,
            pb.IngestRequest(datastore="code", sequences=[pb.TokenSequence(tokens=[1])]),
        )
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "'code'" in err.details()


def test_a_call_over_two_datastores_with_restarts_drafts_each_from_its_own_context(
    loop_thread: LoopThread, tmp_path: Path, snapshot_dir: Path
) -> None:
    """The engine hands a call's token columns to the native call as they are only when
    every request appends to one datastore; a call that interleaves datastores, starts
    and appends gathers each datastore's rows. Every tree is the full context's."""
    phrases, _ = phrases_corpus(0)
    rng = np.random.default_rng(7)
    contexts = {
        rid: np.concatenate([phrases[j] for j in rng.integers(0, 12, size=10)])
        for rid in ("a", "b", "c", "d", "e")
    }
    names = {"a": "code", "b": "default", "c": "code", "d": "default", "e": "code"}
    stores = {"code": load_snapshot(snapshot_dir)[0], "default": None}
    held = dict.fromkeys(contexts, 0)
    cfg = config(tmp_path / "data", snapshot=snapshot_dir, datastores=(("code", snapshot_dir),))
    with serving(loop_thread, cfg) as s:
        checked = 0
        for step in range(8):
            deltas = []
            for rid, ctx in contexts.items():
                restart = held[rid] == 0 or (step == 4 and rid in ("b", "c"))
                k = 6 if restart else int(rng.integers(0, 3))
                start = 0 if restart else held[rid]
                end = (held[rid] if restart else start) + k
                deltas.append(delta(rid, ctx[start:end], known_length=start, budget=16,
                                    datastore=names[rid]))  # fmt: skip
                held[rid] = end
            response = s.draft(*deltas, step=step)
            for draft, rid in zip(response.drafts, contexts, strict=True):
                assert draft.status == OK and draft.length == held[rid], (step, rid)
                store = stores[names[rid]]
                if store is None:  # the live default: seeded from the same snapshot
                    store = stores["code"]
                local = Drafter(VOCAB, SHIPPED, datastore=store)
                local.start(rid, contexts[rid][: held[rid]])
                tree = local.speculate([rid], [[]], budgets=16).tree(0)
                assert trees_equal(draft, tree.tokens, tree.parents, tree.scores), (step, rid)
                checked += len(draft.tokens) > 0
        assert checked > 10  # the comparison was not vacuous


def test_snapshot_seeds_the_live_datastore_once(
    loop_thread: LoopThread, tmp_path: Path, snapshot_dir: Path
) -> None:
    data = tmp_path / "data"
    with serving(loop_thread, config(data, snapshot=snapshot_dir, vocab_size=None)) as s:
        info = s.stub.GetServiceInfo(pb.GetServiceInfoRequest())
        assert info.datastores[0].num_tokens == 30 * 200 + 29 and info.datastores[0].live
        assert info.tokenizer.name == "unknown"
        s.stub.Ingest(pb.IngestRequest(sequences=[pb.TokenSequence(tokens=[1, 2, 3])]))
    assert [p.name for p in (data / "snapshots").iterdir()] == ["snap-001"]
    # the next start keeps the live directory's own state (snapshot + log), not the seed;
    # the seed is the pinned corpus "seed", the ingest a learned sub-index of its own
    with serving(loop_thread, config(data, snapshot=snapshot_dir)) as s:
        info = s.stub.GetServiceInfo(pb.GetServiceInfoRequest())
        assert info.datastores[0].num_tokens == 30 * 200 + 29 + 3
        assert info.datastores[0].sub_indices == 2


def test_stream_answers_each_step_in_order(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        requests: list[Any] = [
            pb.DraftRequest(step=1, requests=[delta("s", [1, 2, 3, 1, 2])]),
            pb.DraftRequest(step=2, requests=[delta("s", [3], known_length=5)]),
            pb.DraftRequest(step=3),
            pb.DraftRequest(step=4, requests=[delta("s", [1], known_length=6)]),
        ]
        responses = list(s.stub.DraftStream(iter(requests), timeout=10))
        assert [r.step for r in responses] == [1, 2, 3, 4]
        assert [len(r.drafts) for r in responses] == [1, 1, 0, 1]
        assert [r.drafts[0].length for r in responses if r.drafts] == [5, 6, 7]
        assert list(responses[3].drafts[0].tokens[:2]) == [2, 3]  # the input trie: 1 → 2 3


def test_packed_calls_answer_exactly_like_messages(
    loop_thread: LoopThread, tmp_path: Path, snapshot_dir: Path
) -> None:
    """The same steps (starts, deltas, a stale length, an unknown id, two datastores,
    budget 0) sent as messages to one server and packed to another: identical answers."""
    phrases, _ = phrases_corpus(0)
    rng = np.random.default_rng(7)
    contexts = {
        f"r{i}": np.concatenate([phrases[j] for j in rng.integers(0, 12, size=6)]).tolist()
        for i in range(5)
    }
    held = dict.fromkeys(contexts, 0)
    steps: list[list[pb.RequestDelta]] = []
    for step in range(6):
        deltas = []
        for i, (rid, ctx) in enumerate(contexts.items()):
            if (step + i) % 4 == 3:
                continue  # not in this step
            end = min(len(ctx), held[rid] + 8 if held[rid] else 20)
            known = held[rid] + (1 if rid == "r3" and step == 4 else 0)  # r3 goes stale once
            deltas.append(
                delta(rid, ctx[held[rid] : end], known_length=known, budget=(i * 5) % 17,
                      datastore="code" if i % 2 else "", prompt_length=10 if not known else 0)
            )  # fmt: skip
            held[rid] = end if rid != "r3" or step != 4 else 0
        deltas.append(delta(f"ghost{step}", [1], known_length=3))  # never started: RESYNC
        steps.append(deltas)
    # All OK in one datastore: the answer is the batch's arrays as they are (fast path).
    starts = enumerate(contexts.values())
    steps.append([delta(f"n{i}", c[:20], budget=8, datastore="code") for i, c in starts])
    cfg = dict(datastores=(("code", snapshot_dir),))
    with (
        serving(loop_thread, config(tmp_path / "a", **cfg)) as by_message,
        serving(loop_thread, config(tmp_path / "b", **cfg)) as by_column,
    ):
        statuses = set()
        for step, deltas in enumerate(steps):
            want = by_message.draft(*deltas, step=step)
            got = by_column.stub.Draft(pack_deltas(deltas, step), timeout=10)
            assert got.step == step and not got.drafts
            drafts = unpack_drafts(got)
            for asked, draft in zip(deltas, drafts, strict=True):
                draft.request_id = asked.request_id
            assert list(want.drafts) == drafts
            statuses |= {d.status for d in drafts}
            assert sum(len(d.tokens) for d in drafts) > 0
        assert statuses == {OK, RESYNC} and {d.status for d in drafts} == {OK}
