"""The reference decode worker is lossless: its output equals plain decoding, token for token
(greedy) or in distribution (sampling), whatever the drafter proposes, when it proposes it,
or whether it answers at all.

The tiny models run in float64. A tree forward computes a node's logits with other
reduction orders than a one-token forward (other key lengths, other matmul shapes);
in float32 that moves logits by ~1e-7, enough to flip the argmax where two logits of a
random model nearly tie, which would be a false failure (it is not a property of the
method). In float64 the differences are ~1e-16, far below any tie these models have.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from client_servers import DrafterProcess
from worker_support import NO_ADMIN, OracleDrafter, model64, plain_greedy, prompts

from verifier_client import BudgetRule, DrafterClient, Tree
from verifier_client.reference_worker.decode_loop import (
    DecodeWorker,
    GenerationRequest,
    SamplingParams,
)
from verifier_client.reference_worker.worker_cli import main
from verifier_client.results import Outcome, StepResult


@pytest.fixture(scope="module", params=["llama", "qwen2:eager", "gpt-neox"])
def model(request: pytest.FixtureRequest) -> Any:
    """Llama (GQA, SDPA), Qwen2 (qkv biases, eager attention: the additive mask path),
    GPT-NeoX (fused qkv, partial rotary, parallel residual)."""
    arch, _, attn = request.param.partition(":")
    return model64(arch, attn_implementation=attn or "sdpa")


def references(model: Any, items: list[list[int]], n: int) -> dict[str, list[int]]:
    return {str(i): plain_greedy(model, p, n) for i, p in enumerate(items)}


def test_greedy_equals_plain_decoding_with_hits_and_misses(model: Any) -> None:
    items = prompts(5)
    limits = [12, 5, 16, 9, 14]
    refs = references(model, items, 20)  # longer than generated: drafts run past the end
    truths = {rid: [*items[int(rid)], *out] for rid, out in refs.items()}
    oracle = OracleDrafter(truths, seed=1)
    worker = DecodeWorker(model, oracle, max_batch=3)  # 5 requests: they join as others leave
    generations = worker.run(GenerationRequest(str(i), p, limits[i]) for i, p in enumerate(items))
    for g in generations:
        assert g.output_ids == refs[g.request_id][: limits[int(g.request_id)]], g.request_id
        assert g.finish_reason == "length"
        assert (
            oracle.finished[g.request_id]
            == truths[g.request_id][: len(items[int(g.request_id)]) + len(g.output_ids)]
        )
    assert {"hit", "partial", "miss", "none"} <= set(oracle.kinds)
    stats = worker.stats
    assert stats.accepted_tokens > 0 and stats.output_tokens == sum(limits)
    assert stats.steps < sum(limits)  # speculation saved steps
    assert worker.idle and len(worker.kv.lens) == 0


def test_forward_passes_use_the_installed_transformers_cache_keyword(model: Any) -> None:
    """transformers 5.24 renamed forward's ``past_key_values`` to ``cache``; the old name
    warns (FutureWarning) and goes in 5.40. Prefill and tree steps pass the name the
    installed release takes, so a decode run warns nothing."""
    items = prompts(2, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        refs = references(model, items, 6)
        truths = {rid: [*items[int(rid)], *out] for rid, out in refs.items()}
        worker = DecodeWorker(model, OracleDrafter(truths, seed=3), max_batch=2)
        generations = worker.run(GenerationRequest(str(i), p, 6) for i, p in enumerate(items))
    assert [g.output_ids for g in generations] == [refs[str(i)] for i in range(2)]


def test_trees_that_always_miss_change_nothing(model: Any) -> None:
    items = prompts(3, seed=5)
    refs = references(model, items, 8)
    truths = {rid: [*items[int(rid)], *out] for rid, out in refs.items()}
    worker = DecodeWorker(model, OracleDrafter(truths, kinds=["miss"]), max_batch=4)
    generations = worker.run(GenerationRequest(str(i), p, 8) for i, p in enumerate(items))
    assert [g.output_ids for g in generations] == [refs[str(i)] for i in range(3)]
    assert worker.stats.accepted_tokens == 0 and worker.stats.steps == 8


def test_eos_ends_a_request_and_the_others_go_on() -> None:
    model = model64("llama")
    items = prompts(3, seed=2)
    refs = references(model, items, 12)
    eos = refs["1"][4]  # request 1 ends at its fifth token (or earlier, if it repeats)
    truths = {rid: [*items[int(rid)], *out] for rid, out in refs.items()}
    worker = DecodeWorker(model, OracleDrafter(truths, kinds=["hit"]), eos_token_ids=[eos])
    generations = worker.run(GenerationRequest(str(i), p, 12) for i, p in enumerate(items))
    for g in generations:
        ref = refs[g.request_id]
        end = ref.index(eos) + 1 if eos in ref else len(ref)
        assert g.output_ids == ref[:end]
        assert g.finish_reason == ("eos" if eos in ref else "length")
    assert generations[1].finish_reason == "eos"


def test_ragged_batches_join_and_leave_between_steps() -> None:
    model = model64("qwen2")
    items = prompts(6, seed=3)
    limits = [3, 11, 6, 1, 9, 4]
    refs = references(model, items, 11)
    truths = {rid: [*items[int(rid)], *out] for rid, out in refs.items()}
    worker = DecodeWorker(model, OracleDrafter(truths, seed=4), max_batch=3)
    arrivals = {0: [0, 1], 1: [2], 3: [3, 4], 6: [5]}  # step -> requests submitted before it
    done: dict[str, list[int]] = {}
    sizes = []
    for step in range(40):
        for i in arrivals.get(step, []):
            worker.submit(GenerationRequest(str(i), items[i], limits[i]))
        done.update((g.request_id, g.output_ids) for g in worker.step())
        sizes.append(len(worker.kv.lens))
        # only the accepted paths' KV is kept: no row longer than the longest context
        assert worker.kv.physical_len == max(worker.kv.lens, default=0)
        if step > max(arrivals) and worker.idle:
            break
    assert sorted(done) == [str(i) for i in range(len(items))]
    for rid, out in done.items():
        assert out == refs[rid][: limits[int(rid)]], rid
    assert len(set(sizes)) >= 3  # the batch grew and shrank


def test_one_token_prompts_join_a_new_and_an_emptied_batch() -> None:
    model = model64("llama")
    items = prompts(9, seed=5)  # items[0] and items[8] have one token: nothing to prefill
    refs = references(model, items, 6)
    truths = {rid: [*items[int(rid)], *out] for rid, out in refs.items()}
    worker = DecodeWorker(model, OracleDrafter(truths, seed=1), max_batch=2)
    for order in ([0, 8], [0, 3, 8], [8]):  # the last two start after the batch emptied
        for g in worker.run(GenerationRequest(str(i), items[i], 6) for i in order):
            assert g.output_ids == refs[g.request_id], (order, g.request_id)
        assert len(worker.kv.lens) == 0 and worker.kv.physical_len == 0


@pytest.mark.parametrize(
    "bad",
    [
        ([5, 10**6], [-1, 0]),  # an id past the vocabulary
        ([5, -3], [-1, 0]),  # a negative id
        ([5, 6], [-1, 1]),  # a node that is its own parent
        ([5, 6], [-1, 7]),  # a parent after the node
    ],
    ids=["past-vocab", "negative", "self-parent", "forward-parent"],
)
def test_a_drafter_with_malformed_trees_cannot_break_decoding(
    bad: tuple[list[int], list[int]],
) -> None:
    model = model64("llama")
    items = prompts(2, seed=6)
    refs = references(model, items, 6)

    class Hostile:
        def add_request(self, request_id: str, prompt_ids: Any) -> None: ...
        def finish(self, request_id: str, *, tail: Any = ()) -> bool:
            return True

        def step(self, commits: Any) -> StepResult:
            rids = list(commits)  # the first request gets the malformed tree, the other none
            tree = Tree.of(*bad, [0.0, 0.0])
            return StepResult(1, Outcome.OK, tuple(rids), {rids[0]: tree}, {})

    worker = DecodeWorker(model, Hostile(), max_batch=2)
    generations = worker.run(GenerationRequest(str(i), p, 6) for i, p in enumerate(items))
    assert [g.output_ids for g in generations] == [refs["0"], refs["1"]]
    assert worker.stats.rejected_trees == worker.stats.steps


@pytest.mark.system
def test_through_a_real_drafter_killed_mid_generation(tmp_path: Path) -> None:
    """A real `drafter serve` subprocess drafts (the input trie learns the model's
    repetitions), then is killed with SIGKILL mid-generation: every step after that
    falls back to no drafts, and the output is still plain greedy decoding."""
    model = model64("llama")
    items = [[5, 17, 300, 42, 7], [11, 12, 13], [400, 401, 402, 403, 404, 405]]
    n = 40
    refs = references(model, items, n)
    drafter = DrafterProcess(tmp_path / "drafter", *NO_ADMIN)
    client = DrafterClient(drafter.target, deadline_ms=2000.0, budget=BudgetRule.fixed(8))
    try:
        client.wait_ready()
        worker = DecodeWorker(model, client, max_batch=3)
        for i, p in enumerate(items):
            worker.submit(GenerationRequest(str(i), p, n))
        done: dict[str, list[int]] = {}
        while worker.stats.output_tokens < 45:
            done.update((g.request_id, g.output_ids) for g in worker.step())
        accepted_before_kill = worker.stats.accepted_tokens
        assert drafter.proc is not None
        drafter.proc.send_signal(signal.SIGKILL)
        drafter.proc.wait(10)
        drafter.proc = None
        while not worker.idle:
            done.update((g.request_id, g.output_ids) for g in worker.step())
    finally:
        client.close(timeout_s=0.5)
        drafter.stop()
    assert done == refs
    assert accepted_before_kill > 0  # it did draft and the drafts were accepted
    fallbacks = worker.stats.fallbacks
    assert fallbacks.get("unavailable", 0) + fallbacks.get("breaker_open", 0) > 0


def chi_square_p_value(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularized upper gamma Q(dof/2, x/2)."""
    q = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                torch.tensor(statistic / 2, dtype=torch.float64))  # fmt: skip
    return float(q)


