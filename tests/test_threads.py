"""Thread safety: native worker pools and concurrent Python callers give the sequential results."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from drafter_service import Datastore, DraftBatch, DraftConfig, Drafter

VOCAB = 6
# No recent tier: each request's tree is its own, the same alone as beside the others.
CONFIG = DraftConfig(max_budget=32, datastore_min_tree_nodes=20, recent_samples=0)
NUM_REQUESTS = 64
NUM_STEPS = 8

Trees = dict[tuple[int, str], bytes]  # (step, request id) -> tree bytes
Workload = tuple[Datastore, dict[str, list[int]], list[dict[str, list[int]]], Trees]


def make_workload(seed: int) -> tuple[Datastore, dict[str, list[int]], list[dict[str, list[int]]]]:
    """A datastore, prompts of 64 requests, and per-step deltas (some empty)."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, VOCAB, size=int(rng.integers(5, 80))).tolist() for _ in range(40)]
    datastore = Datastore.from_documents(docs, VOCAB)
    prompts = {}
    for i in range(NUM_REQUESTS):
        doc = docs[i % len(docs)]
        prompts[f"req-{i}"] = doc[: int(rng.integers(0, len(doc)))] + rng.integers(
            0, VOCAB, size=int(rng.integers(0, 30))).tolist()
    steps = [
        {rid: rng.integers(0, VOCAB, size=int(rng.integers(0, 4))).tolist() for rid in prompts}
        for _ in range(NUM_STEPS)
    ]
    return datastore, prompts, steps


def run_batches(drafter: Drafter, prompts: dict[str, list[int]],
                steps: list[dict[str, list[int]]], ids: list[str]) -> list[DraftBatch]:
    for rid in ids:
        drafter.start(rid, prompts[rid])
    budgets = [(i * 7) % 33 for i in range(len(ids))]
    return [drafter.speculate(ids, [step[rid] for rid in ids], budgets) for step in steps]


def trees_by_request(batches: list[DraftBatch], ids: list[str]) -> Trees:
    out = {}
    for s, batch in enumerate(batches):
        for i, rid in enumerate(ids):
            tree = batch.tree(i)
            out[(s, rid)] = tree.tokens.tobytes() + tree.parents.tobytes() + tree.scores.tobytes()
    return out


def run_threads(targets: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


@pytest.fixture(scope="module")
def sequential() -> Workload:
    datastore, prompts, steps = make_workload(11)
    ids = list(prompts)
    drafter = Drafter(VOCAB, CONFIG, datastore, num_threads=1)
    batches = run_batches(drafter, prompts, steps, ids)
    assert sum(len(b.tokens) for b in batches) > 500, "workload drafts too little to compare"
    return datastore, prompts, steps, trees_by_request(batches, ids)


def test_worker_pool_matches_single_thread(sequential: Workload) -> None:
    datastore, prompts, steps, expected = sequential
    ids = list(prompts)
    for num_threads in (2, 4):
        drafter = Drafter(VOCAB, CONFIG, datastore, num_threads=num_threads)
        batches = run_batches(drafter, prompts, steps, ids)
        assert drafter.num_threads == num_threads
        assert trees_by_request(batches, ids) == expected


def test_concurrent_speculate_on_disjoint_requests(sequential: Workload) -> None:
    """8 Python threads, each driving 8 requests, on one drafter with a worker pool."""
    datastore, prompts, steps, expected = sequential
    ids = list(prompts)
    drafter = Drafter(VOCAB, CONFIG, datastore, num_threads=2)
    groups = [ids[g::8] for g in range(8)]
    results: dict[int, list[DraftBatch]] = {}

    def driver(g: int) -> Callable[[], None]:
        def run() -> None:
            mine = groups[g]
            for rid in mine:
                drafter.start(rid, prompts[rid])
            budgets = [(ids.index(rid) * 7) % 33 for rid in mine]
            results[g] = [drafter.speculate(mine, [s[rid] for rid in mine], budgets)
                          for s in steps]
        return run

    run_threads([driver(g) for g in range(8)])
    got: Trees = {}
    for g, batches in results.items():
        got.update(trees_by_request(batches, groups[g]))
    assert got == expected
    assert drafter.num_requests == NUM_REQUESTS


def test_start_stop_churn_while_drafting(sequential: Workload) -> None:
    """Requests come and go while others draft: no crash, no leak, stable results."""
    datastore, prompts, steps, expected = sequential
    ids = list(prompts)
    stable, churned = ids[:32], ids[32:]
    drafter = Drafter(VOCAB, CONFIG, datastore, num_threads=2)
    stop_flag = threading.Event()
    churn_ops = [0, 0, 0]
    want = {k: v for k, v in expected.items() if k[1] in stable}

    def draft_stable() -> None:
        rounds = 0
        try:
            # Enough rounds to overlap with plenty of churn; bounded in case a churn thread died.
            while (rounds < 3 or sum(churn_ops) < 600) and rounds < 300:
                batches = run_batches(drafter, prompts, steps, stable)
                assert trees_by_request(batches, stable) == want
                for rid in stable:
                    assert drafter.stop(rid)
                rounds += 1
        finally:
            stop_flag.set()

    def churn(offset: int) -> Callable[[], None]:
        def run() -> None:
            rng = np.random.default_rng(offset)
            while not stop_flag.is_set():
                rid = churned[int(rng.integers(0, len(churned)))]
                action = int(rng.integers(0, 3))
                try:
                    if action == 0:
                        drafter.start(rid, prompts[rid])
                    elif action == 1:
                        drafter.speculate([rid], [[1, 2]], 16)
                    else:
                        drafter.stop(rid)
                except KeyError:
                    pass  # stopped by the other churn thread
                except ValueError as exc:
                    assert "already started" in str(exc)
                churn_ops[offset] += 1
        return run

    run_threads([draft_stable, churn(0), churn(1), churn(2)])
    for rid in ids:
        drafter.stop(rid)
    assert drafter.num_requests == 0
    assert drafter._native.num_requests == 0, "a stopped request is still held natively"


def test_stop_during_start_frees_the_request() -> None:
    """stop() while start() is still building the trie must not leak the native state."""
    drafter = Drafter(128256)
    prompt = np.random.default_rng(0).integers(0, 128256, size=20000)
    for _ in range(5):
        thread = threading.Thread(target=drafter.start, args=("r", prompt))
        thread.start()
        while "r" not in drafter and thread.is_alive():
            pass
        drafter.stop("r")
        thread.join()
        assert "r" not in drafter
        assert drafter._native.num_requests == 0
