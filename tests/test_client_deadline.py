"""verifier_client against a deliberately slow gRPC DrafterService: the step deadline,
late answers, and a background queue that overflows without blocking decode."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest
from client_servers import SlowDrafter

from verifier_client import BreakerConfig, DrafterClient, Outcome, StepResult

DEADLINE_MS = 5.0
SLOW_S = 0.1  # twenty deadlines: a step that waited for an answer could not hide
NEVER_OPEN = BreakerConfig(failure_threshold=1000)


@pytest.fixture
def slow() -> Iterator[SlowDrafter]:
    server = SlowDrafter()
    yield server
    server.stop()


def warm_client(slow: SlowDrafter, mode: str) -> DrafterClient:
    """A client whose first answered step is behind it (the stream is up)."""
    client = DrafterClient(slow.target, deadline_ms=DEADLINE_MS, mode=mode,  # type: ignore[arg-type]
                           breaker=NEVER_OPEN)  # fmt: skip
    client.wait_ready()
    client.add_request("a", [1, 2, 3])
    step_until_ok(client, {"a": []})
    return client


def step_until_ok(client: DrafterClient, commits: dict[str, list[int]]) -> StepResult:
    """Steps until one is answered (a loaded machine may miss a 5 ms deadline);
    the commits go with the first step only."""
    end_s = time.monotonic() + 5
    while not (result := client.step(commits)).ok:
        assert time.monotonic() < end_s, client.stats
        commits = {rid: [] for rid in commits}
    return result


@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_a_slow_drafter_costs_one_deadline_and_no_drafts(slow: SlowDrafter, mode: str) -> None:
    with warm_client(slow, mode) as client:
        # Warming up on a loaded machine may itself have missed a deadline or two.
        deadlines_before = client.stats.fallbacks[Outcome.DEADLINE]
        slow.delay_s = SLOW_S
        durations_s = []
        for token in range(4, 9):
            start_s = time.perf_counter()
            result = client.step({"a": [token]})
            durations_s.append(time.perf_counter() - start_s)
            assert result.outcome is Outcome.DEADLINE and result["a"] is None
            assert result.why("a") is Outcome.DEADLINE
        deadline_s = DEADLINE_MS / 1e3
        assert statistics.median(durations_s) < deadline_s + 0.003, durations_s
        assert max(durations_s) < deadline_s + 0.040, durations_s
        assert client.stats.fallbacks[Outcome.DEADLINE] == deadlines_before + 5

        # The drafter recovers; the late answers are discarded, and the requests of the
        # timed-out steps go whole, since the drafter may or may not have applied them.
        slow.delay_s = 0.0
        time.sleep(6 * SLOW_S)  # the stream's backlog drains meanwhile
        result = step_until_ok(client, {"a": [9]})
        assert result["a"] is not None
        last = slow.received[-1].requests[0]
        assert (last.known_length, list(last.new_tokens)) == (0, [1, 2, 3, 4, 5, 6, 7, 8, 9])
        if mode == "stream":
            assert client.stats.late_responses >= 5
        fallbacks = client.stats.fallback_steps
        step_until_ok(client, {"a": [10]})
        last = slow.received[-1].requests[0]
        if client.stats.fallback_steps == fallbacks:  # (no extra timeout on a loaded machine)
            assert (last.known_length, list(last.new_tokens)) == (9, [10])


def test_a_full_background_queue_drops_and_counts_without_blocking(slow: SlowDrafter) -> None:
    slow.delay_s = 0.2  # each Ingest call holds the worker
    client = DrafterClient(slow.target, ingest_queue_size=4, breaker=NEVER_OPEN)
    try:
        durations_s = []
        accepted = 0
        for i in range(100):
            start_s = time.perf_counter()
            accepted += client.ingest([[i + 1, i + 2]])
            durations_s.append(time.perf_counter() - start_s)
        assert max(durations_s) < 0.005, max(durations_s)  # never waits for the worker
        # The worker holds at most one batch; the queue holds four.
        assert 4 <= accepted <= 5 and client.stats.ingest_drops == 100 - accepted
        assert client.flush(timeout_s=5)
        assert client.stats.background_sent >= 1 and client.stats.background_failures == 0
    finally:
        client.close()


def test_flush_says_false_when_background_work_was_lost(slow: SlowDrafter) -> None:
    """A Finish/Ingest call that fails loses its work: the next flush says so (False) even
    though the queue drained, so `finish(durable=True)` + `flush()` never reports a
    generation safe that the drafter never got; a later flush with nothing failed is True."""
    client = DrafterClient(slow.target, breaker=NEVER_OPEN, background_timeout_s=0.05)
    try:
        client.wait_ready()
        slow.delay_s = 0.5  # every call now outlives its background deadline
        assert client.ingest([[1, 2, 3]])
        assert not client.flush(timeout_s=5)
        assert client.stats.background_failures == 1
        slow.delay_s = 0.0
        assert client.ingest([[4, 5, 6]])
        assert client.flush(timeout_s=5)  # only what failed since the last flush counts
    finally:
        client.close()
