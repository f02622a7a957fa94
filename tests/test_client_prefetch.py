"""The client's pre-drafting (prefetch_fan_out): hits, misses, steps sent ahead, stale and
malformed pre-drafts, RESYNC of a step sent ahead, the deadline, and output identity.

The server is PredraftingDrafter (client_servers.py), a scripted DrafterService that
keeps each request's context from the deltas it gets, so every test can check that the
client's delta state stayed exact: the server holds exactly the tokens the test
committed. Sync and asyncio clients run the same scenarios (the sync client simply
blocks inside the coroutine).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from client_servers import (
    VOCAB_SIZE,
    Chain,
    DrafterProcess,
    PredraftingDrafter,
    bonus_after,
    chain_tree,
    path_to,
)
from packed import pack_predrafts
from worker_support import NO_ADMIN, model64, plain_greedy

from sssd.drafter.v1 import drafter_pb2 as pb
from verifier_client import AioDrafterClient, BudgetRule, DrafterClient
from verifier_client.acceptance_metrics import WorkerMetrics
from verifier_client.breaker import BreakerConfig, BreakerState
from verifier_client.predrafts import decode_predrafts, verified_outcome
from verifier_client.reference_worker.decode_loop import DecodeWorker, GenerationRequest
from verifier_client.results import Outcome, PredraftReport, StepResult, Tree

KINDS = ["sync", "aio"]
SLOW_S = 0.5  # a drafter answer this slow is plainly waited for, or plainly not


@pytest.fixture
def server() -> Iterator[PredraftingDrafter]:
    drafter = PredraftingDrafter()
    yield drafter
    drafter.stop()


@asynccontextmanager
async def client_of(kind: str, target: str, **options: Any) -> AsyncIterator[Any]:
    """A ready DrafterClient or AioDrafterClient (made inside the running loop)."""
    client = (DrafterClient if kind == "sync" else AioDrafterClient)(target, **options)
    try:
        await maybe(client.wait_ready(timeout_s=10))
        yield client
    finally:
        await maybe(client.close(timeout_s=1.0))


async def maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def step(client: Any, commits: Mapping[str, list[int]],
               contexts: dict[str, list[int]]) -> StepResult:  # fmt: skip
    """One step; ``contexts`` follows what the client committed."""
    for rid, tokens in commits.items():
        contexts[rid] += tokens
    result: StepResult = await maybe(client.step(dict(commits)))
    return result


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Waits (on the loop, so that an asyncio client's reader runs) until ``condition``."""
    end_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end_s, "timed out"
        await asyncio.sleep(0.005)


async def predrafts_in(server: PredraftingDrafter, count: int) -> None:
    """Until the server has sent ``count`` prefetch responses, and a moment for them to
    reach the client (as the GPU's verification would give them)."""
    await until(lambda: server.prefetches_sent >= count)
    await asyncio.sleep(0.05)


@asynccontextmanager
async def predrafted(kind: str, server: PredraftingDrafter, contexts: dict[str, list[int]],
                     **options: Any) -> AsyncIterator[tuple[Any, StepResult]]:  # fmt: skip
    """A client (deadline 5 s unless given) with ``contexts`` added and sent in a first
    step, whose result comes with it, once the pre-drafts for that step are in."""
    async with client_of(kind, server.target, **{"deadline_ms": 5000, **options}) as client:
        for rid, prompt in contexts.items():
            client.add_request(rid, prompt)
        first = await step(client, {rid: [] for rid in contexts}, contexts)
        await predrafts_in(server, 1)
        yield client, first


def tree(chain: Chain) -> Tree:
    return Tree.of(*chain)


def outcome_tokens(context: Sequence[int], node: int) -> list[int]:
    """The commits that make the default rule's pre-drafted outcome at ``node`` of the
    tree chain_tree gave after ``context``: the node's path, then its bonus."""
    path = path_to(chain_tree("", context), node)
    return [*path, bonus_after(path[-1] if path else context[-1])]


def all_at(contexts: Mapping[str, Sequence[int]], node: int) -> dict[str, list[int]]:
    """``outcome_tokens`` at ``node`` for every request."""
    return {rid: outcome_tokens(context, node) for rid, context in contexts.items()}


