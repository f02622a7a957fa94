"""Batched SSSD drafting over per-request input tries and a shared datastore.

Lifecycle per request: ``start`` (prompt) → ``draft_batch``/``speculate`` at every
decode step (committed tokens in, a candidate tree out) → ``stop``.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import Datastore
from drafter_service.datastore.tokens import TokenIds, as_token_array, check_count, check_vocab_size
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.native import _core

T = TypeVar("T")


Budgets = int | Sequence[int] | npt.NDArray[np.integer]
"""Draft budgets of a batch: one for every request, or one each."""


@dataclass(frozen=True, slots=True)
class DraftTree:
    """One request's candidate tree in breadth-first order: ``parents[i] < i`` indexes
    this tree; -1 is a child of the root (the last committed token, not in the tree)."""

    tokens: npt.NDArray[np.int32]
    parents: npt.NDArray[np.int32]
    scores: npt.NDArray[np.float32]

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class DraftBatch:
    """Trees of a whole batch as flat arrays: tree ``i`` is rows ``offsets[i]:offsets[i+1]``."""

    tokens: npt.NDArray[np.int32]
    parents: npt.NDArray[np.int32]
    scores: npt.NDArray[np.float32]
    offsets: npt.NDArray[np.int64]
    # Each request's state after the call: the bytes it holds and how many more tokens
    # it takes without allocating.
    state_bytes: npt.NDArray[np.int64]
    state_headroom: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def tree(self, i: int) -> DraftTree:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return DraftTree(self.tokens[lo:hi], self.parents[lo:hi], self.scores[lo:hi])


SCORE_FEATURES = (
    "depth", "log_siblings", "log_over_best", "log_hand_cond",
    *(f"{src}_{name}" for src in ("input", "base", "live")
      for name in ("present", "log_cond", "log_count", "log_parent")),
    "input_match", "input_members", "base_prefix", "live_prefix",
    "unigram_seen", "bigram_seen", "trigram_seen",
    "recent_present", "recent_log_cond", "recent_log_count", "recent_log_parent",
    "recent_prefix",
)  # fmt: skip
"""Columns of :meth:`Drafter.explain`'s features in the native ``ScoreFeature`` order: what
fusion knows of a candidate when it offers it, the inputs of the learned node score
(:attr:`DraftConfig.node_score`); each is defined in docs/algorithm.md, "The learned node
score"."""
assert len(SCORE_FEATURES) == _core.SCORE_FEATURE_COUNT


@dataclass(frozen=True, slots=True)
class ExplainedTree:
    """A :class:`DraftTree` with ``features[i]``: row :data:`SCORE_FEATURES` of node ``i``."""

    tree: DraftTree
    features: npt.NDArray[np.float64]


