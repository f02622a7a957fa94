"""Helpers for the decode-worker tests: tiny models, plain decoding references, and a
draft source that proposes trees from a known continuation (hits, partial hits, misses).

The oracle is a test input, not a stand-in for the worker: the worker under test is
the real one, with its real packing, forward pass, verification and KV handling.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from verifier_client.reference_worker.decode_loop import cache_keyword
from verifier_client.reference_worker.target_models import tiny_model
from verifier_client.results import Outcome, StepResult, Tree

VOCAB = 1000  # the test drafter's vocabulary (service_support.VOCAB, client_servers.VOCAB_SIZE)
NO_ADMIN = ("--admin-port", "-1")  # `drafter serve` args: no REST admin (no fixed port to clash)


def model64(architecture: str, *, vocab_size: int = VOCAB, init_std: float = 0.1,
            attn_implementation: str = "sdpa", seed: int = 3) -> PreTrainedModel:  # fmt: skip
    """A 2-layer, hidden-32 random model in float64 (see the test modules for why)."""
    return tiny_model(architecture, vocab_size=vocab_size, hidden_size=32, num_layers=2,
                      init_std=init_std, seed=seed, dtype=torch.float64,
                      attn_implementation=attn_implementation)  # fmt: skip


@torch.inference_mode()
def plain_greedy(model: PreTrainedModel, prompt: Sequence[int], n: int) -> list[int]:
    """Plain greedy decoding, one token per forward pass, no speculation."""
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(prompt)])
    out: list[int] = []
    for _ in range(n):
        logits = model(input_ids=ids, use_cache=True, **{cache_keyword(model): cache}).logits
        token = int(logits[0, -1].argmax())
        out.append(token)
        ids = torch.tensor([[token]])
    return out


def prompts(count: int, *, seed: int = 0, vocab_size: int = VOCAB) -> list[list[int]]:
    """Prompts of varied lengths (1 token included: nothing to prefill)."""
    rng = random.Random(seed)
    lengths = [1, 2, 7, 13, 4, 9, 3, 16]
    return [[rng.randrange(vocab_size) for _ in range(lengths[i % len(lengths)])]
            for i in range(count)]  # fmt: skip


class OracleDrafter:
    """Trees around the true continuation: per step and request one of

    * ``hit``: the true next tokens as a chain (depth 1-4), each level with a
      distractor sibling and a distractor under the previous distractor;
    * ``partial``: the same with one chain token wrong (acceptance stops there);
    * ``miss``: every chain token wrong;
    * ``none``: no tree (as on a drafter timeout).
    """

    KINDS = ("hit", "hit", "partial", "miss", "none")

    def __init__(self, truths: Mapping[str, Sequence[int]], *, vocab_size: int = VOCAB,
                 seed: int = 0, kinds: Sequence[str] = KINDS) -> None:  # fmt: skip
        self.truths = {rid: list(t) for rid, t in truths.items()}  # prompt + true output
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.kinds_allowed = tuple(kinds)
        self.contexts: dict[str, list[int]] = {}
        self.kinds: Counter[str] = Counter()
        self.finished: dict[str, list[int]] = {}
        self.steps = 0

    def add_request(self, request_id: str, prompt_ids: Iterable[int]) -> None:
        self.contexts[request_id] = list(prompt_ids)

    def finish(self, request_id: str, *, tail: Iterable[int] = ()) -> bool:
        self.finished[request_id] = [*self.contexts.pop(request_id), *tail]
        return True

    def step(self, commits: Mapping[str, Iterable[int]]) -> StepResult:
        self.steps += 1
        drafts = {}
        for rid, tokens in commits.items():
            context = self.contexts[rid]
            context.extend(tokens)
            truth = self.truths[rid][len(context) :]  # the true tokens after the root
            kind = self.rng.choice(self.kinds_allowed)
            self.kinds[kind] += 1
            if kind != "none" and truth:
                drafts[rid] = self.tree(truth, kind)
        return StepResult(self.steps, Outcome.OK, tuple(commits), drafts, {})

    def wrong(self, token: int) -> int:
        return (token + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size

    def tree(self, truth: Sequence[int], kind: str) -> Tree:
        chain = list(truth[: self.rng.randint(1, 4)])
        if kind == "partial":
            at = self.rng.randrange(len(chain))
            chain[at] = self.wrong(chain[at])
        elif kind == "miss":
            chain = [self.wrong(t) for t in chain]
        tokens: list[int] = []
        parents: list[int] = []
        chain_at = distractor_at = -1  # the previous level's chain and distractor nodes
        for level, token in enumerate(chain):  # breadth-first: one level at a time
            sibling = self.wrong(token)
            tokens += [token, sibling]
            parents += [chain_at, chain_at]
            new_chain, new_distractor = len(tokens) - 2, len(tokens) - 1
            if level:
                tokens.append(self.rng.randrange(self.vocab_size))
                parents.append(distractor_at)
            chain_at, distractor_at = new_chain, new_distractor
        return Tree.of(tokens, parents, [0.0] * len(tokens))