def last_sent(server: PredraftingDrafter) -> dict[str, pb.RequestDelta]:
    return {d.request_id: d for d in server.received[-1].requests}


def run(scenario: Callable[[], Any]) -> None:
    asyncio.run(scenario())


# --- the option


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, "4"])
def test_prefetch_fan_out_is_validated(bad: Any) -> None:
    with pytest.raises(ValueError, match="prefetch_fan_out must be an int"):
        DrafterClient("127.0.0.1:1", prefetch_fan_out=bad)


@pytest.mark.parametrize(("mode", "fan_out"), [("unary", 4), ("stream", 0)])
def test_off_in_unary_mode_or_at_zero(server: PredraftingDrafter, mode: str, fan_out: int) -> None:
    async def scenario() -> None:
        contexts = {"a": [1, 2, 3]}
        async with client_of("sync", server.target, mode=mode, prefetch_fan_out=fan_out) as client:
            client.add_request("a", contexts["a"])
            await step(client, {"a": []}, contexts)
            await step(client, {"a": outcome_tokens(contexts["a"], 0)}, contexts)
            assert [m.prefetch_fan_out for m in server.received] == [0, 0]
            assert not any(d.prefetched for m in server.received for d in m.requests)
            assert server.prefetches_sent == 0 and client.stats.predraft_hits == 0

    run(scenario)


# --- hits, misses and steps sent ahead


@pytest.mark.parametrize("kind", KINDS)
def test_an_all_hit_step_returns_without_waiting_and_state_stays_exact(
    server: PredraftingDrafter, kind: str
) -> None:
    async def scenario() -> None:
        server.delay_s = SLOW_S
        contexts = {"a": [1, 2, 3], "b": [7, 8]}
        async with predrafted(kind, server, contexts, prefetch_fan_out=8) as (client, first):
            assert first["a"] == tree(chain_tree("a", contexts["a"]))
            assert first.wait_s is not None and first.wait_s >= SLOW_S  # the first step waits
            for n, (node_a, node_b) in enumerate([(2, -1), (3, 0), (1, 2)], start=1):
                await predrafts_in(server, n)
                commits = {"a": outcome_tokens(contexts["a"], node_a),
                           "b": outcome_tokens(contexts["b"], node_b)}  # fmt: skip
                began = time.perf_counter()
                result = await step(client, commits, contexts)
                took_s = time.perf_counter() - began
                assert took_s < SLOW_S / 3 and result.wait_s is not None and result.wait_s < took_s
                assert result.ok and result.predrafts.hits == 2 and result.predrafts.misses == 0
                for rid in contexts:  # the pre-draft: the tree after the new context
                    assert result[rid] == tree(chain_tree(rid, contexts[rid]))
                # The message went out without waiting: the slow server takes it now.
                await until(lambda: server.contexts == contexts)
                assert all(d.prefetched and d.known_length for d in last_sent(server).values())
            stats = client.stats
            assert (stats.predraft_hits, stats.ahead_steps, stats.drafted_steps) == (6, 3, 4)
            assert stats.fallback_steps == 0 and stats.late_responses == 0
            assert stats.full_resends == 0 and stats.reconnects == 0
            assert server.wrong_claims == []

    run(scenario)


@pytest.mark.parametrize("kind", KINDS)
def test_a_partial_hit_waits_and_merges(server: PredraftingDrafter, kind: str) -> None:
    async def scenario() -> None:
        contexts = {"a": [1, 2, 3], "b": [7, 8]}
        async with predrafted(kind, server, contexts, prefetch_fan_out=2) as (client, _):
            server.delay_s = 0.2
            # a: the best outcome (nothing accepted); b: one past the fan-out of 2: a miss.
            commits = {"a": outcome_tokens(contexts["a"], -1),
                       "b": outcome_tokens(contexts["b"], 2)}  # fmt: skip
            result = await step(client, commits, contexts)
            assert result.wait_s is not None and result.wait_s >= 0.2  # it waited for b
            assert result["a"] == tree(chain_tree("a", contexts["a"]))  # the pre-draft
            assert result["b"] == tree(chain_tree("b", contexts["b"]))  # the server's answer
            sent = last_sent(server)
            assert sent["a"].prefetched and not sent["b"].prefetched
            assert (result.predrafts.hits, result.predrafts.misses) == (1, 1)
            # A new request joins: it is sent whole, so the step waits even if all others hit.
            await predrafts_in(server, 2)
            contexts["new"] = [40]
            client.add_request("new", contexts["new"])
            commits = {"a": outcome_tokens(contexts["a"], 0),
                       "b": outcome_tokens(contexts["b"], 0), "new": []}  # fmt: skip
            result = await step(client, commits, contexts)
            assert result.predrafts.hits == 2 and result.wait_s is not None
            assert result.wait_s >= 0.2 and client.stats.ahead_steps == 0
            assert result["new"] == tree(chain_tree("new", contexts["new"]))
            assert server.contexts == contexts and server.wrong_claims == []

    run(scenario)


