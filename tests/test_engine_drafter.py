"""The engine-agnostic half of the plug-ins: settings, and EngineDrafter against the real
service (`drafter serve` as a subprocess). The engines themselves: tests/engines."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from client_servers import DrafterProcess

from verifier_client import BudgetRule, DrafterClient, Outcome
from verifier_client.engines import DrafterSettings, EngineDrafter
from verifier_client.engines.batch import CONFIG_ENV, tokenizer_fingerprint

PATTERN = [10, 11, 12, 13, 14, 15]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DrafterProcess]:
    data_dir = tmp_path_factory.mktemp("drafter") / "data"
    server = DrafterProcess(data_dir, "--rebuild-min-tokens", "1", "--rebuild-interval-s", "0.05")
    yield server
    server.stop()


def settings_for(target: str, **extra: object) -> DrafterSettings:
    # These tests check what is drafted and sent, not the deadline: a generous one, which a
    # step on a loaded machine (a fresh stream's first call took over 1 s here) still makes.
    return DrafterSettings.from_mapping(
        {"address": target, "deadline_ms": 30_000, "budget": 8, **extra}, where="test"
    )


class Rows:
    """An engine's token buffers: one list per row (what tokens(row, start, stop) reads)."""

    def __init__(self, *contexts: Sequence[int]) -> None:
        self.contexts = [list(c) for c in contexts]
        self.reads: list[tuple[int, int, int]] = []

    def tokens(self, row: int, start: int, stop: int) -> list[int]:
        self.reads.append((row, start, stop))
        return self.contexts[row][start:stop]


# --- settings


def test_settings_defaults_and_json_values() -> None:
    s = DrafterSettings.from_mapping({"address": "d:1", "budget": 16, "metrics_port": None},
                                     where="x")  # fmt: skip
    assert (s.address, s.budget, s.deadline_ms, s.mode, s.store) == ("d:1", "16", 5.0, "stream",
                                                                     True)  # fmt: skip
    assert s.budget_rule() == BudgetRule.fixed(16)
    assert DrafterSettings(budget="h200").budget_rule() == BudgetRule.for_gpu("h200")


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ({"adress": "x:1"}, r"--cfg: unknown setting\(s\) \['adress'\]"),
        ({"deadline_ms": 0}, r"--cfg: deadline_ms must be a number > 0, got 0"),
        ({"deadline_ms": "5"}, r"deadline_ms must be a number > 0, got '5'"),
        ({"budget": "lots"}, r"unknown GPU profile 'lots'"),
        ({"mode": "udp"}, r"mode must be 'stream' or 'unary', got 'udp'"),
        ({"route": "id"}, r"route must be 'request' or 'prompt', got 'id'"),
        ({"prefetch_fan_out": 4}, r"--cfg: unknown setting\(s\) \['prefetch_fan_out'\]"),
        ({"store": "no"}, r"store must be true or false, got 'no'"),
        ({"metrics_port": 70000}, r"metrics_port must be an int in \[0, 65535\] or null, got 7"),
        ({"address": ""}, r"address must be a non-empty 'host:port', got ''"),
        ({"chain_rule": "lots"}, r"unknown GPU profile 'lots'"),
        ({"chain_min_score": 1.5}, r"chain_min_score must be a number in \[0, 1\], got 1.5"),
        ({"chain_min_score": "0.1"}, r"chain_min_score must be a number in \[0, 1\], got '0.1'"),
    ],
)
def test_bad_settings_are_refused_by_name(mapping: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DrafterSettings.from_mapping(mapping, where="--cfg")


def test_settings_resolve_environment_then_engine_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, json.dumps({"address": "env:1", "deadline_ms": 9}))
    s = DrafterSettings.resolve({"deadline_ms": 7}, where="engine")
    assert (s.address, s.deadline_ms) == ("env:1", 7)
    monkeypatch.setenv(CONFIG_ENV, "{not json")
    with pytest.raises(ValueError, match=r"\$SSSD_DRAFTER_CONFIG is not a JSON object"):
        DrafterSettings.resolve(None, where="engine")
    monkeypatch.setenv(CONFIG_ENV, json.dumps({"deadline": 3}))
    with pytest.raises(ValueError, match=r"engine and \$SSSD_DRAFTER_CONFIG: unknown setting"):
        DrafterSettings.resolve(None, where="engine")


# --- EngineDrafter against the service


def test_new_rows_send_their_context_known_rows_only_their_tail(drafter: DrafterProcess) -> None:
    engine = EngineDrafter(settings_for(drafter.target))
    try:
        prompt = [*PATTERN, *PATTERN, 10]
        rows = Rows(prompt)
        trees = engine.draft(["a"], [len(prompt)], [len(prompt) - 1], rows.tokens)
        assert rows.reads == [(0, 0, len(prompt))]
        # The context repeats PATTERN: the drafter continues it from the prompt.
        assert trees[0] is not None and trees[0].best_chain(3) == [11, 12, 13]
        rows.contexts[0] += [11, 12]
        engine.draft(["a"], [len(prompt) + 2], [len(prompt) - 1], rows.tokens)
        assert rows.reads[-1] == (0, len(prompt), len(prompt) + 2)  # the tail only
        assert engine.stats.full_resends == 0 and engine.live_requests == 1
    finally:
        engine.close()


