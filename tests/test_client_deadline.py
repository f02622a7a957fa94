"""verifier_client against a deliberately slow gRPC DrafterService: the step deadline,
late answers, and a background queue that overflows without blocking decode."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from client_servers import SlowDrafter

from verifier_client import BreakerConfig, DrafterClient, Outcome, StepResult

DEADLINE_MS = 5.0
ATTEMPTS = 1000  # steps before step_until_ok gives up (a count, not a time: load-proof)
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
    for _ in range(ATTEMPTS):
        if (result := client.step(commits)).ok:
            return result
        commits = {rid: [] for rid in commits}
    raise AssertionError(f"no step answered in {ATTEMPTS}: {client.stats}")


@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_a_slow_drafter_costs_one_deadline_and_no_drafts(slow: SlowDrafter, mode: str) -> None:
    with warm_client(slow, mode) as client:
        # Warming up on a loaded machine may itself have missed a deadline or two.
        deadlines_before = client.stats.fallbacks[Outcome.DEADLINE]
        slow.hold()  # no answer comes back until release()
        for token in range(4, 9):
            result = client.step({"a": [token]})
            assert result.outcome is Outcome.DEADLINE and result["a"] is None
            assert result.why("a") is Outcome.DEADLINE
        # Every step returned while its answer was still held: none waited for it. (How
        # promptly after the deadline is a benchmark's question, not a test's.)
        assert slow.held
        assert client.stats.fallbacks[Outcome.DEADLINE] == deadlines_before + 5

        # The drafter recovers; the late answers are discarded, and the requests of the
        # timed-out steps go whole, since the drafter may or may not have applied them.
        slow.release()
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
    slow.hold()  # the first Ingest call holds the background worker until release()
    client = DrafterClient(slow.target, ingest_queue_size=4, breaker=NEVER_OPEN)
    try:
        accepted = 0
        for i in range(100):  # returns at once: an ingest() that waited would wait for good
            accepted += client.ingest([[i + 1, i + 2]])
        # The queue holds four, and the worker one round it took before its call was held
        # (as many as were queued when it woke: how many depends on the machine's timing).
        assert 4 <= accepted < 100 and client.stats.ingest_drops == 100 - accepted
        slow.release()
        assert client.flush(timeout_s=60)
        assert client.stats.background_sent >= 1 and client.stats.background_failures == 0
    finally:
        client.close()


def test_flush_says_false_when_background_work_was_lost(slow: SlowDrafter) -> None:
    """A Finish/Ingest call that fails loses its work: the next flush says so (False) even
    though the queue drained, so `finish(durable=True)` + `flush()` never reports a
    generation safe that the drafter never got; a later flush with nothing failed is True."""
    # Held, a call always outlives its background deadline; released, the next one has
    # that long to succeed, plenty even on a loaded machine.
    client = DrafterClient(slow.target, breaker=NEVER_OPEN, background_timeout_s=5.0)
    try:
        client.wait_ready()
        slow.hold()  # the call now outlives its background deadline
        assert client.ingest([[1, 2, 3]])
        assert not client.flush(timeout_s=60)
        assert client.stats.background_failures == 1
        slow.release()
        assert client.ingest([[4, 5, 6]])
        assert client.flush(timeout_s=60)  # only what failed since the last flush counts
    finally:
        client.close()