@pytest.mark.parametrize("kind", KINDS)
def test_a_budget_cuts_a_hit_tree(server: PredraftingDrafter, kind: str) -> None:
    async def scenario() -> None:
        contexts = {"a": [1, 2, 3]}
        async with predrafted(kind, server, contexts, prefetch_fan_out=1,
                              budget=BudgetRule.fixed(2)) as (client, _):  # fmt: skip
            result: StepResult = await maybe(
                client.step({"a": outcome_tokens(contexts["a"], -1)}, budgets={"a": 1})
            )
            contexts["a"] += outcome_tokens(contexts["a"], -1)
            got = result["a"]
            assert result.predrafts.hits == 1 and got is not None
            assert got == tree(chain_tree("a", contexts["a"])).first(1) and len(got) == 1

    run(scenario)


# --- what is dropped


@pytest.mark.parametrize("kind", KINDS)
def test_stale_predrafts_are_dropped(server: PredraftingDrafter, kind: str) -> None:
    async def scenario() -> None:
        contexts = {"a": [1, 2, 3], "b": [7, 8]}
        # Labelled with the step before: no request's latest tree is from that step.
        server.stale_by = 1
        async with predrafted(kind, server, contexts, prefetch_fan_out=4) as (client, _):
            result = await step(client, all_at(contexts, -1), contexts)
            assert result.predrafts.stale == 2 and result.predrafts.hits == 0
            assert not any(d.prefetched for d in last_sent(server).values())
            await predrafts_in(server, 2)
            server.stale_by, server.prefetch_delay_s = 0, 0.2
            result = await step(client, {rid: [5] for rid in contexts}, contexts)  # message 3
            assert result.predrafts.stale == 2
            # Late: message 3's pre-drafts come after message 4 went out, so with message 4's
            # they are for a step that is no longer the requests' latest.
            result = await step(client, {rid: [6] for rid in contexts}, contexts)
            assert result.predrafts == PredraftReport()  # message 3's are not in yet
            await predrafts_in(server, 4)
            result = await step(client, {rid: [7] for rid in contexts}, contexts)
            assert (result.predrafts.stale, result.predrafts.misses) == (2, 2)
            stats = client.stats
            assert stats.predrafts_stale == 6 and stats.predraft_hits == 0
            assert stats.late_responses == 0 and server.contexts == contexts

    run(scenario)


def _short_node_counts(p: pb.PrefetchedDrafts) -> None:
    p.node_counts = p.node_counts[:-1]


def _one_outcome_too_many(p: pb.PrefetchedDrafts) -> None:
    p.outcome_counts = (int.from_bytes(p.outcome_counts[:4], "little") + 1).to_bytes(4, "little") \
        + p.outcome_counts[4:]


def _a_node_missing(p: pb.PrefetchedDrafts) -> None:
    p.tokens = p.tokens[:-4]


def _request_twice(p: pb.PrefetchedDrafts) -> None:
    p.request_ids[1] = p.request_ids[0]


@pytest.mark.parametrize("corrupt", [_short_node_counts, _one_outcome_too_many, _a_node_missing,
                                     _request_twice])  # fmt: skip