def test_engines_sharing_a_drafter_keep_their_request_ids_apart(drafter: DrafterProcess) -> None:
    first, second = (EngineDrafter(settings_for(drafter.target)) for _ in range(2))
    try:
        assert first.namespace != second.namespace
        a, b = Rows([*PATTERN, *PATTERN]), Rows([7, 8, 9, 7, 8, 9, 7])
        first.draft(["0"], [12], [12], a.tokens)
        trees = second.draft(["0"], [7], [7], b.tokens)  # same engine-local id "0"
        assert trees[0] is not None and trees[0].best_chain(2) == [8, 9]
        assert first.draft(["0"], [12], [12], a.tokens)[0] is not None
        assert first.stats.resyncs == second.stats.resyncs == 0
    finally:
        first.close()
        second.close()


def test_a_shrunk_context_starts_the_request_over(drafter: DrafterProcess) -> None:
    engine = EngineDrafter(settings_for(drafter.target))
    try:
        rows = Rows([*PATTERN, *PATTERN])
        engine.draft(["r"], [12], [12], rows.tokens)
        rows.contexts[0] = [7, 8, 9, 7, 8, 9, 7]  # the id now names another request
        trees = engine.draft(["r"], [7], [7], rows.tokens)
        assert rows.reads[-1] == (0, 0, 7)
        assert trees[0] is not None and trees[0].best_chain(2) == [8, 9]
    finally:
        engine.close()