def filtered_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The sampling distribution, written independently of verification.py: softmax of
    logits / T, top-k, then the smallest top set whose renormalized mass reaches top_p."""
    probs = (logits / p.temperature).softmax(-1)
    order = probs.argsort(descending=True).tolist()
    keep = order[: p.top_k] if p.top_k else order
    mass = probs[keep].sum()
    kept, acc = [], 0.0
    for token in keep:
        if acc >= p.top_p * mass:
            break
        kept.append(token)
        acc += float(probs[token])
    out = torch.zeros_like(probs)
    out[kept] = probs[kept] / probs[kept].sum()
    return out


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, 5, 0.9)],
                         ids=["T1", "T0.7-k5-p0.9"])  # fmt: skip
@pytest.mark.system
def test_sampling_matches_the_target_distribution(params: SamplingParams) -> None:
    """Chi-square goodness of fit of the first two sampled tokens, joint (64 cells on an
    8-token vocabulary, cells expected below 5 pooled), against the exact distribution
    of plain sampling computed from the model, at significance 0.001.

    Each of 3000 requests has its own seed (the outcome is deterministic). The trees
    cover half of the first tokens, each with children, so verification both descends
    and rejects. Power, checked when the test was written: a lossy verifier that takes
    the first drafted token instead of a missing sample in one request of three fails
    with p = 3e-10 (T1) and 4e-5 (T0.7); with other model seeds the lossless worker
    gives p = 0.91, 0.57, 0.09, 0.80."""
    vocab, n = 8, 3000
    model = model64("llama", vocab_size=vocab, init_std=0.2, seed=11)
    prompt = [1, 2, 3]
    tree = Tree.of([0, 3, 5, 6, 0, 1, 2, 4, 7, 3], [-1, -1, -1, -1, 0, 0, 1, 1, 2, 3], [0.0] * 10)

    class FixedTrees:
        def add_request(self, request_id: str, prompt_ids: Any) -> None: ...
        def finish(self, request_id: str, *, tail: Any = ()) -> bool:
            return True

        def step(self, commits: Any) -> StepResult:
            return StepResult(1, Outcome.OK, tuple(commits), dict.fromkeys(commits, tree), {})

    worker = DecodeWorker(model, FixedTrees(), max_batch=1000)
    seeded = [SamplingParams(params.temperature, params.top_k, params.top_p, seed=i)
              for i in range(n)]  # fmt: skip
    generations = worker.run(GenerationRequest(f"r{i}", prompt, 2, seeded[i]) for i in range(n))
    counts = Counter(tuple(g.output_ids) for g in generations)
    with torch.inference_mode():
        first = filtered_probs(model(torch.tensor([prompt])).logits[0, -1], params)
        seconds = model(torch.tensor([[*prompt, t] for t in range(vocab)])).logits[:, -1]
    expected = {(a, b): n * float(first[a]) * float(filtered_probs(seconds[a], params)[b])
                for a in range(vocab) for b in range(vocab)}  # fmt: skip
    assert set(counts) <= {c for c, e in expected.items() if e > 0}, "sampled an impossible pair"
    # Cells with expected counts below 5 are pooled (the chi-square approximation needs it).
    big = [c for c, e in expected.items() if e >= 5]
    pooled_expected = n - sum(expected[c] for c in big)
    pooled_observed = n - sum(counts[c] for c in big)
    statistic = sum((counts[c] - expected[c]) ** 2 / expected[c] for c in big)
    cells = len(big)
    if pooled_expected >= 1e-9:
        statistic += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        cells += 1
    p_value = chi_square_p_value(statistic, cells - 1)
    assert p_value > 0.001, f"chi2 {statistic:.1f} over {cells} cells: p = {p_value:.2e}"
    assert worker.stats.accepted_tokens > n / 4  # drafts were taken, and losslessly
    assert not math.isnan(statistic)


def test_sampling_is_reproducible_per_seed() -> None:
    model = model64("llama")
    items = prompts(3, seed=9)
    requests = [GenerationRequest(str(i), p, 10, SamplingParams(1.0, seed=100 + i))
                for i, p in enumerate(items)]  # fmt: skip
    first = [g.output_ids for g in DecodeWorker(model, max_batch=3).run(requests)]
    again = [g.output_ids for g in DecodeWorker(model, max_batch=1).run(requests)]
    assert first == again  # a request's samples do not depend on its batch


def test_worker_validates_requests() -> None:
    worker = DecodeWorker(model64("llama"))
    with pytest.raises(ValueError, match="token id 1000"):
        worker.submit(GenerationRequest("a", [1, 1000], 4))
    with pytest.raises(ValueError, match="empty"):
        worker.submit(GenerationRequest("a", [], 4))
    with pytest.raises(ValueError, match="max_new_tokens"):
        worker.submit(GenerationRequest("a", [1], 0))
    worker.submit(GenerationRequest("a", [1], 1))
    with pytest.raises(ValueError, match="'a'"):
        worker.submit(GenerationRequest("a", [2], 1))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(1.0, top_p=0.0)


def test_drafter_worker_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"id": "x", "prompt_ids": [1, 2, 3], "output_ids": []}\n[4, 5]\n')
    out = tmp_path / "gen.jsonl"
    code = main(["--tiny", "qwen2", "--vocab-size", "64", "--hidden-size", "32", "--prompts",
                 str(data), "--max-new-tokens", "5", "--output", str(out)])  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 2 and report["output_tokens"] == 10
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in lines] == ["x", "prompts.jsonl:2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 99]\n")
    assert main(["--tiny", "llama", "--vocab-size", "64", "--prompts", str(bad)]) == 2
    assert "token 99" in capsys.readouterr().err
    rounds = ["--tiny", "qwen2", "--vocab-size", "64", "--hidden-size", "32", "--prompts",
              str(data), "--max-new-tokens", "5", "--output", str(out), "--rounds"]  # fmt: skip
    assert main([*rounds, "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 4 and report["output_tokens"] == 20
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in again] == ["x", "prompts.jsonl:2", "x#1", "prompts.jsonl:2#1"]
    assert [g["output_ids"] for g in again] == [g["output_ids"] for g in lines] * 2
    assert main([*rounds, "-1"]) == 2
    assert "--rounds must be >= 0, got -1" in capsys.readouterr().err


def test_drafter_worker_help_and_argument_errors_import_no_torch() -> None:
    """`drafter-worker --help` and a refused argument answer before torch is imported
    (importing it takes seconds; a loaded machine's, minutes)."""
    script = (
        "import sys\n"
        "from verifier_client.reference_worker.worker_cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as stop:\n"
        "    assert stop.code == 0, stop.code\n"
        "assert main(['--tiny', 'llama', '--prompts', 'p.jsonl', '--rounds', '-1']) == 2\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, check=True)  # fmt: skip
    assert "usage: drafter-worker" in proc.stdout and "--tiny" in proc.stdout
    assert "--rounds must be >= 0, got -1" in proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"