@pytest.mark.parametrize("kind", KINDS)
def test_malformed_predrafts_are_dropped_and_the_stream_goes_on(
    server: PredraftingDrafter, kind: str, corrupt: Callable[[pb.PrefetchedDrafts], None]
) -> None:
    async def scenario() -> None:
        contexts = {"a": [1, 2, 3], "b": [7, 8]}
        server.corrupt = corrupt
        async with predrafted(kind, server, contexts, prefetch_fan_out=4) as (client, _):
            result = await step(client, all_at(contexts, 0), contexts)
            assert result.ok and result.predrafts.malformed == 1 and result.predrafts.hits == 0
            assert result.predrafts.bytes_received > 0
            await predrafts_in(server, 2)  # the next ones are whole again
            result = await step(client, all_at(contexts, 2), contexts)
            assert result.predrafts.hits == 2 and client.stats.ahead_steps == 1
            await until(lambda: server.contexts == contexts)
            stats = client.stats
            assert stats.reconnects == 0 and stats.fallback_steps == 0
            assert stats.predrafts_malformed == 1

    run(scenario)


# --- the answer to a step sent ahead


@pytest.mark.parametrize("kind", KINDS)
def test_a_resync_of_a_step_sent_ahead_resends_the_context(
    server: PredraftingDrafter, kind: str
) -> None:
    async def scenario() -> None:
        contexts = {"a": [1, 2, 3], "b": [7, 8]}
        async with predrafted(kind, server, contexts, prefetch_fan_out=4) as (client, _):
            server.resync_next = {"a"}  # as if the drafter had evicted a's state
            result = await step(client, all_at(contexts, 0), contexts)
            assert client.stats.ahead_steps == 1 and result["a"] is not None  # its pre-draft
            await predrafts_in(server, 2)
            result = await step(client, all_at(contexts, -1), contexts)
            assert result.predrafts.ahead_resyncs == 1 and client.stats.resyncs == 1
            sent = last_sent(server)
            assert sent["a"].known_length == 0 and list(sent["a"].new_tokens) == contexts["a"]
            assert not sent["a"].prefetched and sent["b"].prefetched  # b still hits
            assert result["a"] == tree(chain_tree("a", contexts["a"]))
            assert server.contexts == contexts and server.wrong_claims == []

    run(scenario)


@pytest.mark.parametrize("kind", KINDS)
def test_waiting_for_a_step_sent_ahead_stops_at_the_deadline(
    server: PredraftingDrafter, kind: str
) -> None:
    async def scenario() -> None:
        deadline_s = 0.3
        contexts = {"a": [1, 2, 3]}
        async with predrafted(kind, server, contexts, deadline_ms=deadline_s * 1e3,
                              prefetch_fan_out=4) as (client, _):  # fmt: skip
            server.delays.append(2 * deadline_s)  # the answer to the step sent ahead
            result = await step(client, {"a": outcome_tokens(contexts["a"], 0)}, contexts)
            assert client.stats.ahead_steps == 1 and result["a"] is not None
            began = time.perf_counter()
            result = await step(client, {"a": [9]}, contexts)  # needs that answer first
            took_s = time.perf_counter() - began
            assert result.outcome is Outcome.DEADLINE and result["a"] is None
            assert deadline_s * 0.9 <= took_s < deadline_s + 0.15
            await asyncio.sleep(deadline_s)  # the late answer arrives
            result = await step(client, {"a": [10]}, contexts)
            assert result.ok and result["a"] == tree(chain_tree("a", contexts["a"]))
            sent = last_sent(server)
            assert sent["a"].known_length == 0 and list(sent["a"].new_tokens) == contexts["a"]
            stats = client.stats
            assert stats.fallbacks[Outcome.DEADLINE] == 1 and stats.late_responses == 1
            assert server.contexts == contexts

    run(scenario)


