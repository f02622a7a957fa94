"""Drafter metrics (docs/metrics.md): a real server driven by real clients, /metrics
scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import queue
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import grpc
import numpy as np
import pytest
from log_server import RedisServer
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from service_support import (
    VOCAB,
    LoopThread,
    Running,
    config,
    datastore_held,
    delta,
    draft_held,
    parsed_config,
    rpc_error,
    serving,
    wait_until_taken,
)

from drafter_service import Datastore
from drafter_service.live.live_datastore import LiveDatastore
from drafter_service.metrics.drafter_metrics import DrafterMetrics
from drafter_service.service import ServeConfig
from drafter_service.serving import start_server
from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot
from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client import (
    BreakerConfig,
    BudgetRule,
    DrafterClient,
    Outcome,
    StepResult,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
OK, RESYNC = pb.DRAFT_STATUS_OK, pb.DRAFT_STATUS_RESYNC
PATTERN = [11, 12, 13, 14, 15, 16, 17]


class Scrape:
    """One /metrics scrape: samples by name, looked up by labels."""

    def __init__(self, port: int) -> None:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=60) as response:  # bounds failure only
            assert response.status == 200
            text = response.read().decode()
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: list[Sample] = [s for f in self.families.values() for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        """The one sample ``name`` with exactly these labels (``le`` included if given)."""
        found = [s.value for s in self.samples if s.name == name and s.labels == labels]
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
        return float(found[0])

    def has(self, name: str, **labels: str) -> bool:
        return any(s.name == name and s.labels == labels for s in self.samples)

    def buckets(self, name: str, **labels: str) -> dict[float, float]:
        """A histogram's cumulative buckets, upper bound -> count."""
        return {
            float(s.labels["le"]): s.value
            for s in self.samples
            if s.name == name + "_bucket" and {**s.labels, "le": ""} == {**labels, "le": ""}
        }


def scrape(s: Running) -> Scrape:
    assert s.server.metrics_port is not None
    return Scrape(s.server.metrics_port)


def wait_for(s: Running, done: Callable[[Scrape], bool], timeout_s: float = 60.0) -> Scrape:
    """Scrapes until ``done`` holds (for work that finishes on a background thread;
    ``timeout_s`` bounds failure only)."""
    end = time.monotonic() + timeout_s
    while True:
        got = scrape(s)
        if done(got):
            return got
        assert time.monotonic() < end, "metrics never reached the expected values"
        time.sleep(0.02)


def tree_sizes(response: pb.DraftResponse) -> list[int]:
    return [len(d.tokens) for d in response.drafts if d.status == OK]


