"""The worker's Prometheus exporter (verifier_client.acceptance_metrics): the names of
docs/metrics.md, scraped over HTTP after a real decode run, with values that agree with the run."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
import torch
from client_servers import DrafterProcess
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from worker_support import NO_ADMIN, OracleDrafter, model64, plain_greedy, prompts

from verifier_client import BudgetRule, DrafterClient, Tree
from verifier_client.acceptance_metrics import WorkerMetrics
from verifier_client.reference_worker.decode_loop import DecodeWorker, GenerationRequest
from verifier_client.results import Outcome, StepResult
from verifier_client.verification.tree_packing import pack_trees
from verifier_client.verification.tree_verification import accept

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def documented_worker_metrics() -> list[str]:
    """Names in the decode-worker table of docs/metrics.md."""
    return re.findall(r"^\| `(sssd:[a-z_:]+)`", DOC.read_text(), flags=re.MULTILINE)


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> {sorted labels: value}, from a real HTTP GET of /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def total(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> float:
    return sum(samples.get(name, {}).values())


@pytest.mark.system
def test_exporter_after_a_real_run_agrees_with_the_run(tmp_path: Path) -> None:
    model = model64("llama")
    items = [[5, 17, 300, 42, 7], [11, 12, 13], [400, 401, 402]]
    drafter = DrafterProcess(tmp_path / "drafter", *NO_ADMIN)
    metrics = WorkerMetrics()
    server = metrics.serve(0, addr="127.0.0.1")
    client = DrafterClient(drafter.target, deadline_ms=60_000.0, budget=BudgetRule.fixed(6))
    try:
        client.wait_ready()
        worker = DecodeWorker(model, client, max_batch=2, metrics=metrics,
                              budget=BudgetRule.fixed(6))  # fmt: skip
        worker.run(GenerationRequest(str(i), p, 30) for i, p in enumerate(items))
        samples = scrape(server.server_port)
    finally:
        server.shutdown()
        client.close(timeout_s=1.0)
        drafter.stop()
    stats = worker.stats
    assert stats.accepted_tokens > 0  # the drafter learned the model's repetitions
    assert total(samples, "sssd:spec_decode_num_drafts_total") == stats.drafts
    assert total(samples, "sssd:spec_decode_num_draft_tokens_total") == stats.draft_tokens
    accepted = total(samples, "sssd:spec_decode_num_accepted_tokens_total")
    assert accepted == stats.accepted_tokens
    per_position = {
        dict(labels)["position"]: v
        for labels, v in samples["sssd:spec_decode_num_accepted_tokens_per_pos_total"].items()
    }
    assert sum(per_position.values()) == accepted
    counts = [per_position.get(str(i), 0.0) for i in range(len(per_position))]
    assert counts == sorted(counts, reverse=True)  # accepted at depth k+1 implies depth k
    assert total(samples, "sssd:drafter_round_trip_seconds_count") == stats.steps
    assert total(samples, "sssd:drafter_fallbacks_total") == sum(stats.fallbacks.values())
    assert total(samples, "sssd:drafter_resyncs_total") == client.stats.resyncs
    assert total(samples, "sssd:draft_budget") == 6
    # 1 + accepted / drafts: the PromQL of docs/metrics.md over the whole run
    tokens_per_draft = 1 + accepted / total(samples, "sssd:spec_decode_num_drafts_total")
    assert tokens_per_draft > 1
    exported = set(samples)
    for name in documented_worker_metrics():
        assert {name, f"{name}_bucket"} & exported, f"{name} is documented but not exported"


def test_record_step_counts_fallbacks_resyncs_and_positions() -> None:
    metrics = WorkerMetrics()
    trees = [Tree.of([7, 8, 9], [-1, 0, 1], [0.0] * 3), None, Tree.of([4, 5], [-1, -1], [0.0] * 2)]
    packed = pack_trees(trees, [1, 2, 3], [4, 0, 9])
    logits = torch.zeros(3, packed.tokens.shape[1], 16)
    logits[0, 0, 7] = logits[0, 1, 8] = logits[0, 2, 1] = 1.0  # row 0 accepts 7, 8
    logits[2, 0, 5] = 1.0  # row 2 accepts 5 (its second root child)
    result = accept(packed, logits.argmax(2))
    answered = StepResult(3, Outcome.OK, ("a", "b", "c"), {}, {"b": Outcome.RESYNC})
    metrics.record_step(result, packed.num_nodes - 1, answered, 0.002, 5)
    metrics.record_step(
        accept(pack_trees([None], [1], [0]), torch.zeros((1, 1), dtype=torch.int64)),
        [0],
        StepResult.without_drafts(4, Outcome.DEADLINE, ("a",)),
        0.003,
        9,
    )
    reg = metrics.registry

    def value(name: str, **labels: str) -> float:
        got = reg.get_sample_value(name, labels)
        return 0.0 if got is None else got

    assert value("sssd:spec_decode_num_drafts_total") == 2
    assert value("sssd:spec_decode_num_draft_tokens_total") == 5
    assert value("sssd:spec_decode_num_accepted_tokens_total") == 3
    assert value("sssd:spec_decode_num_accepted_tokens_per_pos_total", position="0") == 2
    assert value("sssd:spec_decode_num_accepted_tokens_per_pos_total", position="1") == 1
    assert value("sssd:drafter_fallbacks_total", reason="deadline") == 1
    assert value("sssd:drafter_fallbacks_total", reason="unavailable") == 0
    assert value("sssd:drafter_resyncs_total") == 1
    assert value("sssd:drafter_round_trip_seconds_count") == 2
    assert value("sssd:draft_budget") == 9
    assert REGISTRY.get_sample_value("sssd:spec_decode_num_drafts_total") is None  # own registry
    WorkerMetrics()  # a second instance registers without clashing


def test_metrics_from_an_oracle_run_match_its_acceptance() -> None:
    """With a known drafter: every accepted token is counted once, at its depth."""
    model = model64("gpt-neox")
    items = prompts(4, seed=8)
    refs = {str(i): plain_greedy(model, p, 16) for i, p in enumerate(items)}
    truths = {rid: [*items[int(rid)], *out] for rid, out in refs.items()}
    metrics = WorkerMetrics()
    worker = DecodeWorker(model, OracleDrafter(truths, kinds=["hit"]), metrics=metrics)
    worker.run(GenerationRequest(str(i), p, 12) for i, p in enumerate(items))
    reg = metrics.registry
    accepted = reg.get_sample_value("sssd:spec_decode_num_accepted_tokens_total")
    assert accepted == worker.stats.accepted_tokens > 0
    per_position = sum(
        reg.get_sample_value("sssd:spec_decode_num_accepted_tokens_per_pos_total",
                             {"position": str(i)}) or 0.0 for i in range(8))  # fmt: skip
    assert per_position == accepted
    assert reg.get_sample_value("sssd:drafter_round_trip_seconds_count") == worker.stats.steps
