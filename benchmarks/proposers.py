"""Drafting methods as the replay loop drives them: begin / draft per step / end.

Each proposer drafts for a batch of lanes (``slot`` numbers) in one call and
records in ``call_ns`` the time spent drafting in that call. The Drafter-backed
proposer can also pre-draft the next step for the likeliest outcomes of the step it
just drafted (``replay --prefetch``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from benchmarks.pld import PldIndex
from benchmarks.token_records import Record
from drafter_service.datastore.sub_indices import Datastore
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import DraftBatch, Drafter, DraftTree
from drafter_service.drafting.predraft import Predraft, predraft_batch
from drafter_service.native import _core

Tree = tuple[list[int], list[int]]
"""A draft tree as (tokens, parents) in breadth-first order; parent -1 is the root."""

_EMPTY = np.zeros(0, dtype=np.int32)


class Proposer(Protocol):
    """A drafting method as the replay loop sees it; ``slot`` names a batch lane."""

    call_ns: int
    """Time spent drafting in the last :meth:`draft` call."""

    def begin(self, slot: int, record: Record) -> None: ...
    def draft(self, slots: list[int], deltas: list[npt.NDArray[np.int32]]) -> list[Tree]: ...
    def end(self, slot: int) -> None: ...
    def set_datastore(self, datastore: Datastore) -> None: ...


class MeteredDrafter(Drafter):
    """A Drafter that adds up the time and the tree nodes of its ``draft_after`` calls:
    the native side of pre-drafting, read around ``predraft_batch`` (which makes two)."""

    # Class-level zeros: the first += gives each instance its own count, so the
    # Drafter's constructor is inherited as it is.
    after_ns: int = 0
    after_nodes: int = 0

    def draft_after(
        self,
        request_ids: Sequence[str],
        tokens: npt.NDArray[np.int32],
        offsets: npt.NDArray[np.int64],
        budgets: int | Sequence[int] | npt.NDArray[np.integer],
    ) -> DraftBatch:
        start = time.perf_counter_ns()
        batch = super().draft_after(request_ids, tokens, offsets, budgets)
        self.after_ns += time.perf_counter_ns() - start
        self.after_nodes += len(batch.tokens)
        return batch


@dataclass(frozen=True, slots=True)
class PredraftCall:
    """The pre-drafts of one replay step at one fan-out, and what they cost."""

    predrafts: list[list[Predraft]]
    """Per request of the last :meth:`DrafterProposer.draft` call, in its order."""
    native_ns: int
    """Time in ``draft_after`` (both native calls of ``predraft_batch``)."""
    total_ns: int
    """Time in ``predraft_batch`` as a whole: the native calls and the planning in Python."""
    nodes: int
    """Tree nodes both native calls drafted (bonus candidates, then the pre-drafts)."""


class DrafterProposer:
    """The Drafter (input trie, optionally fused with a datastore): one native call per step."""

    def __init__(self, drafter: MeteredDrafter, budget: int) -> None:
        self.drafter = drafter
        self.budget = budget
        self.call_ns = 0
        self._ids: dict[int, str] = {}
        self._serial = 0
        self._last_ids: list[str] = []
        self._last_batch: DraftBatch | None = None

    def begin(self, slot: int, record: Record) -> None:
        self._serial += 1
        self._ids[slot] = f"{slot}:{self._serial}"
        self.drafter.start(self._ids[slot], record.prompt_ids)

    def draft(self, slots: list[int], deltas: list[npt.NDArray[np.int32]]) -> list[Tree]:
        ids = [self._ids[s] for s in slots]
        flat, offsets = _flatten(deltas)
        start = time.perf_counter_ns()
        batch = self.drafter.draft_batch(ids, flat, offsets, self.budget)
        self.call_ns = time.perf_counter_ns() - start
        self._last_ids, self._last_batch = ids, batch
        tokens, parents = batch.tokens.tolist(), batch.parents.tolist()
        pairs = itertools.pairwise(batch.offsets.tolist())
        return [(tokens[lo:hi], parents[lo:hi]) for lo, hi in pairs]

    @property
    def last_trees(self) -> list[DraftTree]:
        """The trees of the last :meth:`draft` call, with their scores, in its order."""
        batch = self._last_batch
        return [] if batch is None else [batch.tree(i) for i in range(len(batch))]

    def predraft(self, fan_out: int) -> PredraftCall:
        """Pre-drafts of the last :meth:`draft` call's trees (``predraft_batch``): must run
        before the next call, while each request holds the context its tree came from."""
        ns, nodes = self.drafter.after_ns, self.drafter.after_nodes
        start = time.perf_counter_ns()
        predrafts = predraft_batch(self.drafter, self._last_ids, self.last_trees, fan_out,
                                   self.budget)  # fmt: skip
        total_ns = time.perf_counter_ns() - start
        return PredraftCall(predrafts, self.drafter.after_ns - ns, total_ns,
                            self.drafter.after_nodes - nodes)  # fmt: skip

    def draft_after(self, rows: Sequence[tuple[int, list[int]]], budget: int) -> list[DraftTree]:
        """``Drafter.draft_after`` for rows ``(index in the last draft call, extension)``:
        the trees those requests would get after those tokens; changes no state."""
        flat, offsets = _flatten([np.asarray(ext, dtype=np.int32) for _, ext in rows])
        batch = self.drafter.draft_after([self._last_ids[i] for i, _ in rows], flat, offsets,
                                         budget)  # fmt: skip
        return [batch.tree(i) for i in range(len(batch))]

    def end(self, slot: int) -> None:
        self.drafter.stop(self._ids.pop(slot))

    def set_datastore(self, datastore: Datastore) -> None:
        self.drafter.set_datastore(datastore)


def _flatten(
    rows: Sequence[npt.NDArray[np.int32]],
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Rows as one flat token array and offsets: row i is flat[offsets[i]:offsets[i + 1]]."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return (np.concatenate(rows) if rows else _EMPTY), offsets


class ContextProposer:
    """Datastore tree only, via ``_core.draft_context(use_input=False)`` on the full context.

    The timing includes what that call costs beyond drafting (checking every
    context token id): O(context length) per call.
    """

    def __init__(self, datastore: Datastore, config: DraftConfig, budget: int) -> None:
        self.budget = budget
        self.call_ns = 0
        self._native_config = config.to_native()
        self._datastore = datastore
        self._vocab_size = datastore.vocab_size
        self._state: dict[int, tuple[npt.NDArray[np.int32], list[int]]] = {}

    def begin(self, slot: int, record: Record) -> None:
        full = np.concatenate([record.prompt_ids, record.output_ids]).astype(np.int32)
        self._state[slot] = (full, [len(record.prompt_ids)])

    def draft(self, slots: list[int], deltas: list[npt.NDArray[np.int32]]) -> list[Tree]:
        trees: list[Tree] = []
        native = self._datastore.native
        elapsed = 0
        for slot, delta in zip(slots, deltas, strict=True):
            full, pos = self._state[slot]
            pos[0] += len(delta)
            context = full[: pos[0]]
            start = time.perf_counter_ns()
            tokens, parents, _ = _core.draft_context(
                context, native, self._native_config, self.budget, False, self._vocab_size
            )
            elapsed += time.perf_counter_ns() - start
            trees.append((tokens.tolist(), parents.tolist()))
        self.call_ns = elapsed
        return trees

    def end(self, slot: int) -> None:
        del self._state[slot]

    def set_datastore(self, datastore: Datastore) -> None:
        self._datastore = datastore


class PldProposer:
    """Prompt lookup (vLLM ``ngram``): a chain of up to ``budget`` tokens."""

    def __init__(self, budget: int, min_n: int, max_n: int) -> None:
        self.budget = budget
        self.call_ns = 0
        self._min_n, self._max_n = min_n, max_n
        self._index: dict[int, PldIndex] = {}

    def begin(self, slot: int, record: Record) -> None:
        self._index[slot] = PldIndex(self._min_n, self._max_n, record.prompt_ids)

    def draft(self, slots: list[int], deltas: list[npt.NDArray[np.int32]]) -> list[Tree]:
        trees: list[Tree] = []
        elapsed = 0
        for slot, delta in zip(slots, deltas, strict=True):
            index = self._index[slot]
            start = time.perf_counter_ns()
            index.extend(delta)
            chain = index.propose(self.budget)
            elapsed += time.perf_counter_ns() - start
            trees.append((chain, list(range(-1, len(chain) - 1))))
        self.call_ns = elapsed
        return trees

    def end(self, slot: int) -> None:
        del self._index[slot]

    def set_datastore(self, datastore: Datastore) -> None:
        pass