def test_metrics_record_each_drafter_call_and_a_taken_port_only_warns(
    drafter: DrafterProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # The budget gauge shows the engine's own rule (SGLang's plug-in caps the settings').
    engine = EngineDrafter(settings_for(drafter.target, metrics_port=0), budget=BudgetRule.fixed(5))
    with socket.socket() as taken, caplog.at_level(logging.WARNING):
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        unserved = EngineDrafter(settings_for(drafter.target, metrics_port=port,
                                              connect_timeout_s=0))  # fmt: skip
    try:
        assert unserved.metrics is None and f"not served on port {port}" in caplog.text
        rows = Rows([*PATTERN, *PATTERN])
        engine.draft(["m"], [12], [12], rows.tokens)
        assert engine.metrics is not None
        sample = engine.metrics.registry.get_sample_value
        assert sample("sssd:draft_budget") == 5
        assert sample("sssd:drafter_round_trip_seconds_count") == 1
    finally:
        engine.close()
        unserved.close()


def test_a_refused_drafter_leaves_no_client_or_metrics_port_behind(
    drafter: DrafterProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal at startup (a tokenizer mismatch) raises, having closed the client it made
    and freed the metrics port it bound."""
    closed: list[float] = []

    def refuse(self: DrafterClient, timeout_s: float = 10.0) -> None:
        raise ValueError("tokenizer mismatch: client abc, drafter def")

    monkeypatch.setattr(DrafterClient, "wait_ready", refuse)
    monkeypatch.setattr(DrafterClient, "close", lambda self, timeout_s: closed.append(timeout_s))
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        EngineDrafter(settings_for(drafter.target, metrics_port=port))
    assert closed == [0]
    with socket.socket() as again:
        again.bind(("0.0.0.0", port))  # free again


def _stored_tokens(client: DrafterClient) -> int:
    info = client.wait_ready()
    return sum(d.num_tokens for d in info.datastores)


def test_release_ingests_unless_the_request_opted_out(drafter: DrafterProcess) -> None:
    engine = EngineDrafter(settings_for(drafter.target))
    probe = DrafterClient(drafter.target, deadline_ms=1000)
    try:
        before = _stored_tokens(probe)
        for rid in ("private", "kept"):
            rows = Rows([1, 2, 3, *range(500, 520)])  # prompt 3 tokens, output 20
            engine.draft([rid], [23], [3], rows.tokens)
        # The opted-out request first: were it stored, it would be queued, logged and
        # folded in before the kept one (one ingest queue, one log, in order), so once
        # the kept one has landed the opted-out one would have landed too.
        engine.release("private", store=False)
        # The final context holds 5 tokens committed after the last drafted step.
        engine.release("kept", context=[1, 2, 3, *range(500, 525)])
        engine.release("never-drafted")  # a request that only prefilled: nothing to do
        assert engine.client.flush(10) and engine.live_requests == 0
        deadline = time.monotonic() + 60  # a bound on failure only
        while _stored_tokens(probe) == before:
            assert time.monotonic() < deadline, "the kept generation never landed"
            time.sleep(0.05)
        # One generation stored: its 25 output tokens (the 5 from the final context
        # included) and the prompt's 3 kept as its context (--prompt-context-tokens),
        # plus a separator unless the datastore was empty. Both would be 51 or more.
        assert _stored_tokens(probe) - before in (28, 29)
    finally:
        engine.close()
        probe.close()


def test_no_drafter_means_no_drafts_and_no_error() -> None:
    engine = EngineDrafter(DrafterSettings(address="127.0.0.1:1", deadline_ms=20,
                                           connect_timeout_s=0))  # fmt: skip
    try:
        rows = Rows([1, 2, 3], [4, 5])
        for _ in range(5):
            assert engine.draft(["a", "b"], [3, 2], [3, 2], rows.tokens) == [None, None]
        # Every step gave up on the drafter for a reason of its own (how promptly after
        # the deadline is a benchmark's question, not a test's): none raised or erred.
        gave_up = (Outcome.DEADLINE, Outcome.UNAVAILABLE, Outcome.BREAKER_OPEN)
        assert sum(engine.stats.fallbacks[o] for o in gave_up) == 5, engine.stats
        assert engine.stats.fallback_steps == 5 and engine.errors == 0
        engine.release("a")
    finally:
        engine.close(0.1)


def test_a_row_that_cannot_be_read_costs_only_its_own_drafts(drafter: DrafterProcess) -> None:
    engine = EngineDrafter(settings_for(drafter.target))
    try:
        good, flaky = [*PATTERN, *PATTERN], [7, 8, 9, 7, 8, 9, 7]
        broken = {"flaky"}

        def tokens(row: int, start: int, stop: int) -> list[int]:
            if row == 1 and "flaky" in broken:
                raise IndexError("the engine lost this row")
            return (good, flaky)[row][start:stop]

        trees = engine.draft(["good", "flaky"], [12, 7], [12, 7], tokens)
        assert trees[0] is not None and trees[1] is None and engine.errors == 1
        broken.clear()  # readable again: it starts cleanly, as if new
        trees = engine.draft(["good", "flaky"], [12, 7], [12, 7], tokens)
        assert trees[1] is not None and trees[1].best_chain(2) == [8, 9]
        # A known row whose tail cannot be read keeps its length: the tail goes next time.
        flaky += [8, 9]
        broken.add("flaky")
        engine.draft(["good", "flaky"], [12, 9], [12, 7], tokens)
        broken.clear()
        trees = engine.draft(["good", "flaky"], [12, 9], [12, 7], tokens)
        assert trees[1] is not None and trees[1].best_chain(1) == [7]
        assert engine.stats.resyncs == 0 and engine.errors == 2
    finally:
        engine.close()


def test_an_engine_bug_costs_a_step_not_the_decode_loop(drafter: DrafterProcess) -> None:
    engine = EngineDrafter(settings_for(drafter.target))
    try:

        def broken(row: int, start: int, stop: int) -> list[int]:
            raise IndexError("row out of range")

        assert engine.draft(["a", "b"], [3, 3], [3, 3], broken) == [None, None]
        assert engine.errors == 1
    finally:
        engine.close()


def test_the_engines_tokenizer_fingerprint_is_the_drafters_identity(tmp_path: Path) -> None:
    from drafter_service.snapshot.store import TokenizerIdentity

    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text('{"model": {"vocab": {"a": 0, "b": 1}}}')
    identity = TokenizerIdentity.from_file(tokenizer, vocab_size=2)
    assert tokenizer_fingerprint(tmp_path) == identity.fingerprint != ""
    assert tokenizer_fingerprint(tmp_path / "missing") == tokenizer_fingerprint(None) == ""


def test_a_row_that_opted_out_is_never_shared_with_the_recent_tier(tmp_path: Path) -> None:
    """``stores=[False, ...]`` (what the vLLM and SGLang plug-ins read from a request's
    sampling parameters): the opted-out row's context goes with do_not_store, so with the
    recent tier on no other row drafts from it; the row that stores is drafted from."""
    server = DrafterProcess(tmp_path / "data", "--draft-config", "recent_samples=8")
    try:
        engine = EngineDrafter(settings_for(server.target))
        private, public = [1, 2, 3, 40, 41, 42, 43], [5, 6, 7, 50, 51, 52, 53]
        rows = Rows(private, public)
        engine.draft(["p", "q"], [7, 7], [3, 3], rows.tokens, stores=[False, True])
        later = Rows([9, 1, 2, 3], [9, 5, 6, 7])
        trees = engine.draft(["r", "s"], [4, 4], [4, 4], later.tokens)
        assert trees[0] is None or len(trees[0].tokens) == 0  # nothing of the opted-out row
        assert trees[1] is not None and list(trees[1].tokens[:4]) == [50, 51, 52, 53]
        engine.close()
    finally:
        server.stop()
