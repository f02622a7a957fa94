"""The drafting service behind SGLang's n-gram corpus interface (pure: imports no SGLang).

``NGRAMWorker`` calls ``tokens, mask = corpus.batch_get(req_ids, batch_tokens, total_lens)``
once per decode step: ``batch_tokens[i]`` is the tail (the last
``speculative_ngram_max_trie_depth`` tokens) of request i's committed context, of length
``total_lens[i]``. :class:`DraftCorpus` answers with one :meth:`EngineDrafter.draft` call,
in the layout :func:`corpus_layout` builds as the C++ corpus does (``ngram_corpus/
result.cpp``, ``fillResult``): per request D = ``speculative_num_draft_tokens`` tokens,
the root (last committed token) then the nodes breadth-first, padded with token 0 off the
root, and a ``D x D`` mask (``mask[i, j] = 1``: j is i or an ancestor of i); both flat
int64, ``[B * D]`` and ``[B * D * D]``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from verifier_client.engines.batch import EngineDrafter, may_store
from verifier_client.results import Tree

__all__ = ["CorpusLayout", "DraftCorpus", "corpus_layout", "store_verdict"]

log = logging.getLogger(__name__)

CorpusLayout = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""``(tokens [B * D], mask [B * D * D])``, both int64, as ``NgramCorpus.batch_get`` returns."""


def corpus_layout(
    trees: Sequence[Tree | None], roots: Sequence[int], num_draft_tokens: int
) -> CorpusLayout:
    """SGLang's corpus layout of one tree per request (None: the root alone), each cut to
    its first ``num_draft_tokens - 1`` nodes; ValueError names a malformed tree."""
    d = num_draft_tokens
    batch = len(roots)
    tokens = np.zeros((batch, d), np.int64)
    tokens[:, 0] = np.asarray(roots, np.int64).reshape(batch)
    # Column of each node's parent. Padding hangs off the root (column 0), as in
    # SGLang's corpus; the root's own entry is never read.
    parents = np.zeros((batch, d), np.int64)
    for row, tree in enumerate(trees):
        if tree is None or len(tree) == 0:
            continue
        n = min(len(tree), d - 1)
        tok = np.asarray(tree.tokens[:n], np.int64)
        par = np.asarray(tree.parents[:n], np.int64)
        bad = np.flatnonzero((par < -1) | (par >= np.arange(n)) | (tok < 0))
        if len(bad):
            k = int(bad[0])
            raise ValueError(
                f"trees[{row}] node {k}: token {tok[k]}, parent {par[k]} (need a token >= 0 "
                f"and a parent in -1..{k - 1})"
            )
        tokens[row, 1 : n + 1] = tok
        parents[row, 1 : n + 1] = par + 1  # node index -> column; the root's -1 -> 0
    mask = np.zeros((batch, d, d), np.int64)
    mask[:, 0, 0] = 1
    rows = np.arange(batch)
    for col in range(1, d):  # parents precede children: a parent's row is final here
        mask[:, col] = mask[rows, parents[:, col]]
        mask[:, col, col] = 1
    return tokens.reshape(-1), mask.reshape(-1)


def store_verdict(req: Any) -> bool | None:
    """None while ``req`` (an SGLang ``Req``) is unfinished; else whether to ingest its
    generation: yes, finished or aborted (what it generated is the model's own output,
    as with the vLLM plug-in), unless it opted out through ``STORE_KEY``."""
    return _opted_in(req) if req.finished() else None


def _opted_in(req: Any) -> bool:
    """Whether ``req`` may be stored (and so shared while in flight)."""
    return may_store(getattr(req.sampling_params, "custom_params", None))


