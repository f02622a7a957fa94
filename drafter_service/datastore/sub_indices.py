"""The datastore: immutable suffix-array sub-indices over token documents (SSSD §3.1.2)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.tokens import TokenIds, as_token_array, check_vocab_size
from drafter_service.native import _core

MAX_SUB_INDEX_TOKENS = 2**31 - 3
"""The most tokens one sub-index holds (the native suffix array needs length < 2^31 - 2)."""

SEPARATOR = -1
"""Token value between documents in a sub-index; sorts below every token id."""


def concat_documents(
    documents: Iterable[TokenIds], vocab_size: int
) -> npt.NDArray[np.int32]:
    """Checks ``documents`` and joins them (:func:`join_documents`)."""
    return join_documents(
        [as_token_array(doc, vocab_size, what=f"document {i}") for i, doc in enumerate(documents)]
    )


def join_documents(docs: Sequence[npt.NDArray[np.int32]]) -> npt.NDArray[np.int32]:
    """int32 ``docs`` as one text, ``SEPARATOR`` between each two."""
    if not docs:
        return np.zeros(0, dtype=np.int32)
    sep = np.array([SEPARATOR], dtype=np.int32)
    return np.concatenate([part for doc in docs for part in (sep, doc)][1:])


class _NativeHolder:
    """A Python face of one native object (a sub-index or a datastore, ``native``), whose
    sizes it reads through; the native object is the one that knows them."""

    __slots__ = ("native",)

    def __init__(self, native: _core.SubIndex | _core.Datastore) -> None:
        self.native = native

    @property
    def num_tokens(self) -> int:
        """Text positions, separators included (of every sub-index, for a datastore)."""
        return self.native.num_tokens

    @property
    def resident_bytes(self) -> int:
        """Bytes kept in memory: 4 per token, 4 per suffix, and a first-token table per
        sub-index."""
        return self.native.resident_bytes


class SubIndex(_NativeHolder):
    """One suffix array over a text of documents. Immutable once built."""

    __slots__ = ("origin",)
    native: _core.SubIndex

    def __init__(self, native: _core.SubIndex) -> None:
        super().__init__(native)
        # A snapshot directory and manifest entry holding exactly this sub-index (set on
        # load or write), so a later snapshot hardlinks its files instead of writing them.
        self.origin: tuple[Path, object] | None = None

    @classmethod
    def build(
        cls, documents: Iterable[TokenIds], vocab_size: int
    ) -> SubIndex:
        """Builds the suffix array (SA-IS, linear time) over ``documents``."""
        check_vocab_size(vocab_size)
        return cls.from_text(concat_documents(documents, vocab_size), vocab_size)

    @classmethod
    def from_text(cls, text: npt.NDArray[np.int32], vocab_size: int) -> SubIndex:
        """Builds the suffix array over a joined text (:func:`join_documents`); copies it."""
        check_vocab_size(vocab_size)
        _check_text(text, 0)
        return cls(_core.SubIndex.build(np.ascontiguousarray(text), vocab_size))

    def extended(self, text: npt.NDArray[np.int32]) -> SubIndex:
        """A new sub-index over this one's text, a separator and joined ``text``; built
        without the GIL, so drafting threads keep running during a live rebuild."""
        _check_text(text, self.num_tokens + 1)
        return SubIndex(_core.SubIndex.build_extended(self.native, np.ascontiguousarray(text)))

    @classmethod
    def from_arrays(
        cls,
        tokens: npt.NDArray[np.int32],
        suffix_array: npt.NDArray[np.int32],
        vocab_size: int,
    ) -> SubIndex:
        """Wraps existing arrays (e.g. memory-mapped snapshot files) without copying."""
        check_vocab_size(vocab_size)
        for name, arr in (("tokens", tokens), ("suffix_array", suffix_array)):
            if not isinstance(arr, np.ndarray) or arr.dtype != np.int32 or arr.ndim != 1:
                raise ValueError(f"{name} must be a 1-D int32 array, got {_describe(arr)}")
            if not arr.flags.c_contiguous:
                raise ValueError(f"{name} must be C-contiguous")
        return cls(_core.SubIndex.wrap(tokens, suffix_array, vocab_size, (tokens, suffix_array)))

    @property
    def vocab_size(self) -> int:
        return self.native.vocab_size

    def tokens(self) -> npt.NDArray[np.int32]:
        """Read-only view of the text (no copy)."""
        return self.native.tokens()

    def suffix_array(self) -> npt.NDArray[np.int32]:
        """Read-only view of the suffix array (no copy)."""
        return self.native.suffix_array()

    def find_range(self, prefix: TokenIds) -> tuple[int, int]:
        """Rows ``[begin, end)`` of the suffix array whose suffixes start with ``prefix``."""
        arr = as_token_array(prefix, self.vocab_size, what="prefix")
        return self.native.find_range(arr)


class Datastore(_NativeHolder):
    """An immutable set of sub-indices (oldest first) sharing one vocabulary.

    The first ``base_count`` are a base (pinned corpora), the rest live data; with both
    present each is its own source with its own samples, so a large base cannot outvote
    fresh live data (docs/algorithm.md). 0 or all of them: one source."""

    __slots__ = ("base_count", "sub_indices", "vocab_size")
    native: _core.Datastore

    def __init__(
        self, sub_indices: Sequence[SubIndex], vocab_size: int, base_count: int = 0
    ) -> None:
        check_vocab_size(vocab_size)
        for i, s in enumerate(sub_indices):
            if s.vocab_size != vocab_size:
                raise ValueError(
                    f"sub-index {i} has vocab_size {s.vocab_size}, expected {vocab_size}"
                )
        self.sub_indices = tuple(sub_indices)
        self.vocab_size = vocab_size
        self.base_count = base_count
        # The native constructor refuses a base_count outside [0, len(sub_indices)].
        super().__init__(_core.Datastore([s.native for s in self.sub_indices], base_count))

    @classmethod
    def empty(cls, vocab_size: int) -> Datastore:
        return cls([], vocab_size)

    @classmethod
    def from_documents(
        cls,
        documents: Iterable[TokenIds],
        vocab_size: int,
    ) -> Datastore:
        """One sub-index over all ``documents``."""
        return cls([SubIndex.build(documents, vocab_size)], vocab_size)


def _check_text(text: object, base_tokens: int) -> None:
    """``text`` is 1-D int32 and ``base_tokens`` + its length fit one sub-index."""
    if not isinstance(text, np.ndarray) or text.dtype != np.int32 or text.ndim != 1:
        raise ValueError(f"text must be a 1-D int32 array, got {_describe(text)}")
    if base_tokens + len(text) > MAX_SUB_INDEX_TOKENS:
        raise ValueError(
            f"sub-index of {base_tokens + len(text)} tokens exceeds the 2^31 - 2 limit"
        )


def _describe(arr: object) -> str:
    if isinstance(arr, np.ndarray):
        return f"{arr.ndim}-D {arr.dtype} array"
    return type(arr).__name__
