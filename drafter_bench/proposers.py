"""Drafting methods as the replay loop drives them: begin / draft per step / end.

Each proposer drafts for a batch of lanes (``slot`` numbers) in one call and
records in ``call_ns`` the time spent drafting in that call.
"""

from __future__ import annotations

import itertools
import time
from typing import Protocol

import numpy as np
import numpy.typing as npt

from drafter_bench.pld import PldIndex
from drafter_bench.token_records import Record
from drafter_service.datastore.sub_indices import Datastore
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import DraftBatch, Drafter
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


class DrafterProposer:
    """The Drafter (input trie, optionally fused with a datastore): one native call per step."""

    def __init__(self, drafter: Drafter, budget: int) -> None:
        self.drafter = drafter
        self.budget = budget
        self.call_ns = 0
        self._ids: dict[int, str] = {}
        self._serial = 0
        self.last: DraftBatch | None = None
        """The last :meth:`draft` call's trees as the drafter gave them (node scores too)."""

    def begin(self, slot: int, record: Record) -> None:
        self._serial += 1
        self._ids[slot] = f"{slot}:{self._serial}"
        self.drafter.start(self._ids[slot], record.prompt_ids)

    def draft(self, slots: list[int], deltas: list[npt.NDArray[np.int32]]) -> list[Tree]:
        ids = [self._ids[s] for s in slots]
        offsets = np.zeros(len(deltas) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in deltas], out=offsets[1:])
        flat = np.concatenate(deltas) if deltas else _EMPTY
        start = time.perf_counter_ns()
        batch = self.drafter.draft_batch(ids, flat, offsets, self.budget)
        self.call_ns = time.perf_counter_ns() - start
        self.last = batch
        tokens, parents = batch.tokens.tolist(), batch.parents.tolist()
        pairs = itertools.pairwise(batch.offsets.tolist())
        return [(tokens[lo:hi], parents[lo:hi]) for lo, hi in pairs]

    def end(self, slot: int) -> None:
        self.drafter.stop(self._ids.pop(slot))

    def set_datastore(self, datastore: Datastore) -> None:
        self.drafter.set_datastore(datastore)


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
