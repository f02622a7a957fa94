"""verifier_client against the real service (`drafter serve` as a subprocess): drafts and
minimal deltas, RESYNC after a restart, the circuit breaker, background finish/ingest."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from client_servers import DrafterProcess

from verifier_client import BreakerConfig, BreakerState, BudgetRule, DrafterClient, Outcome
from verifier_client.results import StepResult

PATTERN = [10, 11, 12, 13, 14, 15]
DEADLINE_MS = 60_000.0  # functional tests: the deadline must not decide the outcome (a bound
# on failure only: a loaded machine took over a second for one step)
FAST_BREAKER = BreakerConfig(failure_threshold=3, cooldown_s=0.05, max_cooldown_s=0.2)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DrafterProcess]:
    """One live service for the module; generations are indexed as soon as they arrive."""
    root = tmp_path_factory.mktemp("drafter")
    server = DrafterProcess(root / "data", "--rebuild-min-tokens", "1",
                            "--rebuild-interval-s", "0.05")  # fmt: skip
    yield server
    server.stop()


def client_for(target: str, **kwargs: object) -> DrafterClient:
    kwargs.setdefault("deadline_ms", DEADLINE_MS)
    kwargs.setdefault("budget", BudgetRule.fixed(8))
    client = DrafterClient(target, **kwargs)  # type: ignore[arg-type]
    client.wait_ready()
    return client


def step_until(
    client: DrafterClient,
    commits: Callable[[], dict[str, list[int]]],
    done: Callable[[StepResult], bool],
    timeout_s: float = 10.0,
) -> StepResult:
    end_s = time.monotonic() + timeout_s
    while True:
        result = client.step(commits())
        if done(result):
            return result
        assert time.monotonic() < end_s, f"gave up; last step {result.outcome}: {client.stats}"
        time.sleep(0.01)


def drafted(result: StepResult, request_id: str, n: int) -> list[int]:
    """The first ``n`` draft tokens of a request (none without a tree)."""
    tree = result[request_id]
    return [] if tree is None else list(tree.tokens[:n])


@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_drafts_come_back_and_later_steps_send_only_new_tokens(
    drafter: DrafterProcess, mode: str
) -> None:
    rid, prompt = f"minimal-{mode}", PATTERN * 4
    with client_for(drafter.target, mode=mode) as client:
        client.add_request(rid, prompt)
        result = client.step({rid: [PATTERN[0]]})
        assert result.ok, client.stats
        tree = result[rid]
        assert tree is not None and 0 < len(tree) <= 8
        assert tree.tokens[0] == PATTERN[1]  # the prompt repeats: its continuation is drafted
        assert client.stats.tokens_sent == len(prompt) + 1  # the whole context, once
        for i in range(2, 8):
            sent_before = client.stats.tokens_sent
            result = client.step({rid: [PATTERN[i % 6]]})
            tree = result[rid]
            assert result.ok and tree is not None and tree.tokens[0] == PATTERN[(i + 1) % 6]
            assert client.stats.tokens_sent == sent_before + 1  # only the committed token
        assert (client.stats.full_resends, client.stats.resyncs) == (0, 0)
        assert client.stats.fallback_steps == 0
        client.abort(rid)


@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_a_request_the_drafter_would_refuse_costs_the_batch_nothing(
    drafter: DrafterProcess, mode: str
) -> None:
    """The drafter refuses a whole call for one bad request (INVALID_ARGUMENT, NOT_FOUND);
    the client leaves such requests out, so the others keep drafting and the breaker
    stays closed."""
    good = [f"fine-{mode}-{i}" for i in range(4)]
    long_id, typo = "L" * 1025, f"typo-{mode}"
    with client_for(drafter.target, mode=mode) as client:
        for rid in good:
            client.add_request(rid, PATTERN * 4)
        client.add_request(long_id, PATTERN * 4)
        client.add_request(typo, PATTERN * 4, datastore="no-such-datastore")
        for i in range(10):
            result = client.step({rid: [PATTERN[i % 6]] for rid in [*good, long_id, typo]})
            assert result.ok, (result.outcome, client.stats)
            assert all(result[rid] is not None for rid in good)
            assert result[long_id] is None and result[typo] is None
        assert result.why(long_id) is Outcome.ERROR and result.why(typo) is Outcome.ERROR
        assert client.breaker_state is BreakerState.CLOSED
        assert client.stats.refused == 2 and client.stats.fallback_steps == 0


@pytest.mark.system
def test_resync_after_a_restart_is_transparent(tmp_path: Path) -> None:
    server = DrafterProcess(tmp_path / "data")
    try:
        with client_for(server.target, breaker=FAST_BREAKER) as client:
            ids = ["r0", "r1"]
            for rid in ids:
                client.add_request(rid, PATTERN * 3)
            assert all(client.step({key: [10] for key in ids}).values())
            server.restart()  # same port and data dir; every request state is gone
            first_ok = step_until(client, lambda: {key: [11] for key in ids}, lambda r: r.ok)
            # The first step the new server answers drafts for everyone: either the lost
            # steps sent whole contexts, or the RESYNCs were resent within that step.
            assert all(first_ok[rid] is not None for rid in ids), first_ok
            assert client.stats.resyncs + client.stats.full_resends >= len(ids)
            sent_before = client.stats.tokens_sent
            assert all(client.step({key: [12] for key in ids}).values())
            assert client.stats.tokens_sent == sent_before + len(ids)  # deltas again
    finally:
        server.stop()


def test_steps_the_rule_gives_no_nodes_send_nothing_and_the_next_drafting_step_catches_up(
    tmp_path: Path,
) -> None:
    """Past the ridge point the budget rule gives no nodes: such a step sends nothing and
    waits for nothing (decoding is never slower for the drafter). Its tokens go with the
    next step that drafts, whose tree is the one a client that sent every step gets for
    the same context; a request never sent is stored whole at finish."""
    server = DrafterProcess(tmp_path / "data", "--rebuild-min-tokens", "1")
    ridge8 = BudgetRule.from_hardware(8, 1)  # batch 1: 7 nodes, 4: 1, 5 and more: 0
    assert [ridge8.draft_budget(b) for b in (1, 4, 5)] == [7, 1, 0]
    commits = [[PATTERN[i % 6]] for i in range(5)]
    try:
        with (client_for(server.target, budget=ridge8) as lean,
              client_for(server.target, budget=BudgetRule.fixed(7)) as every):  # fmt: skip
            ids = [f"a{i}" for i in range(5)]
            for rid in ids:
                lean.add_request(rid, PATTERN * 4)
            every.add_request("b", PATTERN * 4)
            for tokens in commits:
                result = lean.step({rid: tokens for rid in ids})
                assert result.ok and all(result[rid] is None for rid in ids)
                reference = every.step({"b": tokens})
            assert (lean.stats.unsent_steps, lean.stats.tokens_sent) == (5, 0)
            assert lean.stats.drafted_steps == 0 and every.stats.drafted_steps == 5
            for rid in ids[1:]:  # never sent: stored whole at finish
                lean.finish(rid, tail=[], store=rid == "a1")
            assert lean.flush(timeout_s=60)
            # a1 goes as one Ingest of its generation; a2-a4 (not stored) need no call
            assert (lean.stats.background_sent, lean.stats.background_failures) == (1, 0)
            caught_up = lean.step({"a0": [PATTERN[5]]})  # batch 1: 7 nodes
            reference = every.step({"b": [PATTERN[5]]})
            assert lean.stats.tokens_sent == len(PATTERN) * 4 + 6  # the context, once
            tree, want = caught_up["a0"], reference["b"]
            assert tree is not None and want is not None and len(tree) > 0
            assert (list(tree.tokens), list(tree.parents)) == (list(want.tokens),
                                                               list(want.parents))  # fmt: skip
    finally:
        server.stop()


@pytest.mark.system
def test_breaker_opens_costs_nothing_per_step_and_recovers(tmp_path: Path) -> None:
    server = DrafterProcess(tmp_path / "data")
    ids = [f"b{i}" for i in range(8)]
    try:
        with client_for(server.target, breaker=FAST_BREAKER) as client:
            for rid in ids:
                client.add_request(rid, PATTERN * 3)
            assert client.step({key: [10] for key in ids}).ok
            server.stop()
            step_until(client, lambda: {key: [11] for key in ids},
                       lambda r: client.breaker_state is not BreakerState.CLOSED)  # fmt: skip
            assert client.stats.fallbacks[Outcome.BREAKER_OPEN] == 0
            failures = client.stats.fallback_steps
            assert 1 <= failures <= FAST_BREAKER.failure_threshold
            # While open a step builds no message and opens no stream: nothing is sent.
            # (What such a step costs is a benchmark: drafter_bench/breaker_cost.py.)
            stats = client.stats
            wire_before = (stats.tokens_sent, stats.full_resends, stats.reconnects,
                           stats.late_responses, stats.drafted_steps)  # fmt: skip
            for _ in range(500):
                result = client.step({key: [12] for key in ids})
                assert result.outcome is Outcome.BREAKER_OPEN and not any(result.values())
            assert (stats.tokens_sent, stats.full_resends, stats.reconnects,
                    stats.late_responses, stats.drafted_steps) == wire_before  # fmt: skip
            assert client.stats.fallback_steps == failures + 500
            server.restart()
            result = step_until(client, lambda: {key: [13] for key in ids}, lambda r: r.ok)
            assert all(result[rid] is not None for rid in ids)
            assert client.breaker_state is BreakerState.CLOSED and client.stats.probes >= 1
    finally:
        server.stop()


def test_finished_generations_and_ingests_reach_the_datastore(drafter: DrafterProcess) -> None:
    generation = list(range(500, 560))  # tokens no other test uses
    with client_for(drafter.target) as client:
        tokens_before = drafter.info().datastores[0].num_tokens
        client.add_request("writer", generation[:10])
        for i in range(10, 40, 5):
            client.step({"writer": generation[i : i + 5]})
        assert client.finish("writer", tail=generation[40:])
        assert client.flush(timeout_s=10)
        # A new request ending inside that text gets its continuation from the datastore
        # (its own context has none) once the live datastore has indexed it.
        client.add_request("reader", [1, 2, 3, *generation[20:25]])
        step_until(client, lambda: {"reader": []},
                   lambda r: drafted(r, "reader", 3) == generation[25:28])  # fmt: skip
        stored = drafter.info().datastores[0].num_tokens - tokens_before
        assert stored >= len(generation) - 10  # at least the output (prompt: service policy)

        external = list(range(600, 650))
        assert client.ingest([external])
        assert client.flush(timeout_s=10)
        client.add_request("reader2", [1, *external[:6]])
        step_until(client, lambda: {"reader2": []},
                   lambda r: drafted(r, "reader2", 1) == external[6:7])  # fmt: skip
        assert client.stats.background_failures == 0 and client.stats.ingest_drops == 0
