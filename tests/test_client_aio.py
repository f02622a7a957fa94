"""The asyncio client: the sync client's basic flow against the real service, and its
deadline against a slow one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import grpc
import pytest
from client_servers import DrafterProcess, SlowDrafter

from verifier_client import (
    AioDrafterClient,
    BreakerConfig,
    BreakerState,
    BudgetRule,
    Outcome,
    StepResult,
)

PATTERN = [20, 21, 22, 23, 24]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DrafterProcess]:
    root = tmp_path_factory.mktemp("drafter-aio")
    server = DrafterProcess(root / "data", "--rebuild-min-tokens", "1")
    yield server
    server.stop()


@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_aio_drafts_deltas_and_finish(drafter: DrafterProcess, mode: str) -> None:
    async def flow() -> None:
        async with AioDrafterClient(drafter.target, deadline_ms=1000, mode=mode,  # type: ignore[arg-type]
                                    budget=BudgetRule.fixed(8)) as client:  # fmt: skip
            info = await client.wait_ready()
            assert info.limits.max_budget >= 8
            rid = f"aio-{mode}"
            client.add_request(rid, PATTERN * 3)
            result = await client.step({rid: [PATTERN[0]]})
            tree = result[rid]
            assert result.ok and tree is not None and tree.tokens[0] == PATTERN[1]
            for i in range(1, 5):
                sent_before = client.stats.tokens_sent
                result = await client.step({rid: [PATTERN[i]]})
                tree = result[rid]
                assert tree is not None and tree.tokens[0] == PATTERN[(i + 1) % 5]
                assert client.stats.tokens_sent == sent_before + 1
            assert client.finish(rid, tail=[PATTERN[0]])
            assert await client.flush(timeout_s=60)
            assert client.stats.background_sent == 1 and client.stats.fallback_steps == 0

    asyncio.run(flow())


async def step_until_ok(
    client: AioDrafterClient, commits: dict[str, list[int]], timeout_s: float = 60.0
) -> StepResult:
    """Steps until one is answered (``timeout_s`` bounds failure only); the commits go
    with the first step only."""
    end_s = time.monotonic() + timeout_s
    while not (result := await client.step(commits)).ok:
        assert time.monotonic() < end_s, client.stats
        commits = {rid: [] for rid in commits}
        await asyncio.sleep(0.01)
    return result


@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_aio_deadline_and_late_answers(mode: str) -> None:
    slow = SlowDrafter()

    async def flow() -> None:
        breaker = BreakerConfig(failure_threshold=1000)
        async with AioDrafterClient(slow.target, deadline_ms=5, breaker=breaker,
                                    mode=mode) as client:  # type: ignore[arg-type]  # fmt: skip
            await client.wait_ready()
            client.add_request("a", [1, 2])
            await step_until_ok(client, {"a": []})
            slow.hold()  # no answer comes back until release()
            for token in (3, 4, 5):
                result = await client.step({"a": [token]})
                assert result.outcome is Outcome.DEADLINE and result["a"] is None
            assert slow.held  # every step returned while its answer was held: none waited
            slow.release()
            result = await step_until_ok(client, {"a": [6]})
            assert result["a"] is not None
            assert client.stats.late_responses >= (3 if mode == "stream" else 0)
            last = slow.received[-1].requests[0]
            assert (last.known_length, list(last.new_tokens)) == (0, [1, 2, 3, 4, 5, 6])

    try:
        asyncio.run(flow())
    finally:
        slow.stop()


@pytest.mark.system
def test_aio_outage_opens_the_breaker_and_a_restart_resyncs(tmp_path: Path) -> None:
    server = DrafterProcess(tmp_path / "data")
    ids = ["x", "y"]

    async def step_until_drafted(client: AioDrafterClient, token: int) -> None:
        result = await step_until_ok(client, {rid: [token] for rid in ids}, timeout_s=60)
        assert all(result[rid] is not None for rid in ids), result

    async def flow() -> None:
        breaker = BreakerConfig(failure_threshold=2, cooldown_s=0.05, max_cooldown_s=0.2)
        async with AioDrafterClient(server.target, deadline_ms=1000, breaker=breaker) as client:
            await client.wait_ready()
            for rid in ids:
                client.add_request(rid, PATTERN * 2)
            await step_until_drafted(client, 20)
            server.stop()
            for _ in range(20):
                if (await client.step({key: [21] for key in ids})).outcome is Outcome.BREAKER_OPEN:
                    break
                await asyncio.sleep(0.01)
            assert client.breaker_state is not BreakerState.CLOSED
            server.restart()
            await step_until_drafted(client, 22)
            assert client.breaker_state is BreakerState.CLOSED
            assert client.stats.full_resends + client.stats.resyncs >= len(ids)

    try:
        asyncio.run(flow())
    finally:
        server.stop()


def test_aio_sends_its_token_on_every_kind_of_call(tmp_path: Path) -> None:
    token = "aio-token-0123456789"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"aio {token}\n")
    server = DrafterProcess(tmp_path / "data", "--grpc-tokens-file", str(tokens))

    async def flow() -> None:
        modes: tuple[Literal["stream", "unary"], ...] = ("stream", "unary")
        for mode in modes:
            async with AioDrafterClient(server.target, deadline_ms=60_000, mode=mode, token=token,
                                        budget=BudgetRule.fixed(4)) as client:  # fmt: skip
                await client.wait_ready()
                client.add_request(mode, PATTERN * 3)
                assert (await client.step({mode: [PATTERN[0]]})).ok
                assert client.finish(mode, tail=[PATTERN[1]]) and await client.flush(timeout_s=60)
        async with AioDrafterClient(server.target, token="wrong-token-0123456789") as client:
            with pytest.raises(grpc.RpcError) as refused:
                await client.wait_ready(timeout_s=30)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED

    try:
        asyncio.run(flow())
    finally:
        server.stop()
