"""Verification: greedy against the reference walk, sampling against exact distributions.

Statistical tests use Pearson's chi-square at significance level ALPHA = 0.001
with fixed seeds, so every run draws the same samples and gives the same verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tree_reference import batches, random_tree, ref_rows, ref_walk

from verifier_client.results import Tree
from verifier_client.verification.tree_packing import PackedTrees, pack_trees
from verifier_client.verification.tree_verification import (
    VerifyResult,
    accept,
    sample_targets,
)

ALPHA = 0.001
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ---------------------------------------------------------------- greedy walk


def assert_result(result: VerifyResult, packed: PackedTrees, targets: torch.Tensor,
                  trees: list[Tree | None], roots: list[int], lens: list[int]) -> None:
    rows = ref_rows(trees, roots, lens)
    width = packed.width
    per_position = [0] * (width - 1)
    for b, row in enumerate(rows):
        tokens, nodes = ref_walk(row, targets[b].tolist())
        n = len(nodes)
        assert result.tokens(b) == tokens
        assert result.accepted_tokens[b].tolist() == tokens + [-1] * (width - n)
        assert result.accepted_nodes[b].tolist() == nodes + [-1] * (width - n)
        assert int(result.accept_lengths[b]) == n - 1
        for d in range(n - 1):
            per_position[d] += 1
    assert result.accepted_per_position.tolist() == per_position


@given(batches(vocab=3), st.data())
def test_accept_matches_the_reference_walk(
    batch: tuple[list[Tree | None], list[int], list[int]], data: st.DataObject
) -> None:
    """Random trees (equal siblings included) and random targets over a 3-token vocabulary."""
    trees, roots, lens = batch
    packed = pack_trees(trees, roots, lens)
    flat = data.draw(st.lists(st.integers(0, 2), min_size=packed.tokens.numel(),
                              max_size=packed.tokens.numel()))  # fmt: skip
    targets = torch.tensor(flat, dtype=torch.int64).reshape(packed.tokens.shape)
    assert_result(accept(packed, targets), packed, targets, trees, roots, lens)


def test_equal_siblings_enter_the_first_only() -> None:
    """Column 2 repeats column 1's token: only column 1's subtree can be accepted, whatever
    the targets below column 2 say (choosing by them would bias sampling)."""
    tree = Tree.of([7, 7, 8, 9], [-1, -1, 1, 0], [0.1, 0.9, 0.9, 0.1])
    packed = pack_trees([tree, tree], [5, 5], [0, 0])
    assert packed.duplicate.tolist() == [[False, False, True, False, False]] * 2
    targets = torch.tensor([[7, 9, 8, 0, 3], [7, 1, 8, 0, 3]])
    result = accept(packed, targets)
    assert result.tokens(0) == [7, 9, 3] and result.accepted_nodes[0].tolist()[:3] == [0, 1, 4]
    assert result.tokens(1) == [7, 1] and result.accepted_nodes[1].tolist()[:2] == [0, 1]


@given(batches(vocab=3), st.integers(0, 2**32 - 1))
def test_greedy_targets_are_the_argmax(
    batch: tuple[list[Tree | None], list[int], list[int]], seed: int
) -> None:
    trees, roots, lens = batch
    packed = pack_trees(trees, roots, lens)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((*packed.tokens.shape, 3), generator=gen)
    result = accept(packed, sample_targets(logits))
    assert_result(result, packed, logits.argmax(2), trees, roots, lens)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_speculation_equals_plain_greedy_decoding(device: str) -> None:
    """A bigram "model": trees from its own greedy continuation (corrupted, plus distractor
    branches) and random trees; tree and best-chain verification both reproduce plain
    greedy decoding token for token, with real acceptance."""
    vocab, batch, length = 50, 16, 40
    gen = torch.Generator().manual_seed(3)
    table = torch.randn((vocab, vocab), generator=gen, dtype=torch.float64)
    greedy_next = table.argmax(1).tolist()
    rng = np.random.default_rng(3)
    starts = rng.integers(0, vocab, batch).tolist()
    plain = []
    for s in starts:
        seq = [s]
        while len(seq) < length + 1:
            seq.append(greedy_next[seq[-1]])
        plain.append(seq[1:])

    for chains in (False, True):
        out = [[s] for s in starts]
        accepted = steps = 0
        while min(len(o) for o in out) < length + 1:
            trees = [_guess_tree(rng, greedy_next, o[-1], vocab) for o in out]
            if chains:
                paths = [tree.best_chain(8) for tree in trees]
                trees = [Tree.of(p, range(-1, len(p) - 1), [0.0] * len(p)) for p in paths]
            lens = [len(o) - 1 for o in out]
            roots = [o[-1] for o in out]
            packed = pack_trees(trees, roots, lens, device=device)
            logits = table.to(device)[packed.tokens]  # next-token logits of every node
            result = accept(packed, sample_targets(logits))
            for b, o in enumerate(out):
                o.extend(result.tokens(b))
            accepted += int(result.accept_lengths.sum())
            steps += 1
        assert [o[1 : length + 1] for o in out] == plain
        assert accepted / (steps * batch) > 1.0, "the trees must hit, or nothing is tested"


def _guess_tree(rng: np.random.Generator, greedy_next: list[int], root: int, vocab: int) -> Tree:
    """The true greedy continuation with a random token corrupted, plus distractors."""
    if rng.random() < 0.15:
        return Tree.of([], [], [])
    depth = int(rng.integers(1, 7))
    tokens, parents, at = [], [], root
    for i in range(depth):
        at = greedy_next[at] if rng.random() < 0.85 else int(rng.integers(0, vocab))
        tokens.append(at)
        parents.append(i - 1)
    for _ in range(int(rng.integers(0, 6))):  # distractor branches anywhere
        parents.append(int(rng.integers(-1, len(tokens))))
        tokens.append(int(rng.integers(0, vocab)))
    order = np.argsort(np.array(parents), kind="stable")  # breadth-first-ish reorder
    remap = {int(old): new for new, old in enumerate(order)}
    remap[-1] = -1
    new_parents = [remap[parents[o]] for o in order]
    if any(p >= i for i, p in enumerate(new_parents)):  # keep the original order then
        return Tree.of(tokens, parents, rng.random(len(tokens)).tolist())
    return Tree.of([tokens[o] for o in order], new_parents, rng.random(len(tokens)).tolist())


# ------------------------------------------------------------- the sampler


def ref_distribution(logits: list[float], temperature: float, top_k: int,
                     top_p: float) -> list[float]:  # fmt: skip
    """The target distribution the sampler must draw from, computed by hand."""
    vocab = len(logits)
    if temperature == 0:
        best = max(range(vocab), key=lambda i: (logits[i], -i))
        return [1.0 if i == best else 0.0 for i in range(vocab)]
    scaled = [x / temperature for x in logits]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    order = sorted(range(vocab), key=lambda i: -weights[i])
    if 0 < top_k < vocab:
        order = order[:top_k]
    mass = sum(weights[i] for i in order)
    kept, before = [], 0.0
    for i in order:  # keep while the renormalized mass before the token is below top_p
        if before / mass >= top_p:
            break
        kept.append(i)
        before += weights[i]
    total = sum(weights[i] for i in kept)
    return [weights[i] / total if i in kept else 0.0 for i in range(vocab)]


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's test of counts against probs; cells expecting < 5 are pooled.

    A count in a zero-probability cell is a certain failure (asserted, not tested).
    """
    assert counts[probs == 0].sum() == 0, "drew a token the distribution excludes"
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    small = ~big & (probs > 0)
    obs = list(counts[big]) + ([counts[small].sum()] if small.any() else [])
    exp = list(expected[big]) + ([expected[small].sum()] if small.any() else [])
    if len(obs) < 2:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    df = torch.tensor((len(obs) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


SAMPLER_CASES = [  # (temperature, top_k, top_p): every path of the sampler
    (1.0, 0, 1.0),  # no filter
    (0.8, 3, 1.0),  # top-k only (partial sort)
    (1.2, 0, 0.7),  # top-p only (full sort)
    (0.9, 5, 0.6),  # both
    (1.0, 1, 1.0),  # top-k 1: the argmax
    (1.0, 0, 1e-6),  # a tiny top-p keeps the most likely token
    (0.5, 20, 1.0),  # top-k past the vocabulary: no filter
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab", [12, 7])  # cumulative sums over blocks of 4 and of 1 token
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SAMPLER_CASES)
def test_sampler_draws_the_filtered_target_distribution(
    temperature: float, top_k: int, top_p: float, vocab: int, device: str
) -> None:
    draws = 40_000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(11)) * 1.5
    gen = torch.Generator(device=device).manual_seed(12)
    rows = logits.to(device).expand(4, draws // 4, vocab)  # B = 4 requests, one distribution
    samples = sample_targets(rows, temperature=temperature, top_k=top_k, top_p=top_p,
                             generator=gen)  # fmt: skip
    assert samples.shape == (4, draws // 4) and samples.dtype == torch.int64
    counts = np.bincount(samples.reshape(-1).cpu().numpy(), minlength=vocab)
    probs = np.array(ref_distribution(logits.tolist(), temperature, top_k, top_p))
    assert chi_square_pvalue(counts, probs) > ALPHA


def test_sampler_per_request_parameters_and_greedy_rows() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn((4, 300, 8), generator=gen)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.7])
    top_k = torch.tensor([0, 2, 5, 1])
    samples = sample_targets(logits, temperature=temperature, top_k=top_k, top_p=0.9,
                             generator=gen)  # fmt: skip
    argmax = logits.argmax(2)
    assert torch.equal(samples[0], argmax[0]) and torch.equal(samples[2], argmax[2])
    assert torch.equal(samples[3], argmax[3])  # top-k 1
    top2 = logits[1].topk(2, dim=1).indices
    assert bool((samples[1][:, None] == top2).any(1).all())
    assert not torch.equal(samples[1], argmax[1])


def test_sampler_is_reproducible_and_never_draws_minus_infinity() -> None:
    logits = torch.randn((2, 500, 24), generator=torch.Generator().manual_seed(1))
    logits[:, :, ::2] = float("-inf")
    draw = [
        sample_targets(
            logits, temperature=1.5, top_p=0.95, generator=torch.Generator().manual_seed(9)
        )
        for _ in range(2)
    ]
    assert torch.equal(draw[0], draw[1])
    assert bool((draw[0] % 2 == 1).all())
    plain = sample_targets(logits, temperature=1.5, generator=torch.Generator().manual_seed(9))
    assert bool((plain % 2 == 1).all())


# --------------------------------------------------- lossless tree sampling

BIGRAM_VOCAB = 6
GENERATED = 3  # tokens per simulated generation: 6**3 outcomes
CONFIGS = [  # (temperature, top_k, top_p) of the simulated requests
    (1.0, 0, 1.0),
    (0.7, 3, 1.0),
    (1.3, 0, 0.8),
    (0.9, 4, 0.75),
]
RUNS_PER_CONFIG = 5000

Verifier = Callable[[PackedTrees, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                     torch.Generator], VerifyResult]  # fmt: skip


def lossless_verify(packed: PackedTrees, logits: torch.Tensor, temperature: torch.Tensor,
                    top_k: torch.Tensor, top_p: torch.Tensor,
                    gen: torch.Generator) -> VerifyResult:  # fmt: skip
    return accept(packed, sample_targets(logits, temperature=temperature, top_k=top_k,
                                         top_p=top_p, generator=gen))  # fmt: skip


def top2_biased_verify(packed: PackedTrees, logits: torch.Tensor, temperature: torch.Tensor,
                       top_k: torch.Tensor, top_p: torch.Tensor,
                       gen: torch.Generator) -> VerifyResult:  # fmt: skip
    """A wrong verifier: enters a child whenever its token is among the target's top 2."""
    targets = sample_targets(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                             generator=gen)  # fmt: skip
    top2 = logits.topk(2, dim=2).indices
    rows = torch.arange(packed.tokens.shape[0])
    for c in range(packed.width - 1, 0, -1):  # lowest column last: it wins
        parent = packed.parents[:, c].clamp(min=0)
        token = packed.tokens[:, c]
        liked = (top2[rows, parent] == token[:, None]).any(1) & packed.valid[:, c]
        targets[rows[liked], parent[liked]] = token[liked]
    return accept(packed, targets)


def simulate(verify: Verifier, seed: int, device: str = "cpu") -> tuple[np.ndarray, np.ndarray,
                                                                        float]:  # fmt: skip
    """Speculative sampling of GENERATED tokens after token 0, RUNS_PER_CONFIG per config,
    packed, verified and sampled on ``device``.

    Returns the outcome index of every run (base-V number of its tokens), each
    run's config and the mean accepted drafts per verify step.
    """
    vocab = BIGRAM_VOCAB
    table = torch.randn((vocab, vocab), generator=torch.Generator().manual_seed(21)) * 1.2
    table = table.to(device)
    config = np.repeat(np.arange(len(CONFIGS)), RUNS_PER_CONFIG)
    runs = len(config)
    temperature = torch.tensor([CONFIGS[i][0] for i in config], device=device)
    top_k = torch.tensor([CONFIGS[i][1] for i in config], device=device)
    top_p = torch.tensor([CONFIGS[i][2] for i in config], device=device)
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    out: list[list[int]] = [[] for _ in range(runs)]
    accepted = steps = 0
    while min(len(o) for o in out) < GENERATED:
        trees = _random_trees(rng, runs, vocab)
        roots = [o[-1] if o else 0 for o in out]
        packed = pack_trees(trees, roots, [len(o) for o in out], device=device)
        logits = table[packed.tokens]  # a bigram model: the node's token decides
        result = verify(packed, logits, temperature, top_k, top_p, gen)
        committed = result.accepted_tokens.tolist()
        for o, row, n in zip(out, committed, result.accept_lengths.tolist(), strict=True):
            o.extend(row[: n + 1])
        accepted += int(result.accept_lengths.sum())
        steps += runs
    outcome = np.array([sum(t * vocab**i for i, t in enumerate(o[:GENERATED])) for o in out])
    return outcome, config, accepted / steps


def _random_trees(rng: np.random.Generator, runs: int, vocab: int) -> list[Tree | None]:
    """Random trees of 0-14 nodes (parents before children, equal siblings possible).

    Parents lean to early nodes (u**2), so trees are wide near the root and hit often.
    """
    sizes = rng.integers(0, 15, runs)
    parents = (np.floor(rng.random((runs, 14)) ** 2 * (np.arange(14) + 1)) - 1).astype(int)
    tokens = rng.integers(0, vocab, (runs, 14))
    return [
        None if n == 0 and r % 2 else
        Tree.of(tokens[r, :n].tolist(), parents[r, :n].tolist(), [0.5] * int(n))
        for r, n in enumerate(sizes)
    ]  # fmt: skip


def exact_outcome_probs(temperature: float, top_k: int, top_p: float) -> np.ndarray:
    vocab = BIGRAM_VOCAB
    table = torch.randn((vocab, vocab), generator=torch.Generator().manual_seed(21)) * 1.2
    step = [ref_distribution(table[t].tolist(), temperature, top_k, top_p) for t in range(vocab)]
    probs = np.zeros(vocab**GENERATED)
    for index in range(vocab**GENERATED):
        seq = [(index // vocab**i) % vocab for i in range(GENERATED)]
        p, prev = 1.0, 0
        for t in seq:
            p *= step[prev][t]
            prev = t
        probs[index] = p
    return probs


@pytest.mark.parametrize("device", DEVICES)
def test_tree_sampling_reproduces_the_target_distribution(device: str) -> None:
    """Generations sampled through random trees (hits, misses, equal siblings, no tree)
    are distributed exactly as plain sampling: chi-square of the 216 outcomes of each
    temperature/top-k/top-p config, at ALPHA = 0.001; zero-probability outcomes never occur.
    On every device present (CUDA too: its own sampling kernels and generator)."""
    outcome, config, mean_accepted = simulate(lossless_verify, seed=31, device=device)
    assert mean_accepted > 0.4, "the trees must hit, or nothing is tested"
    for i, params in enumerate(CONFIGS):
        counts = np.bincount(outcome[config == i], minlength=BIGRAM_VOCAB**GENERATED)
        p = chi_square_pvalue(counts, exact_outcome_probs(*params))
        assert p > ALPHA, (params, p)


@pytest.mark.system
def test_the_sampling_test_detects_a_biased_verifier() -> None:
    """Negative control: the same simulation with a verifier that enters any child in the
    target's top 2 fails the same chi-square test in every config."""
    outcome, config, _ = simulate(top2_biased_verify, seed=31)
    for i, params in enumerate(CONFIGS):
        counts = np.bincount(outcome[config == i], minlength=BIGRAM_VOCAB**GENERATED)
        probs = exact_outcome_probs(*params)
        try:
            p = chi_square_pvalue(counts, probs)
        except AssertionError:  # an excluded outcome occurred: detected outright
            continue
        assert p < ALPHA, (params, p)


# ------------------------------------------------------------- bad input


def test_bad_verification_input_is_named() -> None:
    packed = pack_trees([Tree.of([1, 2], [-1, 0], [0.5, 0.5])], [0], [0])
    with pytest.raises(ValueError, match=r"target_tokens has shape \(1, 2\), the packed"):
        accept(packed, torch.zeros((1, 2), dtype=torch.int64))
    with pytest.raises(TypeError, match=r"target_tokens must hold integers, got torch\.float32"):
        accept(packed, torch.zeros((1, 3)))
    with pytest.raises(TypeError, match="packed must be PackedTrees, got dict"):
        accept({}, torch.zeros((1, 3), dtype=torch.int64))  # type: ignore[arg-type]
    logits = torch.zeros((1, 3, 5))
    with pytest.raises(ValueError, match=r"temperature must be finite and >= 0, got -0\.5"):
        sample_targets(logits, temperature=-0.5)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 0\.0"):
        sample_targets(logits, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 1\.5"):
        sample_targets(logits, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        sample_targets(logits, temperature=1.0, top_k=torch.tensor([-1]))
    with pytest.raises(TypeError, match=r"top_k must be an int, got 2\.5"):
        sample_targets(logits, temperature=1.0, top_k=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"temperature must be a scalar or \[1\], got \(2,\)"):
        sample_targets(logits, temperature=torch.tensor([1.0, 1.0]))
    with pytest.raises(TypeError, match=r"logits must be floating point, got torch\.int64"):
        sample_targets(torch.zeros((1, 3, 5), dtype=torch.int64))
    with pytest.raises(ValueError, match=r"logits must be \[B, T, V\] with V > 0, got \(3, 5\)"):
        sample_targets(torch.zeros((3, 5)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gives_the_cpu_answers() -> None:
    rng = np.random.default_rng(5)
    trees: list[Tree | None] = [random_tree(rng, 12, 4) for _ in range(20)]
    roots, lens = list(range(20)), [3 * i for i in range(20)]
    cpu = pack_trees(trees, roots, lens)
    gpu = pack_trees(trees, roots, lens, device="cuda")
    assert gpu.tokens.device.type == "cuda"
    for name in ("tokens", "parents", "depth", "positions", "attention_mask", "valid"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
    targets = torch.randint(0, 4, cpu.tokens.shape, generator=torch.Generator().manual_seed(1))
    want, got = accept(cpu, targets), accept(gpu, targets.cuda())
    assert torch.equal(got.accepted_tokens.cpu(), want.accepted_tokens)
    assert torch.equal(got.accepted_nodes.cpu(), want.accepted_nodes)
    logits = torch.randn((20, cpu.width, 7), generator=torch.Generator().manual_seed(2))
    assert torch.equal(accept(gpu, sample_targets(logits.cuda())).accepted_tokens.cpu(),
                       accept(cpu, sample_targets(logits)).accepted_tokens)  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(3)
    sampled = sample_targets(logits.cuda(), temperature=0.9, top_k=3, top_p=0.9, generator=gen)
    assert bool((sampled.cpu()[..., None] == logits.topk(3, dim=2).indices).any(2).all())
