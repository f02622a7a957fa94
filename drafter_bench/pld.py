"""Prompt-lookup decoding (PLD), the baseline: vLLM's ``ngram`` speculative method.

Rule (vLLM v1 ``NgramProposer``, a reversed-KMP search): over the whole token
sequence so far (prompt + committed output), take the longest ``n`` in
``[min_n, max_n]`` such that the last ``n`` tokens also occur starting at an
earlier position (occurrences may overlap the suffix); among those earlier
occurrences take the first one; the draft is the (up to) ``k`` tokens that
follow it, as one chain. No occurrence of any allowed length: no draft.

vLLM's own defaults are ``prompt_lookup_min = prompt_lookup_max = 5`` when
neither is set; the benchmark defaults to 1..4 (a more generous baseline) and
exposes both bounds as options.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

Tokens = Sequence[int] | npt.NDArray[np.integer]


def _check(k: int, min_n: int, max_n: int) -> None:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")


def propose(tokens: Tokens, k: int, min_n: int, max_n: int) -> list[int]:
    """The PLD draft for ``tokens`` (a pure function; O(len * (max_n - min_n + 1)))."""
    _check(k, min_n, max_n)
    arr = np.asarray(tokens, dtype=np.int64)
    total = len(arr)
    if k == 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        # Windows starting at 0 .. total - n - 1: every start before the suffix's own.
        windows = sliding_window_view(arr[: total - 1], n)
        hits = np.flatnonzero((windows == arr[total - n :]).all(axis=1))
        if len(hits):
            start = int(hits[0]) + n
            return [int(t) for t in arr[start : start + k]]
    return []


class PldIndex:
    """Incremental PLD over one growing sequence: O(max_n - min_n + 1) per token.

    Keeps, for every n-gram of length ``min_n..max_n`` seen so far, its first
    start position. The suffix of length ``n`` has an earlier occurrence iff
    its first start lies before the suffix's own start. Same drafts as
    :func:`propose`.
    """

    __slots__ = ("_first", "_tokens", "max_n", "min_n")

    def __init__(self, min_n: int, max_n: int, tokens: Tokens = ()) -> None:
        _check(0, min_n, max_n)
        self.min_n = min_n
        self.max_n = max_n
        self._tokens: list[int] = []
        self._first: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Tokens) -> None:
        """Appends committed tokens."""
        seq = self._tokens
        first = self._first
        lo, hi = self.min_n, self.max_n
        for t in tokens.tolist() if isinstance(tokens, np.ndarray) else tokens:
            seq.append(int(t))
            end = len(seq)
            for n in range(lo, min(hi, end) + 1):
                first.setdefault(tuple(seq[end - n :]), end - n)

    def propose(self, k: int) -> list[int]:
        """The PLD draft of at most ``k`` tokens for the sequence so far."""
        seq = self._tokens
        total = len(seq)
        if k <= 0:
            return []
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            j = self._first.get(tuple(seq[total - n :]))
            if j is not None and j < total - n:
                return seq[j + n : j + n + k]
        return []
