"""Reference decode worker: a batched speculative decode loop over a ``transformers`` causal LM.

A request is prefilled without its last token, the root of its first tree. Each
:meth:`DecodeWorker.step` admits waiting requests, makes one drafter call for the batch
(with each request's tokens committed last step), packs the trees (positions = cache
length + depth), runs ONE forward pass over all of them (4D mask: the cache and each
node's ancestors), verifies (greedy, or sampling with the request's own generator), keeps
the accepted path's KV, commits accepted + bonus tokens and finishes requests at EOS or
``max_new_tokens``. Verification decides every token from the target's own logits, so
output never depends on the drafter's answers or timing.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from verifier_client.acceptance_metrics import WorkerMetrics
from verifier_client.budget import BudgetRule
from verifier_client.reference_worker.kv_cache import BatchKVCache
from verifier_client.results import Outcome, StepResult, Tree
from verifier_client.verification.tree_packing import PackedTrees, pack_trees
from verifier_client.verification.tree_verification import VerifyResult, accept, sample_targets

__all__ = [
    "DecodeWorker", "DraftSource", "Generation", "GenerationRequest", "SamplingParams",
    "StepTimings", "WorkerStats",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Greedy when ``temperature == 0``; otherwise sampling with the request's seed."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """``teacher_ids``: teacher forcing, for benchmarks of random-weight models. The target's
    token at each position is the recording's, not the logits' choice: the same work, and
    the output is the recording (cut at ``max_new_tokens``), as its replay would decode."""

    request_id: str
    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    teacher_ids: Sequence[int] | None = None


@dataclass(slots=True)
class Generation:
    """A finished request: its output (EOS included when it ended there)."""

    request_id: str
    output_ids: list[int]
    finish_reason: Literal["eos", "length"]
    steps: int  # decode steps it took part in


@dataclass(slots=True)
class StepTimings:
    """Seconds spent per phase, summed over steps (device-synchronized on CUDA)."""

    draft_s: float = 0.0  # drafter round trips
    pack_s: float = 0.0  # trees to tensors, attention mask
    forward_s: float = 0.0  # the model's tree forward pass
    verify_s: float = 0.0  # target choices (argmax / sampling) and acceptance
    kv_s: float = 0.0  # keeping the accepted path's KV
    prefill_s: float = 0.0


@dataclass(slots=True)
class WorkerStats:
    steps: int = 0
    output_tokens: int = 0  # committed tokens (accepted drafts + bonus tokens)
    drafts: int = 0  # request-steps that verified a non-empty tree
    draft_tokens: int = 0
    accepted_tokens: int = 0  # accepted draft tokens (bonus excluded)
    request_steps: int = 0  # one per request per step
    fallbacks: Counter[str] = field(default_factory=Counter)  # drafter steps without trees
    rejected_trees: int = 0  # trees holding ids outside the model's vocabulary (ignored)
    timings: StepTimings = field(default_factory=StepTimings)


class DraftSource(Protocol):
    """What the worker needs from a drafter (``DrafterClient`` is one)."""

    def add_request(self, request_id: str, prompt_ids: Iterable[int]) -> None: ...

    def step(self, commits: Mapping[str, Iterable[int]]) -> StepResult: ...

    def finish(self, request_id: str, *, tail: Iterable[int] = ()) -> bool: ...


@dataclass(slots=True)
class _Active:
    request: GenerationRequest
    context: list[int]  # prompt + output; the last token is the next tree's root
    output: list[int] = field(default_factory=list)
    unsent: list[int] = field(default_factory=list)  # committed, not yet told to the drafter
    steps: int = 0
    generator: torch.Generator | None = None
    teacher: Tensor | None = None  # the recorded output (teacher forcing), on the device


def cache_keyword(module: torch.nn.Module) -> str:
    """The name ``module.forward`` takes its KV cache under: ``cache`` since transformers
    5.24 (which warns on ``past_key_values``, to go in 5.40), before it ``past_key_values``."""
    parameters = inspect.signature(module.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class DecodeWorker:
    """Batched speculative decoding of ``model`` with drafts from ``drafter``.

    Args:
        drafter: the draft source (None: plain decoding through the same path).
        max_batch: requests decoded together; later ones wait in a queue.
        eos_token_ids: a committed token in this set ends its request.
        metrics: where each step's acceptance is recorded (``WorkerMetrics``).
        budget: the rule the drafter client sizes trees with (for the budget gauge).
        chain: verify each tree's best chain (:meth:`Tree.best_chain`) of at most this many
            draft tokens, as engines that verify chains do, instead of the tree (None).

    Not thread-safe: one loop calls :meth:`submit` and :meth:`step` (or :meth:`run`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        drafter: DraftSource | None = None,
        *,
        max_batch: int = 8,
        eos_token_ids: Iterable[int] = (),
        metrics: WorkerMetrics | None = None,
        budget: BudgetRule | None = None,
        chain: int | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if chain is not None and chain < 1:
            raise ValueError(f"chain must be >= 1 draft tokens, got {chain}")
        self.chain = chain
        model.train(False)  # inference: no dropout
        self.model = model
        self.drafter = drafter
        self.max_batch = max_batch
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.metrics = metrics
        self.budget = budget
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.config.vocab_size)  # rows of the output embedding
        self.dtype: torch.dtype = model.dtype
        self.kv = BatchKVCache(model.config)
        self._cache_kw = cache_keyword(model)
        self._base_cache_kw = cache_keyword(model.base_model)
        self.stats = WorkerStats()
        self._pending: deque[GenerationRequest] = deque()
        self._active: list[_Active] = []
        self._live_ids: set[str] = set()

    @property
    def idle(self) -> bool:
        """No request is running or waiting."""
        return not self._pending and not self._active

    def submit(self, request: GenerationRequest) -> None:
        """Queues a request; it joins the batch at the next step with room."""
        rid, prompt = request.request_id, request.prompt_ids
        if not isinstance(rid, str) or not rid or rid in self._live_ids:
            raise ValueError(f"request_id must be a new non-empty str, got {rid!r}")
        if not prompt:
            raise ValueError(f"prompt of {rid!r} is empty")
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt of {rid!r}: token id {bad} outside [0, {self.vocab_size})")
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens of {rid!r} must be >= 1, "
                             f"got {request.max_new_tokens}")  # fmt: skip
        teacher = request.teacher_ids
        if teacher is not None and len(teacher) < request.max_new_tokens:
            raise ValueError(f"teacher_ids of {rid!r} hold {len(teacher)} tokens, fewer than "
                             f"max_new_tokens ({request.max_new_tokens})")  # fmt: skip
        self._live_ids.add(rid)
        self._pending.append(request)

    def run(self, requests: Iterable[GenerationRequest]) -> list[Generation]:
        """Decodes ``requests`` to the end; generations in the order given."""
        order = []
        for request in requests:
            self.submit(request)
            order.append(request.request_id)
        done: dict[str, Generation] = {}
        while not self.idle:
            done.update((g.request_id, g) for g in self.step())
        return [done[rid] for rid in order if rid in done]

    @torch.inference_mode()  # type: ignore[untyped-decorator]  # torch is not followed
    def step(self) -> list[Generation]:
        """One decode step of the whole batch; returns the requests it finished."""
        self._admit()
        active = self._active
        if not active:
            return []
        timings = self.stats.timings
        drafts, round_trip_s = self._draft()
        start = self._clock()
        packed = self._pack([None if drafts is None else drafts[a.request.request_id]
                             for a in active])  # fmt: skip
        mask = self.kv.attention_mask(packed.attention_mask, self.dtype)
        packed_at = self._clock()
        logits = self.model(input_ids=packed.tokens, position_ids=packed.positions,
                            attention_mask=mask, use_cache=True,
                            **{self._cache_kw: self.kv.cache}).logits  # fmt: skip
        forward_at = self._clock()
        result = self._verify(packed, logits)
        verified_at = self._clock()
        self.kv.keep_accepted(result.accepted_nodes, result.accept_lengths + 1)
        kept_at = self._clock()
        timings.pack_s += packed_at - start
        timings.forward_s += forward_at - packed_at
        timings.verify_s += verified_at - forward_at
        timings.kv_s += kept_at - verified_at
        draft_sizes = packed.num_nodes - 1
        self._count(result, draft_sizes)
        if self.metrics is not None:
            budget = None if self.budget is None else self.budget.draft_budget(len(active))
            self.metrics.record_step(result, draft_sizes, drafts, round_trip_s, budget)
        return self._commit(result)

    # --- the phases of a step

    def _admit(self) -> None:
        """Prefills waiting requests into free rows in one forward pass: each prompt but its
        last token, right-padded (causal attention keeps real tokens from the padding after
        them, whose K/V lands past the row's length, masked out later)."""
        joining: list[GenerationRequest] = []
        while self._pending and len(self._active) + len(joining) < self.max_batch:
            joining.append(self._pending.popleft())
        if not joining:
            return
        start = self._clock()
        contexts = [[int(t) for t in r.prompt_ids] for r in joining]
        lengths = [len(c) - 1 for c in contexts]
        cache = DynamicCache(config=self.model.config)
        # One column at least, so the cache is filled for one-token prompts too (with
        # padding past their length, like any row's).
        ids = torch.zeros((len(joining), max(1, *lengths)), dtype=torch.long)
        for row, context in enumerate(contexts):
            ids[row, : lengths[row]] = torch.tensor(context[:-1])
        self.model.base_model(input_ids=ids.to(self.device), use_cache=True,
                              **{self._base_cache_kw: cache})  # fmt: skip
        self.kv.append_rows(cache, lengths)
        for request, context in zip(joining, contexts, strict=True):
            generator = None
            if request.sampling.temperature > 0:
                generator = torch.Generator(device=self.device).manual_seed(request.sampling.seed)
            teacher = None
            if request.teacher_ids is not None:
                teacher = torch.tensor(list(request.teacher_ids), dtype=torch.long,
                                       device=self.device)  # fmt: skip
            self._active.append(_Active(request, context, generator=generator, teacher=teacher))
            if self.drafter is not None:
                self.drafter.add_request(request.request_id, context)
        self.stats.timings.prefill_s += self._clock() - start

    def _draft(self) -> tuple[StepResult | None, float]:
        """The batch's trees from one drafter call (None without a drafter)."""
        if self.drafter is None:
            return None, 0.0
        commits = {}
        for a in self._active:
            commits[a.request.request_id], a.unsent = a.unsent, []
        start = time.perf_counter()
        drafts = self.drafter.step(commits)
        round_trip_s = time.perf_counter() - start
        self.stats.timings.draft_s += round_trip_s
        if drafts.outcome is not Outcome.OK:
            self.stats.fallbacks[drafts.outcome.value] += 1
        return drafts, round_trip_s

    def _pack(self, trees: list[Tree | None]) -> PackedTrees:
        roots = [a.context[-1] for a in self._active]
        pack = functools.partial(pack_trees, roots=roots, cache_lens=self.kv.lens,
                                 device=self.device, vocab_size=self.vocab_size)  # fmt: skip
        try:
            packed = pack(trees)
        except ValueError:  # a malformed tree (ids the model lacks, bad parents): the
            # drafter must not be able to crash decoding
            trees = [self._well_formed(tree, root) for tree, root in zip(trees, roots, strict=True)]
            packed = pack(trees)
        if self.chain is not None:  # each tree's best chain, as the vLLM plug-in takes it
            chains = [None if t is None else t.best_chain(self.chain) for t in trees]
            trees = [None if c is None else Tree.of(c, range(-1, len(c) - 1), [0.0] * len(c))
                     for c in chains]  # fmt: skip
            packed = pack(trees)
        return packed

    def _well_formed(self, tree: Tree | None, root: int) -> Tree | None:
        """``tree`` if it packs, else None (counted): that request decodes without a draft."""
        if tree is None:
            return None
        try:
            pack_trees([tree], [root], [0], vocab_size=self.vocab_size)
        except ValueError:
            self.stats.rejected_trees += 1
            return None
        return tree

    def _verify(self, packed: PackedTrees, logits: Tensor) -> VerifyResult:
        """Greedy rows take the argmax at every node; sampling rows draw one token per
        node from their own generator (lossless: see tree_verification.py)."""
        targets = logits.argmax(dim=-1)
        for b, a in enumerate(self._active):
            if a.teacher is not None:
                # The recorded token at each node's output position (the node at depth d
                # is followed by output token len(output) + d); past the end, the last.
                at = (packed.depth[b] + len(a.output)).clamp(max=len(a.teacher) - 1)
                targets[b] = a.teacher[at]
            elif a.generator is not None:
                p = a.request.sampling
                targets[b] = sample_targets(logits[b : b + 1], temperature=p.temperature,
                                            top_k=p.top_k, top_p=p.top_p,
                                            generator=a.generator)[0]  # fmt: skip
        return accept(packed, targets)

    def _commit(self, result: VerifyResult) -> list[Generation]:
        """Appends each request's accepted tokens and bonus; retires finished requests."""
        tokens = result.accepted_tokens.tolist()
        lengths = result.accept_lengths.tolist()
        keep, finished = [], []
        for b, a in enumerate(self._active):
            new = tokens[b][: lengths[b] + 1]
            reason: Literal["eos", "length"] | None = None
            eos_at = next((i for i, t in enumerate(new) if t in self.eos_token_ids), None)
            room = a.request.max_new_tokens - len(a.output)
            if eos_at is not None and eos_at < room:
                new, reason = new[: eos_at + 1], "eos"
            elif len(new) >= room:
                new, reason = new[:room], "length"
            a.output += new
            a.context += new
            a.unsent += new
            a.steps += 1
            self.stats.output_tokens += len(new)
            if reason is None:
                keep.append(b)
                continue
            rid = a.request.request_id
            finished.append(Generation(rid, a.output, reason, a.steps))
            self._live_ids.discard(rid)
            if self.drafter is not None:
                self.drafter.finish(rid, tail=a.unsent)
        if len(keep) < len(self._active):
            self._active = [self._active[b] for b in keep]
            self.kv.keep_rows(keep)
        return finished

    def _count(self, result: VerifyResult, draft_sizes: Tensor) -> None:
        stats = self.stats
        stats.steps += 1
        stats.request_steps += len(self._active)
        stats.drafts += int((draft_sizes > 0).sum())
        stats.draft_tokens += int(draft_sizes.sum())
        stats.accepted_tokens += int(result.accept_lengths.sum())

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