@pytest.mark.parametrize("kind", KINDS)
def test_a_drafter_lost_after_a_step_sent_ahead_opens_the_circuit(
    server: PredraftingDrafter, kind: str
) -> None:
    async def scenario() -> None:
        contexts = {"a": [1, 2, 3]}
        once = BreakerConfig(failure_threshold=1)
        async with predrafted(kind, server, contexts, prefetch_fan_out=4, breaker=once) as (
            client, _,
        ):  # fmt: skip
            server.delays.append(SLOW_S)  # the answer to the step sent ahead never comes
            result = await step(client, {"a": outcome_tokens(contexts["a"], 0)}, contexts)
            assert client.stats.ahead_steps == 1 and result.ok
            server.stop()  # ends the stream: the answer is lost
            began = time.perf_counter()
            result = await step(client, {"a": [9]}, contexts)
            assert result.outcome is Outcome.BREAKER_OPEN and result["a"] is None
            assert time.perf_counter() - began < SLOW_S
            assert client.breaker_state is BreakerState.OPEN

    run(scenario)


# --- the pure parts


def test_verified_outcome_walks_the_tree() -> None:
    t = Tree.of([5, 6, 7, 8], [-1, -1, 0, 2], [0.0] * 4)
    assert verified_outcome(t, [9]) == (-1, 9)
    assert verified_outcome(t, [5, 9]) == (0, 9)
    assert verified_outcome(t, [5, 7, 8, 1]) == (3, 1)
    assert verified_outcome(t, [6, 5]) == (1, 5)
    assert verified_outcome(t, [5, 7]) is None  # ends inside the tree: no bonus
    assert verified_outcome(t, [9, 5]) is None  # more than one token after the bonus
    assert verified_outcome(t, []) is None
    duplicate = Tree.of([5, 5, 6], [-1, -1, 1], [0.0] * 3)  # the first child wins
    assert verified_outcome(duplicate, [5, 6]) == (0, 6)


def test_decode_predrafts_reads_the_columns() -> None:
    response = pack_predrafts(7, {"a": [(-1, 4, [1, 2], [-1, 0], [0.5, 0.25]), (0, 3, [], [], [])],
                                  "b": [(2, 9, [8], [-1], [1.0])]})  # fmt: skip
    decoded = decode_predrafts(response)
    assert decoded.step == 7 and not decoded.malformed
    assert decoded.size_bytes == response.ByteSize()
    assert decoded.trees["a"] == {(-1, 4): Tree.of([1, 2], [-1, 0], [0.5, 0.25]),
                                  (0, 3): Tree.of([], [], [])}  # fmt: skip
    assert decoded.trees["b"] == {(2, 9): Tree.of([8], [-1], [1.0])}
    response.prefetch.scores = response.prefetch.scores[:-1]
    broken = decode_predrafts(response)
    assert broken.malformed and broken.trees == {}


# --- output identity with the reference decode worker


def truth_drafter(truths: Mapping[str, Sequence[int]], seed: int) -> PredraftingDrafter:
    """A scripted drafter that knows each request's true continuation: its trees follow the
    truth for 1-3 tokens (some with a wrong token), and its outcomes are the true one
    first (not always: some misses) and a wrong one."""

    def tree_for(rid: str, context: Sequence[int]) -> Chain:
        truth = list(truths[rid][len(context) : len(context) + 3]) or [0]
        key = seed + len(context) * 31 + int(rid) * 7
        chain = truth[: 1 + key % 3]
        if key % 5 == 0:  # one wrong token: acceptance stops there
            chain[-1] = (chain[-1] + 1) % VOCAB_SIZE
        tokens = [*chain, (chain[0] + 7) % VOCAB_SIZE]  # a sibling of the first
        parents = [*range(-1, len(chain) - 1), -1]
        order = sorted(range(len(tokens)), key=lambda i: _depth(parents, i))  # breadth-first
        where = {old: new for new, old in enumerate(order)}
        return ([tokens[i] for i in order], [-1 if parents[i] < 0 else where[parents[i]]
                for i in order], [0.5] * len(tokens))  # fmt: skip

    def outcomes_for(rid: str, context: Sequence[int], tree: Chain) -> list[tuple[int, int]]:
        truth = truths[rid][len(context) :]
        node, depth = -1, 0
        while depth < len(truth) - 1:  # greedy verification against the truth
            child = next((c for c in range(len(tree[0]))
                          if tree[1][c] == node and tree[0][c] == truth[depth]), None)  # fmt: skip
            if child is None:
                break
            node, depth = child, depth + 1
        true = (node, truth[depth]) if depth < len(truth) else (node, 0)
        wrong = (-1, (context[-1] + 3) % VOCAB_SIZE)
        key = seed + len(context)
        return [wrong, true] if key % 4 == 0 else [true, wrong]  # misses at fan-out 1

    return PredraftingDrafter(tree_for, outcomes_for)


