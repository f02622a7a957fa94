"""SGLang plug-in: speculative algorithm ``SSSD``, SGLang's n-gram tree verification
with drafts from the drafting service. No fork, no patch.

With ``verifier_client`` in SGLang's environment (its ``sglang.srt.plugins`` entry point
runs :func:`register` in every SGLang process) and a drafter running::

    SSSD_DRAFTER_CONFIG='{"address": "drafter:50051", "deadline_ms": 5, "budget": "16"}' \\
    python -m sglang.launch_server --model-path MODEL \\
        --speculative-algorithm SSSD --speculative-num-draft-tokens 12

SGLang has no server argument a plug-in may claim, hence ``$SSSD_DRAFTER_CONFIG``; bad
settings stop the launch by name, and so does a drafter serving another tokenizer than
the model's (``--tokenizer-path``). ``"custom_params": {"sssd_store": false}`` opts a
request out of storage. SSSD is a ``CustomSpecAlgo`` answering ``is_ngram()``, so SGLang
takes its NGRAM path everywhere (verify input, overlap relay, CUDA graphs, KV sizing),
with ``NGRAMWorker``'s corpus replaced by :class:`DraftCorpus`. The verify width is fixed
at D = ``--speculative-num-draft-tokens`` (root included): trees keep their first D - 1
nodes and the drafter is asked for no more. Only the first tensor-parallel rank calls
the drafter and broadcasts the drafts, so every rank verifies the same tree. Nothing
here imports SGLang before :func:`register` runs.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib
from typing import Any

import numpy as np
import numpy.typing as npt

from verifier_client.budget import BudgetRule
from verifier_client.engines.batch import (
    STORE_KEY,
    DrafterSettings,
    EngineDrafter,
    tokenizer_fingerprint,
)
from verifier_client.engines.sglang_corpus import CorpusLayout, DraftCorpus

CorpusArray = npt.NDArray[np.int64]

__all__ = [
    "ALGORITHM",
    "STORE_KEY",
    "broadcast_layout",
    "capped_budget",
    "register",
    "validate_server_args",
    "worker_class",
]

ALGORITHM = "SSSD"
"""The ``--speculative-algorithm`` name."""
DEFAULT_NUM_DRAFT_TOKENS = 12  # SGLang's NGRAM default for --speculative-num-draft-tokens
_CORPUS_CAPACITY = 64  # NGRAMWorker still builds its own corpus, which we replace unused
_WHERE = f"--speculative-algorithm {ALGORITHM} ($SSSD_DRAFTER_CONFIG)"


def register() -> None:
    """``sglang.srt.plugins`` entry point: registers ``SSSD`` (idempotent). SGLang swallows
    a plug-in's exception, so :func:`validate_server_args` checks the settings."""
    algorithm = importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm
    try:
        algorithm.from_string(ALGORITHM)
    except ValueError:  # not registered in this process yet
        algorithm.register(
            ALGORITHM,
            supports_overlap=True,  # NGRAMWorker's V2 path; False would refuse overlap scheduling
            validate_server_args=validate_server_args,
            spec_class=_spec_class(),
        )(worker_class)


def validate_server_args(server_args: Any) -> None:
    """SGLang's check of a registered algorithm's arguments; ValueError names the bad one."""
    DrafterSettings.resolve(None, where=_WHERE)
    width = server_args.speculative_num_draft_tokens
    if width is not None and (not isinstance(width, int) or width < 2):
        raise ValueError(
            f"--speculative-num-draft-tokens must be an int >= 2 with {ALGORITHM} (the last "
            f"token and at least one draft token), got {width!r}"
        )
    corpus = server_args.speculative_ngram_external_corpus_path
    if corpus is not None:
        raise ValueError(
            f"--speculative-ngram-external-corpus-path {corpus!r} is not used by {ALGORITHM}: "
            "it drafts from the drafting service, which holds the corpora"
        )
    attn_dp = server_args.attn_dp_size
    if attn_dp is not None and attn_dp > 1:
        raise ValueError(f"{ALGORITHM}, like NGRAM, needs --attn-dp-size 1, got {attn_dp!r}")


def _resolve_server_args(server_args: Any) -> None:
    """The defaults SGLang's NGRAM handler would declare, for our tree drafts (reads of
    SGLang's recorder see the resolution so far; each assignment is declared as ours)."""
    if server_args.device == "cpu" and not server_args.disable_overlap_schedule:
        server_args.disable_overlap_schedule = True  # SGLang: no overlap for spec on CPU
    server_args.enable_mixed_chunk = False  # NGRAM's overlap relay cannot join mixed chunks
    # Trees, not chains: backends read topk > 1 as "tree verify" (a chain-only
    # backend must refuse us), whatever breadth the NGRAM flag says.
    topk = max(2, int(server_args.speculative_ngram_max_bfs_breadth))
    server_args.speculative_eagle_topk = topk
    width = server_args.speculative_num_draft_tokens
    if width is None:
        width = server_args.speculative_num_draft_tokens = DEFAULT_NUM_DRAFT_TOKENS
    if server_args.speculative_num_steps is None:
        server_args.speculative_num_steps = width // topk  # as NGRAM sets it
    # The corpus sees only the last max_trie_depth tokens of each context; they
    # must cover a step's accepted tokens (at most D) to be sent as deltas.
    if server_args.speculative_ngram_max_trie_depth < width:
        server_args.speculative_ngram_max_trie_depth = width
    server_args.speculative_ngram_capacity = _CORPUS_CAPACITY
    page_size, backend = server_args.page_size, server_args.attention_backend
    if page_size is not None and page_size > 1 and backend != "flashinfer":
        raise ValueError(  # SGLang's own rule for NGRAM trees on paged attention
            f"{ALGORITHM} verifies trees: --page-size {page_size} needs --attention-backend "
            f"flashinfer, got {backend!r}"
        )