class DraftCorpus:
    """Stands in for SGLang's ``NgramCorpus`` in ``NGRAMWorker.ngram_corpus``.

    ``drafter`` is None on tensor-parallel ranks but the first (they answer the root
    alone; the worker broadcasts the first's). The worker calls :meth:`bind` with the
    batch's ``Req`` objects before each ``batch_get`` and :meth:`release` when SGLang
    reports a request finished."""

    def __init__(self, drafter: EngineDrafter | None, num_draft_tokens: int) -> None:
        self.drafter = drafter
        self.draft_token_num = num_draft_tokens  # SGLang's name for D
        self._bound: list[Any] = []  # this step's Req objects, in batch order
        self._live: dict[str, Any] = {}  # request id -> Req, for requests sent to the drafter
        self._parked: set[str] = set()  # left the batch unfinished (retracted, or overlap lag)
        self.layout_errors = 0  # steps answered without drafts: a tree was malformed

    def bind(self, reqs: Sequence[Any]) -> None:
        """The batch ``batch_get`` is about to be called for."""
        self._bound = list(reqs)
        if self.drafter is not None:
            for req in self._bound:
                if not req.finished():  # overlap runs a finished request one step more
                    self._live[req.rid] = req

    def batch_get(
        self,
        req_ids: Sequence[str],
        batch_tokens: Sequence[Sequence[int]],
        total_lens: Sequence[int],
    ) -> CorpusLayout:
        """One tree per request from one drafter call, in SGLang's layout. Never raises
        for the drafter's sake: a failed or late call is a step without drafts."""
        roots = [int(tail[-1]) for tail in batch_tokens]  # SGLang never sends an empty tail
        trees: list[Tree | None] = [None] * len(req_ids)
        drafter = self.drafter
        reqs = self._aligned(req_ids)
        # A finished request (an overlap step late) is not drafted: it would come back
        # to the drafter as a new request after its release.
        rows = [i for i, r in enumerate(reqs) if r is None or not r.finished()]
        if drafter is not None and rows:
            lengths = [int(total_lens[i]) for i in rows]
            prompts = [
                len(reqs[i].origin_input_ids_unpadded) if reqs[i] is not None else n
                for i, n in zip(rows, lengths, strict=True)
            ]  # fmt: skip

            def tokens(k: int, start: int, stop: int) -> list[int]:
                i = rows[k]
                return _context(reqs[i], batch_tokens[i], lengths[k], start, stop)

            stores = [reqs[i] is None or _opted_in(reqs[i]) for i in rows]
            drafts = drafter.draft([req_ids[i] for i in rows], lengths, prompts, tokens,
                                   stores=stores)  # fmt: skip
            for i, tree in zip(rows, drafts, strict=True):
                trees[i] = tree
        try:
            return corpus_layout(trees, roots, self.draft_token_num)
        except ValueError:
            self.layout_errors += 1
            if self.layout_errors == 1:  # once: a broken drafter must not flood the log
                log.exception("sssd drafter: malformed tree; this step has no drafts")
            return corpus_layout([None] * len(roots), roots, self.draft_token_num)

    def release(self, request_id: str) -> None:
        """SGLang finished ``request_id``: end it on the drafter (stored unless opted out)."""
        req = self._live.get(request_id)
        if req is not None:
            self._end(request_id, store_verdict(req) is True)

    def erase_match_state(self, req_ids: Sequence[str]) -> None:
        """Requests that left the decode batch. Finished ones are ended here (in case no
        finish was reported); retracted ones stay until they return or finish."""
        self._parked.update(r for r in req_ids if r in self._live)
        self._parked.difference_update(req.rid for req in self._bound)
        for request_id in list(self._parked):
            verdict = store_verdict(self._live[request_id])
            if verdict is not None:
                self._end(request_id, verdict)

    def batch_put(self, batch_tokens: Sequence[Sequence[int]]) -> None:
        """No-op: the drafter learns each request's tokens from the next ``batch_get``."""

    def synchronize(self) -> None:
        """No-op: nothing is inserted asynchronously."""

    def reset(self) -> None:
        """SGLang flushed its caches: end every request still held."""
        for request_id, req in list(self._live.items()):
            self._end(request_id, store_verdict(req) is True)

    def close(self) -> None:
        """Sends queued finishes and closes the drafter client."""
        if self.drafter is not None:
            self.drafter.close(2.0)

    # SGLang's external-corpus admin calls reach the corpus; ours lives in the service.
    def load_external_corpus_named(self, corpus_id: str, chunks: object, *args: object) -> int:
        raise ValueError(
            f"corpus {corpus_id!r}: SSSD drafts from the drafting service; add corpora "
            "there (datastore-builder, or the drafter's admin API)"
        )

    def commit_external_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        raise ValueError(f"corpus {corpus_id!r}: no external corpora with SSSD")

    def remove_external_corpus(self, corpus_id: str) -> None:
        raise ValueError(f"corpus {corpus_id!r}: no external corpora with SSSD")

    def list_external_corpora(self) -> dict[str, int]:
        return {}

    def _aligned(self, req_ids: Sequence[str]) -> list[Any]:
        if [r.rid for r in self._bound] == list(req_ids):
            return self._bound
        return [None] * len(req_ids)  # not bound: the tails are all we know

    def _end(self, request_id: str, store: bool) -> None:
        req = self._live.pop(request_id, None)
        self._parked.discard(request_id)
        if self.drafter is not None:
            # The final context adds the last step's tokens, which no batch_get sent.
            context = None if req is None else [*req.origin_input_ids_unpadded, *req.output_ids]
            self.drafter.release(request_id, store=store, context=context)


def _context(req: Any, tail: Sequence[int], total_len: int, start: int, stop: int) -> list[int]:
    """``context[start:stop]`` of a request whose committed context ends with ``tail``: the
    prompt (``origin_input_ids_unpadded``), ``output_ids``, and under overlap scheduling the
    last step's accepted tokens, which only the tail holds yet (the plug-in keeps the tail
    at least D long, and D bounds a step's accepted tokens)."""
    tail_start = total_len - len(tail)
    if start >= tail_start:
        return [int(t) for t in tail[start - tail_start : stop - tail_start]]
    head_stop = min(stop, tail_start)
    prompt: Sequence[int] = req.origin_input_ids_unpadded if req is not None else ()
    output: Sequence[int] = req.output_ids if req is not None else ()
    p = len(prompt)
    if head_stop > p + len(output):
        rid = req.rid if req is not None else "an unbound request"
        raise ValueError(
            f"{rid}: context tokens {p + len(output)}..{head_stop} are in neither the "
            f"request's arrays nor its {len(tail)}-token tail"
        )
    head = [*prompt[start:head_stop], *output[max(start - p, 0) : max(head_stop - p, 0)]]
    return [int(t) for t in head] + [int(t) for t in tail[: max(stop - tail_start, 0)]]