class Drafter:
    """Drafts candidate trees for many concurrent requests. Thread-safe: any method may be
    called from several threads at once; a native batch call releases the GIL and spreads
    requests over ``num_threads``."""

    def __init__(
        self,
        vocab_size: int,
        config: DraftConfig | None = None,
        datastore: Datastore | None = None,
        num_threads: int = 1,
    ) -> None:
        check_vocab_size(vocab_size)
        check_count("num_threads", num_threads, 1024, "1024")
        self.config = config if config is not None else DraftConfig()
        self.vocab_size = vocab_size
        self._native = _core.Drafter(self.config.to_native(), vocab_size, num_threads)
        self._lock = threading.Lock()
        self._handles: dict[str, int] = {}
        self._next_handle = itertools.count(1)
        self._datastore = Datastore.empty(vocab_size)
        if datastore is not None:
            self.set_datastore(datastore)

    @property
    def num_threads(self) -> int:
        return self._native.num_threads

    @property
    def datastore(self) -> Datastore:
        return self._datastore

    def set_datastore(self, datastore: Datastore) -> None:
        """Swaps the datastore atomically; calls already running keep the old one."""
        if datastore.vocab_size != self.vocab_size:
            raise ValueError(
                f"datastore vocab_size {datastore.vocab_size} does not match the drafter's "
                f"{self.vocab_size}"
            )
        self._native.set_datastore(datastore.native)
        self._datastore = datastore

    def start(
        self, request_id: str, prompt_ids: TokenIds, *, shared: bool = True, group: int = 0
    ) -> None:
        """Creates the state of ``request_id`` from its prompt (O(len * depth)). With the
        recent tier on, ``shared=False`` keeps its tokens out of it (a request that opted
        out of storage); it still drafts from the other requests'. ``group``: its tokens
        are seen by every request when 0, by requests of the same group only when > 0
        (one per client, when clients keep in-flight tokens apart); it sees group 0's and
        its own group's."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if group < 0 or group >= 2**31:
            raise ValueError(f"group {group} is not in [0, 2**31)")
        prompt = as_token_array(prompt_ids, self.vocab_size, what="prompt_ids")
        with self._lock:
            if request_id in self._handles:
                raise ValueError(f"request {request_id!r} is already started")
            handle = next(self._next_handle)
            self._handles[request_id] = handle
        try:
            self._native.start(handle, prompt, shared, group)
        except BaseException:
            with self._lock:
                self._handles.pop(request_id, None)
            raise
        with self._lock:
            stopped = self._handles.get(request_id) != handle
        if stopped:  # stop() ran before the native state existed: free it here
            self._native.stop(handle)

    def hold(self, position: int, tokens: TokenIds) -> bool:
        """With the recent tier on: drafts from a stored generation (``tokens``, as the
        datastore stores it; ``position`` its ingest-log sequence number) from the next
        step on, until :meth:`release_through` says the datastore holds it. False if it
        is not held: no tier, a position released already, or over
        ``recent_held_tokens`` (docs/algorithm.md, "The recent tier")."""
        doc = as_token_array(tokens, self.vocab_size, what="tokens")
        return bool(self._native.hold(_position(position), doc))

    def release_through(self, position: int) -> None:
        """The datastore now holds the stored generations through ``position``: they
        leave the recent tier (call it after :meth:`set_datastore` installs them)."""
        self._native.release_through(_position(position))

    @property
    def held(self) -> tuple[int, int]:
        """Stored generations the recent tier holds until they are folded, and their
        tokens."""
        return self._native.held

    def add(self, request_id: str, token_ids: TokenIds) -> None:
        """Appends committed tokens without drafting."""
        tokens = as_token_array(token_ids, self.vocab_size, what="token_ids")
        self._per_request(self._native.add, request_id, tokens)

    def stop(self, request_id: str) -> bool:
        """Frees the state of ``request_id``; False if it was not started."""
        with self._lock:
            handle = self._handles.pop(request_id, None)
        return handle is not None and self._native.stop(handle)

    def __contains__(self, request_id: object) -> bool:
        with self._lock:
            return request_id in self._handles

    @property
    def num_requests(self) -> int:
        with self._lock:
            return len(self._handles)

    def num_tokens(self, request_id: str) -> int:
        """Tokens the drafter holds for ``request_id`` (prompt + committed)."""
        return self._per_request(self._native.num_tokens, request_id)

    def request_bytes(self, request_id: str) -> int:
        """Bytes held for ``request_id``: its input trie's buffers and its tokens."""
        return self._per_request(self._native.request_bytes, request_id)

    def tokens(self, request_id: str) -> npt.NDArray[np.int32]:
        """A copy of the tokens held for ``request_id`` (prompt + committed), in order."""
        return self._per_request(self._native.tokens, request_id)

    def speculate(
        self,
        request_ids: Sequence[str],
        new_tokens: Sequence[TokenIds],
        budgets: Budgets,
    ) -> DraftBatch:
        """One decode step: appends each request's newly committed tokens and
        drafts a tree of at most ``budgets[i]`` nodes for it."""
        if len(new_tokens) != len(request_ids):
            raise ValueError(f"got {len(new_tokens)} token lists for {len(request_ids)} requests")
        arrays = [
            as_token_array(t, self.vocab_size, what=f"new_tokens[{i}]", check_range=False)
            for i, t in enumerate(new_tokens)
        ]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
        return self.draft_batch(request_ids, flat, offsets, budgets)

    def draft_batch(
        self,
        request_ids: Sequence[str],
        tokens: npt.NDArray[np.int32],
        offsets: npt.NDArray[np.int64],
        budgets: Budgets,
    ) -> DraftBatch:
        """Flat form of :meth:`speculate`: request ``i`` commits
        ``tokens[offsets[i]:offsets[i+1]]``. One native call for the batch."""
        # Token ids, offsets and budgets are checked by the native call (their counts,
        # ranges and order), before any state changes, with the bad value and its index
        # named (for the budget, its one check: check_budgets in
        # native/csrc/draft_config.cc). Here they are only converted to the native dtypes.
        flat = as_token_array(tokens, self.vocab_size, what="tokens", check_range=False)
        offs = _int_array(offsets, np.int64, "offsets")
        if isinstance(budgets, (int, np.integer)) and not isinstance(budgets, bool):
            budgets = np.full(len(request_ids), budgets)  # one budget for every request
        budget_arr = _int_array(budgets, np.int32, "budgets")
        with self._lock:
            try:
                handles = np.array([self._handles[r] for r in request_ids], dtype=np.int64)
            except KeyError as exc:
                raise KeyError(f"unknown request {exc.args[0]!r}") from None
        try:
            return DraftBatch(*self._native.draft_batch(handles, flat, offs, budget_arr))
        except IndexError as exc:
            raise KeyError(f"a request in the batch was stopped concurrently: {exc}") from None
        except ValueError:  # the native check (a handle twice) says it by handle
            if twice := [r for r, n in Counter(request_ids).items() if n > 1]:
                raise ValueError(f"request {twice[0]!r} appears twice in one batch") from None
            raise

    def explain(self, request_id: str, budget: int) -> ExplainedTree:
        """The tree ``request_id`` would be drafted now at ``budget``, with what fusion
        knew of each node (:data:`SCORE_FEATURES`): for offline training and tools.
        Changes no state; the tree is the one :meth:`draft_batch` would return."""
        tokens, parents, scores, flat = self._per_request(self._native.explain, request_id, budget)
        features = flat.reshape(len(tokens), len(SCORE_FEATURES))
        return ExplainedTree(DraftTree(tokens, parents, scores), features)

    def _per_request(self, method: Callable[..., T], request_id: str, *args: Any) -> T:
        """``method(handle, *args)``; a KeyError if ``request_id`` is not started or was
        stopped meanwhile (the native IndexError)."""
        with self._lock:
            handle = self._handles.get(request_id)
        try:
            if handle is not None:
                return method(handle, *args)
        except IndexError:
            pass
        raise KeyError(f"unknown request {request_id!r}")


def _position(position: object) -> int:
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise ValueError(f"position must be an int >= 0, got {position!r}")
    return position


def _int_array(values: object, dtype: type[np.integer[Any]], what: str) -> npt.NDArray[Any]:
    if type(values) is np.ndarray and values.dtype == dtype and values.ndim == 1:
        return np.ascontiguousarray(values)
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu" and arr.size:
        raise ValueError(f"{what} must be integers, got {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.size and (arr.min() < np.iinfo(dtype).min or arr.max() > np.iinfo(dtype).max):
        bad = arr.min() if arr.min() < np.iinfo(dtype).min else arr.max()
        raise ValueError(f"{what} has value {bad} outside the {np.dtype(dtype).name} range")
    return np.ascontiguousarray(arr, dtype=dtype)