@functools.cache
def _spec_class() -> type:
    """``CustomSpecAlgo`` answering as NGRAM, plus what the scheduler calls on the
    builtin enum that ``CustomSpecAlgo`` lacks in 0.5.23 (checked by the tests)."""
    base: Any = importlib.import_module("sglang.srt.speculative.spec_registry").CustomSpecAlgo
    builtin = importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm

    class SssdAlgorithm(base):  # type: ignore[misc]
        def is_ngram(self) -> bool:
            return True

        def has_draft_kv(self) -> bool:
            return False  # the tree lives in the verify mask only, as NGRAM's

        def carries_draft_hidden_states(self) -> bool:
            return False

        def need_topk(self) -> bool:
            return False

        def get_platform_worker_cls(self) -> type | None:
            return None

        def create_future_map(self, *args: Any, **kwargs: Any) -> Any:
            return builtin.create_future_map(self, *args, **kwargs)

        def handle_server_args(self, server_args: Any) -> None:
            _resolve_server_args(server_args)

    return SssdAlgorithm


def worker_class(server_args: Any = None) -> type:
    """The worker factory: ``NGRAMWorker`` drafting through :class:`DraftCorpus` (its
    module needs SGLang's CUDA kernels: only a GPU server's scheduler gets here)."""
    return _worker_class()


@functools.cache
def _worker_class() -> type:
    base: Any = importlib.import_module("sglang.srt.speculative.ngram_worker").NGRAMWorker
    context = importlib.import_module("sglang.srt.runtime_context")

    class SssdWorker(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._tp_group = context.get_parallel().tp_group
            # The resolved --tokenizer-path (the model's when not given), read as SGLang's
            # own TpModelWorker reads it: self.server_args holds the raw flag, None if unset.
            tokenizer = context.get_serving().tokenizer_path
            rank = self._tp_group.rank_in_group
            self.ngram_corpus = _corpus(self.draft_token_num, rank, tokenizer)

        def _prepare_draft_tokens(self, batch: Any) -> Any:
            self.ngram_corpus.bind(batch.reqs)
            tokens, mask = super()._prepare_draft_tokens(batch)
            if self._tp_group.world_size > 1:  # every rank must verify rank 0's tree
                tokens, mask = broadcast_layout(self._tp_group, tokens, mask)
            return tokens, mask

        def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
            super().note_request_finished(rid=rid, natural_stop=natural_stop)
            self.ngram_corpus.release(rid)

    return SssdWorker


def broadcast_layout(group: Any, tokens: CorpusArray, mask: CorpusArray) -> CorpusLayout:
    """The first rank's ``(tokens, mask)`` on every rank of ``group`` (SGLang's
    ``GroupCoordinator``): all hold the same shapes, so one broadcast of both does."""
    import torch
    import torch.distributed

    flat = torch.from_numpy(np.concatenate((tokens, mask)))
    torch.distributed.broadcast(flat, src=group.ranks[0], group=group.cpu_group)
    both = flat.numpy()
    return both[: tokens.size], both[tokens.size :]


def _corpus(num_draft_tokens: int, tp_rank: int, tokenizer_path: str | None) -> DraftCorpus:
    """The corpus of one scheduler; only the first TP rank holds a drafter client, which
    refuses a drafter serving another tokenizer than ``tokenizer_path``'s tokenizer.json
    (ValueError: the launch stops; not checked for a hub name, as with vLLM)."""
    if tp_rank != 0:
        return DraftCorpus(None, num_draft_tokens)
    settings = DrafterSettings.resolve(None, where=_WHERE)
    # The verify width holds D - 1 draft nodes: never ask the drafter for more.
    budget = capped_budget(settings.budget_rule(), num_draft_tokens - 1)
    fingerprint = tokenizer_fingerprint(tokenizer_path)
    # The drafter serves the metrics, if asked to.
    drafter = EngineDrafter(settings, tokenizer_fingerprint=fingerprint, budget=budget)
    atexit.register(drafter.close, 2.0)  # send the last finishes
    return DraftCorpus(drafter, num_draft_tokens)


def capped_budget(rule: BudgetRule, max_nodes: int) -> BudgetRule:
    """``rule`` asking for at most ``max_nodes`` draft nodes (what a D-wide verify holds)."""
    if rule.fixed_tokens is not None:
        return BudgetRule.fixed(min(rule.fixed_tokens, max_nodes))
    cap = min(rule.cap_tokens, max_nodes)
    return dataclasses.replace(rule, cap_tokens=cap, floor_tokens=min(rule.floor_tokens, cap))