def test_draft_calls_move_counters_and_histograms_by_exactly_their_work(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    contexts = {f"r{i}": PATTERN * 3 + [11 + i] for i in range(3)}
    with serving(loop_thread, config(tmp_path)) as s:
        before = scrape(s)
        assert before.value("sssd_drafter_requests_total", datastore="default") == 0
        sizes: list[int] = []
        batch_lengths: list[int] = []
        held = {rid: 0 for rid in contexts}
        calls_s = 0.0  # the calls' time as the client saw it: the service's is within it
        for step in range(6):
            deltas = []
            for i, (rid, ctx) in enumerate(contexts.items()):
                take = 8 if step == 0 else 1
                tokens = (ctx + PATTERN * 4)[held[rid] : held[rid] + take]
                budget = 0 if (step, i) == (2, 1) else 8  # one empty tree on purpose
                deltas.append(delta(rid, tokens, known_length=held[rid], budget=budget))
                held[rid] += take
            called = time.perf_counter()
            response = s.draft(*deltas, step=step)
            calls_s += time.perf_counter() - called
            assert [d.status for d in response.drafts] == [OK] * 3
            sizes += tree_sizes(response)
            batch_lengths.append(len(deltas))
        after = scrape(s)

    n = len(sizes)
    assert after.value("sssd_drafter_requests_total", datastore="default") == n == 18
    nonempty = sum(1 for k in sizes if k)
    assert 0 < nonempty < n  # the repeated pattern drafts; the budget-0 request does not
    assert after.value("sssd_drafter_trees_total", datastore="default") == nonempty
    assert after.value("sssd_drafter_tree_nodes_count", datastore="default") == n
    assert after.value("sssd_drafter_tree_nodes_sum", datastore="default") == sum(sizes)
    buckets = after.buckets("sssd_drafter_tree_nodes", datastore="default")
    assert buckets, "no tree_nodes buckets"
    for le, count in buckets.items():
        assert count == sum(1 for k in sizes if k <= le), le
    assert after.value("sssd_drafter_batch_requests_count", method="Draft") == 6
    assert after.value("sssd_drafter_batch_requests_sum", method="Draft") == sum(batch_lengths)
    assert after.value("sssd_drafter_batch_requests_count", method="DraftStream") == 0
    assert after.value("sssd_drafter_batch_duration_seconds_count", method="Draft") == 6
    # In seconds, and only the calls' own time: within what the client waited for them.
    assert 0 < after.value("sssd_drafter_batch_duration_seconds_sum", method="Draft") <= calls_s
    assert after.value("sssd_drafter_request_duration_seconds_count", datastore="default") == n
    per_request = after.value("sssd_drafter_request_duration_seconds_sum", datastore="default")
    batch_total = after.value("sssd_drafter_batch_duration_seconds_sum", method="Draft")
    assert 0 < per_request <= batch_total  # the native jobs run inside the calls
    assert after.value("sssd_drafter_active_requests") == 3
    errors = [x for x in after.samples if x.name == "sssd_drafter_rpc_errors_total"]
    assert errors and all(x.value == 0 for x in errors)


def test_errors_are_counted_by_method_and_code(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path, max_budget=16)) as s:
        for _ in range(2):
            err = rpc_error(s.draft, delta("a", [1, 2], datastore="no-such-store"))
            assert err.code() == grpc.StatusCode.NOT_FOUND
        err = rpc_error(s.draft, delta("b", [1, 2], budget=17))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        bad_ingest = pb.IngestRequest(sequences=[pb.TokenSequence(tokens=[VOCAB])])
        err = rpc_error(s.stub.Ingest, bad_ingest)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        got = scrape(s)
    counted = {
        (x.labels["method"], x.labels["code"]): x.value
        for x in got.samples
        if x.name == "sssd_drafter_rpc_errors_total"
    }
    expected = {("Draft", "NOT_FOUND"): 2, ("Draft", "INVALID_ARGUMENT"): 1}
    expected[("Ingest", "INVALID_ARGUMENT")] = 1
    assert {key: value for key, value in counted.items() if value} == expected
    assert ("Finish", "UNAVAILABLE") in counted  # the other series exist, at zero
    # refused calls are not batches
    assert got.value("sssd_drafter_batch_duration_seconds_count", method="Draft") == 0


