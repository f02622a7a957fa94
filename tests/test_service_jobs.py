"""The job runner: a light call that finds nothing queued runs on the event loop thread,
anything else is handed to the datastore's worker thread, and either way calls take
effect in the order they were planned, with the same trees."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from drafter_service import Datastore, Drafter
from drafter_service.engine.catalog import Catalog, DatastoreSlot
from drafter_service.engine.draft_jobs import (
    BUDGET_PER_WEIGHT,
    STOPS_PER_WEIGHT,
    TOKENS_PER_WEIGHT,
    DrafterJob,
    JobRunner,
)
from drafter_service.snapshot.store import TokenizerIdentity

VOCAB = 50
NAME = "default"


def corpus() -> Datastore:
    rng = np.random.default_rng(3)
    phrases = [rng.integers(0, VOCAB, size=6).astype(np.int32) for _ in range(8)]
    docs = [np.concatenate([phrases[i] for i in rng.integers(0, 8, size=20)]) for _ in range(20)]
    return Datastore.from_documents(docs, VOCAB)


@pytest.fixture
def catalog() -> Iterator[Catalog]:
    drafter = Drafter(VOCAB, datastore=corpus(), num_threads=2)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-test")
    slot = DatastoreSlot(NAME, drafter, None, executor)
    yield Catalog(TokenizerIdentity("test", VOCAB, ""), {NAME: slot})
    executor.shutdown(wait=True)


def start_job(request_id: str, tokens: list[int], budget: int = 8) -> DrafterJob:
    job = DrafterJob()
    job.starts.append((request_id, np.array(tokens, np.int32), True, 0))
    job.add(request_id, -1, budget)
    return job


def step_job(request_id: str, tokens: list[int], budget: int = 8) -> DrafterJob:
    job = DrafterJob(tokens=np.array(tokens, np.int32), offsets=[0, len(tokens)])
    job.add(request_id, 0, budget)
    return job


def test_weight_grows_with_every_kind_of_work() -> None:
    assert step_job("a", [1, 2, 3]).weight() == 1
    assert start_job("a", [1] * (3 * TOKENS_PER_WEIGHT)).weight() == 4
    # A tiny start followed by a huge append is as heavy as a huge start.
    assert step_job("a", [1] * (1000 * TOKENS_PER_WEIGHT)).weight() == 1001
    assert step_job("a", [1], budget=4 * BUDGET_PER_WEIGHT).weight() == 5
    sweep = DrafterJob(stops=[f"r{i}" for i in range(100 * STOPS_PER_WEIGHT)])
    assert sweep.weight() == 100  # stopping many expired requests is work too


def test_light_call_runs_on_the_loop_thread(catalog: Catalog) -> None:
    async def go() -> None:
        runner = JobRunner(catalog, inline_max_work=16)
        settled_on: list[threading.Thread] = []
        future = runner.run({NAME: start_job("a", [1, 2, 3, 4])},
                            lambda _: settled_on.append(threading.current_thread()))
        assert future.done(), "a light call with nothing queued ran inline"
        assert settled_on == [threading.current_thread()]
        batch = (await future)[NAME]
        assert batch is not None and len(batch) == 1
        await runner.wait_idle()

    asyncio.run(go())


@pytest.mark.parametrize("limit", [0, 3])
def test_heavy_or_disabled_calls_are_handed_off(catalog: Catalog, limit: int) -> None:
    async def go() -> None:
        runner = JobRunner(catalog, inline_max_work=limit)
        job = start_job("a", list(range(VOCAB)) * 4)  # weight 1 + 200 // 8 = 26
        future = runner.run({NAME: job}, lambda _: None)
        assert not future.done(), "handed to the worker thread"
        batch = (await future)[NAME]
        assert batch is not None and len(batch) == 1

    asyncio.run(go())


def test_a_light_call_never_overtakes_queued_work(catalog: Catalog) -> None:
    """The second call depends on the first (it drafts the request the first starts): it
    must wait behind it on the worker thread instead of running inline ahead of it."""

    async def go() -> None:
        runner = JobRunner(catalog, inline_max_work=16)
        big = list(range(VOCAB)) * 400  # 20,000 tokens: far over the inline limit
        first = runner.run({NAME: start_job("a", big)}, lambda _: None)
        second = runner.run({NAME: step_job("a", [7, 8])}, lambda _: None)
        assert not second.done(), "queued behind the first call"
        results = await asyncio.gather(first, second)  # raises if "a" was unknown
        assert all(r[NAME] is not None for r in results)
        assert catalog.slots[NAME].drafter.num_tokens("a") == len(big) + 2
        third = runner.run({NAME: step_job("a", [9])}, lambda _: None)
        assert third.done(), "nothing queued any more: inline again"

    asyncio.run(go())


def test_inline_and_handed_off_calls_draft_the_same_trees() -> None:
    rng = np.random.default_rng(5)
    contexts = [rng.integers(0, VOCAB, size=40).tolist() for _ in range(6)]

    def trees(limit: int) -> list[tuple[list[int], list[int], list[float]]]:
        drafter = Drafter(VOCAB, datastore=corpus(), num_threads=2)
        with ThreadPoolExecutor(max_workers=1) as executor:
            cat = Catalog(TokenizerIdentity("t", VOCAB, ""),
                          {NAME: DatastoreSlot(NAME, drafter, None, executor)})

            async def go() -> list[tuple[list[int], list[int], list[float]]]:
                runner = JobRunner(cat, inline_max_work=limit)
                out = []
                for i, ctx in enumerate(contexts):
                    rid = f"r{i}"
                    await runner.run({NAME: start_job(rid, ctx[:20])}, lambda _: None)
                    for k in range(20, 40, 4):
                        batch = (await runner.run({NAME: step_job(rid, ctx[k:k + 4])},
                                                  lambda _: None))[NAME]
                        assert batch is not None
                        tree = batch.tree(0)
                        out.append((tree.tokens.tolist(), tree.parents.tolist(),
                                    tree.scores.tolist()))
                return out

            return asyncio.run(go())

    inline, handed_off = trees(256), trees(0)
    assert inline == handed_off and sum(len(t[0]) for t in inline) > 0


def test_a_failing_inline_job_fails_the_call_and_settles(catalog: Catalog) -> None:
    async def go() -> None:
        runner = JobRunner(catalog, inline_max_work=16)
        settled: list[dict[str, object]] = []
        future = runner.run({NAME: step_job("never-started", [1])}, settled.append)
        assert future.done() and len(settled) == 1
        with pytest.raises(RuntimeError, match="drafting failed in datastore 'default'"):
            await future
        await asyncio.wait_for(runner.wait_idle(), 1)

    asyncio.run(go())