def _depth(parents: list[int], node: int) -> int:
    depth = 0
    while parents[node] >= 0:
        node, depth = parents[node], depth + 1
    return depth


ITEMS = [[5, 17, 300, 42, 7], [11, 12, 13], [400, 401, 402, 403, 404, 405], [9]]
FORWARD_PASS_S = 0.01  # a decode step's forward pass, as on a GPU (see its use)


def decode(model: Any, client: Any, metrics: WorkerMetrics | None = None) -> dict[str, list[int]]:
    worker = DecodeWorker(model, client, max_batch=3, metrics=metrics)
    generations = worker.run(GenerationRequest(str(i), p, 24) for i, p in enumerate(ITEMS))
    return {g.request_id: g.output_ids for g in generations}


def test_outputs_are_identical_with_pre_drafting_on_and_off() -> None:
    """The reference worker against the scripted drafter: with pre-drafting the drafts
    change (and many steps are sent ahead), the outputs do not."""
    model = model64("llama")
    refs = {str(i): plain_greedy(model, p, 24) for i, p in enumerate(ITEMS)}
    truths = {rid: [*ITEMS[int(rid)], *out, *out] for rid, out in refs.items()}
    # Pre-drafts are sent right after each answer and meant to arrive during the forward
    # pass. This model's pass takes about a millisecond, so on a busy machine the next
    # step could overtake them (no step sent ahead): give each pass the few milliseconds
    # a GPU's would take.
    model.register_forward_pre_hook(lambda *_: time.sleep(FORWARD_PASS_S))
    outputs, stats = {}, {}
    for fan_out in (0, 1, 4):
        server = truth_drafter(truths, seed=fan_out)
        metrics = WorkerMetrics()
        client = DrafterClient(server.target, deadline_ms=5000, budget=BudgetRule.fixed(8),
                               prefetch_fan_out=fan_out)  # fmt: skip
        try:
            client.wait_ready()
            outputs[fan_out] = decode(model, client, metrics)
        finally:
            client.close(timeout_s=1.0)
            server.stop()
        stats[fan_out] = client.stats
        assert server.wrong_claims == []
        value = metrics.registry.get_sample_value
        assert value("sssd:drafter_predraft_hits_total") == client.stats.predraft_hits
        assert value("sssd:drafter_predraft_misses_total") == client.stats.predraft_misses
        assert value("sssd:drafter_predraft_bytes_total") == client.stats.predraft_bytes
        assert value("sssd:drafter_wait_seconds_count") == client.stats.steps
        assert value("sssd:drafter_resyncs_total") == client.stats.resyncs
    assert outputs[0] == outputs[1] == outputs[4] == refs
    assert stats[0].predraft_hits == 0 and stats[0].predraft_bytes == 0
    for fan_out in (1, 4):
        assert stats[fan_out].predraft_hits > 0 and stats[fan_out].ahead_steps > 0
    assert stats[1].predraft_misses > 0  # the true outcome was not always the first


def test_outputs_are_identical_through_the_real_drafter(tmp_path: Any) -> None:
    """Pre-drafting on and off against `drafter serve`: the same outputs (pre-drafts are
    only proposals), and with it on the service's pre-drafts do reach the client."""
    model = model64("llama")
    refs = {str(i): plain_greedy(model, p, 24) for i, p in enumerate(ITEMS)}
    for fan_out in (0, 4):
        drafter = DrafterProcess(tmp_path / f"drafter-{fan_out}", *NO_ADMIN)
        client = DrafterClient(drafter.target, deadline_ms=2000, budget=BudgetRule.fixed(8),
                               prefetch_fan_out=fan_out)  # fmt: skip
        try:
            client.wait_ready()
            assert decode(model, client) == refs
        finally:
            client.close(timeout_s=1.0)
            drafter.stop()
        assert client.stats.fallback_steps == 0 and client.stats.predrafts_malformed == 0
        assert (client.stats.predraft_bytes > 0) == (fan_out > 0)