def test_resyncs_are_counted_by_reason(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        s.draft(delta("held", [1, 2, 3, 4]))
        r = s.draft(
            delta("ghost", [5], known_length=7),  # never started: unknown
            delta("held", [5], known_length=3),  # the drafter holds 4: length_mismatch
            delta("fresh", [1, 2]),
        )
        assert [d.status for d in r.drafts] == [RESYNC, RESYNC, OK]
        r = s.draft(delta("ghost2", [1], known_length=1))
        assert r.drafts[0].status == RESYNC
        got = scrape(s)
    assert got.value("sssd_drafter_resyncs_total", reason="unknown") == 2
    assert got.value("sssd_drafter_resyncs_total", reason="length_mismatch") == 1
    # RESYNC answers are in the batch but were not drafted
    assert got.value("sssd_drafter_batch_requests_sum", method="Draft") == 1 + 3 + 1
    assert got.value("sssd_drafter_requests_total", datastore="default") == 1 + 1


def test_ingest_rebuild_and_snapshot_metrics_follow_the_live_datastore(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    # No rebuild but the forced one below (none brought forward on a slow machine either).
    cfg = config(tmp_path, rebuild_min_tokens=10**6, rebuild_interval_s=3600.0,
                 rebuild_max_share=0.0)  # fmt: skip
    started = time.time()
    with serving(loop_thread, cfg) as s:
        live = s.server.engine.catalog.slots["default"].live  # type: ignore[union-attr]
        assert live is not None
        first = scrape(s)
        assert first.value("sssd_drafter_ingested_sequences_total", datastore="default") == 0
        assert first.value("sssd_drafter_rebuilds_total", datastore="default") == 0
        age = first.value("sssd_drafter_snapshot_age_seconds", datastore="default")
        assert 0 <= age <= time.time() - started + 1  # no snapshot yet: since start

        # A finished generation, stored as the last 3 prompt tokens + the output.
        s.draft(delta("gen", [1, 2, 3, 4, 5, 6, 7], prompt_length=5))  # 5 prompt + 2 output
        s.draft(delta("gen", [8, 9], known_length=7))
        finish = pb.FinishRequest(
            requests=[
                pb.FinishedRequest(
                    request_id="gen", reason=pb.FINISH_REASON_FINISHED, final_tokens=[10]
                )
            ]
        )
        assert s.stub.Finish(finish).ingested == 1
        stored = 3 + 2 + 2 + 1
        got = wait_for(
            s, lambda m: m.value("sssd_drafter_ingested_sequences_total", datastore="default") == 1
        )
        assert got.value("sssd_drafter_ingested_tokens_total", datastore="default") == stored
        assert got.value("sssd_drafter_ingest_queue_depth") == 0
        assert got.value("sssd_drafter_active_requests") == 0

        # The Ingest call: two more sequences.
        seqs = [pb.TokenSequence(tokens=[20, 21, 22]), pb.TokenSequence(tokens=[23, 24, 25, 26])]
        assert s.stub.Ingest(pb.IngestRequest(sequences=seqs)).accepted == 2
        got = scrape(s)
        assert got.value("sssd_drafter_ingested_sequences_total", datastore="default") == 3
        assert got.value("sssd_drafter_ingested_tokens_total", datastore="default") == stored + 7
        assert got.value("sssd_drafter_datastore_tokens", datastore="default") == 0  # waiting
        assert got.value("sssd_drafter_wal_bytes", datastore="default") == live.stats().wal_bytes
        assert live.stats().wal_bytes > 0

        assert live.rebuild()  # forced: folds the three documents in
        got = scrape(s)
        stats = live.stats()
        assert got.value("sssd_drafter_rebuilds_total", datastore="default") == 1
        assert got.value("sssd_drafter_rebuild_duration_seconds_count", datastore="default") == 1
        assert got.value(
            "sssd_drafter_rebuild_duration_seconds_sum", datastore="default"
        ) == pytest.approx(stats.last_rebuild_seconds)
        assert got.value("sssd_drafter_datastore_tokens", datastore="default") == stats.num_tokens
        assert stats.num_tokens == stored + 7 + 2  # two separators between three documents
        assert got.value("sssd_drafter_datastore_resident_bytes", datastore="default") == (
            stats.resident_bytes
        )
        assert got.value("sssd_drafter_datastore_sub_indices", datastore="default") == 1

        info = live.snapshot()
        got = scrape(s)
        # Since the snapshot now, not since start: at most the time since it was written.
        age = got.value("sssd_drafter_snapshot_age_seconds", datastore="default")
        assert 0 <= age <= time.time() - info.created_unix
        assert got.value("sssd_drafter_wal_bytes", datastore="default") == live.stats().wal_bytes
        dropped = {r: got.value("sssd_drafter_ingest_dropped_total", reason=r) for r in
                   ("queue_full", "datastore_full", "error")}  # fmt: skip
        assert dropped == {"queue_full": 0, "datastore_full": 0, "error": 0}


def test_generation_refused_by_a_full_datastore_is_counted_as_dropped(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    # The bound admits the empty datastore's token table (4 bytes per vocabulary entry)
    # but not one stored token more (8 bytes each).
    cfg = config(tmp_path, max_resident_bytes=4 * (VOCAB + 1) + 4)
    with serving(loop_thread, cfg) as s:
        s.draft(delta("gen", [1, 2, 3, 4], prompt_length=2))
        finish = pb.FinishRequest(
            requests=[pb.FinishedRequest(request_id="gen", reason=pb.FINISH_REASON_FINISHED)]
        )
        assert s.stub.Finish(finish).ingested == 1  # queued; the datastore refuses it later
        got = wait_for(
            s, lambda m: m.value("sssd_drafter_ingest_dropped_total", reason="datastore_full") == 1
        )
        assert got.value("sssd_drafter_ingest_dropped_total", reason="error") == 0
        assert got.value("sssd_drafter_ingest_dropped_total", reason="queue_full") == 0
        assert got.value("sssd_drafter_ingested_sequences_total", datastore="default") == 0


def test_read_only_datastore_is_reported_by_name(loop_thread: LoopThread, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    docs = [np.tile(rng.integers(0, VOCAB, size=6).astype(np.int32), 5) for _ in range(4)]
    datastore = Datastore.from_documents(docs, VOCAB)
    write_snapshot(tmp_path / "snap", datastore, TokenizerIdentity("unknown", VOCAB, ""))
    cfg = config(tmp_path / "data", datastores=(("code", tmp_path / "snap"),))
    with serving(loop_thread, cfg) as s:
        r = s.draft(delta("c", docs[0][:12].tolist(), datastore="code"))
        got = scrape(s)
    assert got.value("sssd_drafter_datastore_tokens", datastore="code") == datastore.num_tokens
    assert got.value("sssd_drafter_datastore_resident_bytes", datastore="code") == (
        datastore.resident_bytes
    )
    assert got.value("sssd_drafter_datastore_sub_indices", datastore="code") == 1
    assert got.value("sssd_drafter_requests_total", datastore="code") == 1
    nonempty = int(len(r.drafts[0].tokens) > 0)
    assert got.value("sssd_drafter_trees_total", datastore="code") == nonempty
    assert got.value("sssd_drafter_requests_total", datastore="default") == 0
    # no ingest log or snapshots of its own: those series are the live datastore's only
    assert not got.has("sssd_drafter_wal_bytes", datastore="code")
    assert not got.has("sssd_drafter_snapshot_age_seconds", datastore="code")
    assert got.has("sssd_drafter_wal_bytes", datastore="default")


def test_stream_steps_of_the_real_client_are_draftstream_batches(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        client = DrafterClient(
            s.server.address, deadline_ms=5000.0, mode="stream", budget=BudgetRule.fixed(8)
        )
        with client:
            client.wait_ready()
            for i in range(4):
                client.add_request(f"r{i}", PATTERN * 3)
            steps = 5
            for _ in range(steps):
                result = client.step({f"r{i}": [PATTERN[0]] for i in range(4)})
                assert result.outcome.name == "OK", result.outcome
        got = scrape(s)
    assert got.value("sssd_drafter_batch_requests_count", method="DraftStream") == steps
    assert got.value("sssd_drafter_batch_requests_sum", method="DraftStream") == 4 * steps
    assert got.value("sssd_drafter_batch_duration_seconds_count", method="DraftStream") == steps
    assert got.value("sssd_drafter_batch_requests_count", method="Draft") == 0
    assert got.value("sssd_drafter_requests_total", datastore="default") == 4 * steps


GIVE_UP_MS = 500.0
MAX_MISSES = 20  # steps a loaded machine may answer late before a test gives up on it


def _giving_up_client(s: Running, mode: Literal["stream", "unary"], **extra: Any) -> DrafterClient:
    """A ready client with one request, whose steps give up at GIVE_UP_MS."""
    client = DrafterClient(s.server.address, deadline_ms=GIVE_UP_MS, mode=mode,
                           budget=BudgetRule.fixed(8), **extra)  # fmt: skip
    client.wait_ready()
    client.add_request("held", PATTERN)
    return client


def _given_up_step(client: DrafterClient) -> StepResult:
    """A step the service cannot answer (its worker thread is held): the client gives up."""
    result = client.step({"held": []})
    assert result.outcome is Outcome.DEADLINE, result.outcome
    return result


def _handing_off(tmp_path: Path) -> ServeConfig:
    """Every call's native work goes to the datastore's worker thread (none inline)."""
    return config(tmp_path, inline_max_work=0)


def test_a_unary_call_given_up_while_the_service_works_on_it_is_counted_cancelled(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """docs/metrics.md: a Draft call the client gives up on while the service still works
    on it (DrafterClient in unary mode cancels it at its deadline) is CANCELLED. The call
    is cancelled only once the service holds it, so no deadline races the machine's speed
    (one that expires before the call arrives is DEADLINE_EXCEEDED instead)."""
    with serving(loop_thread, _handing_off(tmp_path)) as s:
        with draft_held(s, delta("held", PATTERN)) as call:
            call.cancel()
            got = wait_for(s, lambda m: m.value("sssd_drafter_rpc_errors_total",
                                                method="Draft", code="CANCELLED") >= 1)  # fmt: skip
    assert got.value("sssd_drafter_rpc_errors_total", method="Draft", code="CANCELLED") == 1
    assert got.value("sssd_drafter_batch_requests_count", method="Draft") == 0  # not answered
    with pytest.raises(grpc.FutureCancelledError):
        call.result()


def test_a_stream_step_given_up_at_the_deadline_is_not_seen_by_the_service(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """docs/metrics.md: in stream mode the client gives up on a step without cancelling the
    stream, so the service answers it (a DraftStream batch like any other), counts no
    error, and the client drops the late answer (``late_responses``)."""
    # A breaker that stays closed through the misses the loop below allows (the default
    # opens at the third failure and would close the stream).
    breaker = BreakerConfig(failure_threshold=MAX_MISSES + 2)
    with serving(loop_thread, _handing_off(tmp_path)) as s:
        with _giving_up_client(s, "stream", breaker=breaker) as client:
            with datastore_held(s):
                _given_up_step(client)
            got = wait_for(s, lambda m: m.value("sssd_drafter_batch_requests_count",
                                                method="DraftStream") == 1)  # fmt: skip
            client.add_request("light", PATTERN)
            # The next answer the client reads is the late one, dropped. A step that itself
            # misses the deadline on a loaded machine is late too, and so on until one is
            # answered in time: each miss adds exactly one late answer.
            missed = 0
            while (outcome := client.step({"light": []}).outcome) is Outcome.DEADLINE:
                missed += 1
                assert missed < MAX_MISSES, f"no step answered within {MAX_MISSES} deadlines"
            assert outcome is Outcome.OK
            assert client.stats.late_responses == 1 + missed
    errors = [x for x in got.samples if x.name == "sssd_drafter_rpc_errors_total"]
    assert errors and all(x.value == 0 for x in errors)


def test_a_stream_closed_mid_step_is_counted_cancelled(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """docs/metrics.md: a stream the client closes with the service still at work on a
    step (DrafterClient does when a give-up opens its circuit breaker) is CANCELLED, on
    DraftStream. Closed only once the service holds the step: no race with the clock."""
    with serving(loop_thread, _handing_off(tmp_path)) as s:
        cancelled = {"method": "DraftStream", "code": "CANCELLED"}
        outbox: queue.Queue[pb.DraftRequest | None] = queue.Queue()
        with datastore_held(s):
            call = s.stub.DraftStream(iter(outbox.get, None))
            outbox.put(pb.DraftRequest(step=0, requests=[delta("held", PATTERN, budget=8)]))
            wait_until_taken(s)
            call.cancel()
            outbox.put(None)
            got = wait_for(s, lambda m: m.value("sssd_drafter_rpc_errors_total", **cancelled) >= 1)
    assert got.value("sssd_drafter_rpc_errors_total", **cancelled) == 1
    assert got.value("sssd_drafter_batch_requests_count", method="DraftStream") == 0


def test_info_names_the_version_and_tokenizer(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        got = scrape(s)
        version = s.stub.GetServiceInfo(pb.GetServiceInfoRequest()).version
    [info] = [x for x in got.samples if x.name == "sssd_drafter_info"]
    assert info.value == 1
    assert info.labels == {"version": version, "tokenizer_fingerprint": ""}


def test_metrics_port_minus_one_disables_the_endpoint(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    with serving(loop_thread, config(tmp_path, metrics_port=-1)) as s:
        assert s.server.metrics_port is None
        assert s.draft(delta("a", [1, 2])).drafts[0].status == OK  # serving is unaffected


def test_metrics_settings_come_from_flags_and_environment() -> None:
    config = parsed_config(["--metrics-port", "-1"], {"DRAFTER_HOST": "::1"})
    assert config.metrics_port == -1 and config.metrics_host is None  # follows --host
    config = parsed_config([], {"DRAFTER_METRICS_HOST": "0.0.0.0"})
    assert config.metrics_port == 9400 and config.metrics_host == "0.0.0.0"
    with pytest.raises(ValueError, match=r"ServeConfig\.metrics_port = -2"):
        parsed_config(["--metrics-port", "-2"], {})


def test_a_metrics_port_in_use_fails_the_start(loop_thread: LoopThread, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            loop_thread.run(start_server(config(tmp_path, metrics_port=port)))


def test_metrics_endpoint_closes_with_the_server(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        port = s.server.metrics_port
        assert port is not None
        scrape(s)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_two_servers_in_one_process_keep_their_own_numbers(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    with (
        serving(loop_thread, config(tmp_path / "a")) as a,
        serving(loop_thread, config(tmp_path / "b")) as b,
    ):
        assert a.server.metrics_port != b.server.metrics_port
        a.draft(delta("x", [1, 2, 3]))
        a.draft(delta("x", [4], known_length=3))
        b.draft(delta("y", [1, 2, 3]))
        assert scrape(a).value("sssd_drafter_requests_total", datastore="default") == 2
        assert scrape(b).value("sssd_drafter_requests_total", datastore="default") == 1


def documented_metrics() -> dict[str, tuple[str, dict[str, set[str]]]]:
    """docs/metrics.md's drafter table: name -> (type, {label: documented values})."""
    rows: dict[str, tuple[str, dict[str, set[str]]]] = {}
    for line in DOCS.read_text().splitlines():
        match = re.match(r"\|\s*`(sssd_drafter_\w+)`\s*\|\s*([^|]+?)\s*\|\s*([^|]*?)\s*\|", line)
        if not match:
            continue
        name, kind, label_text = match.groups()
        labels: dict[str, set[str]] = {}
        for label, values in re.findall(r"`(\w+)`(?:\s*\(([^)]*)\))?", label_text):
            labels[label] = set(re.findall(r"`(\w+)`", values))
        rows[name] = (kind.split()[0], labels)
    return rows


def test_every_documented_drafter_metric_is_exported(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    documented = documented_metrics()
    assert len(documented) >= 20, "the drafter table of docs/metrics.md was not parsed"
    shared = {n for n in documented if n.startswith("sssd_drafter_shared_log_")}
    assert len(shared) == 4
    with serving(loop_thread, config(tmp_path)) as s:  # no shared log: no shared_log series
        check_exported(scrape(s), {n: v for n, v in documented.items() if n not in shared})
    redis = RedisServer(tmp_path / "redis")
    try:
        with serving(loop_thread, config(tmp_path / "shared", shared_log=redis.url)) as s:
            check_exported(scrape(s), documented)
    finally:
        redis.stop()


def check_exported(got: Scrape, documented: dict[str, tuple[str, dict[str, set[str]]]]) -> None:
    exported = {}
    for family in got.families.values():
        if family.name.startswith("sssd_drafter_"):
            name = family.name + ("_total" if family.type == "counter" else "")
            exported[name] = family
    assert set(exported) == set(documented), "docs/metrics.md and the exporter disagree"
    for name, (kind, labels) in documented.items():
        family = exported[name]
        assert family.type == kind, name
        assert family.samples, f"{name} has no series before traffic"
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(labels), (name, sample.labels)
        for label, values in labels.items():
            seen = {sample.labels[label] for sample in family.samples}
            assert values <= seen, (name, label, values - seen)


def test_recording_needs_no_server() -> None:
    """The recorder alone: tree sizes land in the right buckets, requests share the time."""
    metrics = DrafterMetrics()
    offsets = np.array([0, 0, 3, 3, 11, 11 + 300], dtype=np.int64)  # 0, 3, 0, 8, 300 nodes
    metrics.record_trees("default", offsets, job_seconds=0.005)
    families = {f.name: f for f in metrics.collect()}
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value for x in
               families["sssd_drafter_tree_nodes"].samples}  # fmt: skip

    def bucket(le: str) -> float:
        return samples["sssd_drafter_tree_nodes_bucket", (("datastore", "default"), ("le", le))]

    les = ("0.0", "2.0", "4.0", "8.0", "256.0", "+Inf")
    assert [bucket(le) for le in les] == [2, 2, 3, 4, 4, 5]
    assert samples["sssd_drafter_tree_nodes_sum", (("datastore", "default"),)] == 311
    [trees] = families["sssd_drafter_trees"].samples
    assert trees.value == 3
    [count] = [x for x in families["sssd_drafter_request_duration_seconds"].samples
               if x.name.endswith("_count")]  # fmt: skip
    [total] = [x for x in families["sssd_drafter_request_duration_seconds"].samples
               if x.name.endswith("_sum")]  # fmt: skip
    assert count.value == 5 and total.value == pytest.approx(0.005)


def test_live_datastore_reports_each_rebuild_to_its_listeners(tmp_path: Path) -> None:
    seen: list[float] = []
    with LiveDatastore(tmp_path, TokenizerIdentity("t", VOCAB, ""), background=False) as live:
        live.add_rebuild_listener(seen.append)
        assert not live.rebuild()  # nothing waiting: no rebuild, no call
        live.ingest([1, 2, 3])
        assert live.rebuild()
        assert seen == [live.stats().last_rebuild_seconds]
        assert live.stats().ingested_sequences == 1 and live.stats().ingested_tokens == 3
