"""Validation of token-id inputs (and the vocabulary size) at the Python boundary."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

TokenIds = Sequence[int] | npt.NDArray[np.integer]
"""Token ids as the Python API takes them: a sequence of ints or an integer array."""


def as_token_array(
    tokens: TokenIds,
    vocab_size: int,
    *,
    what: str = "tokens",
    check_range: bool = True,
) -> npt.NDArray[np.int32]:
    """``tokens`` (an integer array or a sequence of ints) as a contiguous 1-D int32 array
    of ids in ``[0, vocab_size)``; ``ValueError`` names the bad dtype, shape or value (and
    its index), fit for the caller's users. ``check_range=False`` only refuses what does
    not fit int32: the native code the array goes to checks the range itself."""
    if isinstance(tokens, np.ndarray):
        arr = tokens
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{what} must have an integer dtype, got {arr.dtype}")
    else:
        try:
            arr = np.asarray(tokens)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{what} must be a sequence of ints: {exc}") from None
        if arr.size == 0:
            arr = arr.astype(np.int32)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{what} must contain only ints, got {arr.dtype} values")
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    bound = vocab_size if check_range else 2**31
    if (check_range or arr.dtype != np.int32) and arr.size:
        if int(arr.min()) < 0 or int(arr.max()) >= bound:
            bad_index = int(np.argmax((arr < 0) | (arr >= bound)))
            raise ValueError(
                f"{what}: token id {int(arr[bad_index])} at index {bad_index} is outside "
                f"[0, {bound})"
            )
    return np.ascontiguousarray(arr, dtype=np.int32)


def check_vocab_size(vocab_size: object) -> None:
    check_count("vocab_size", vocab_size, 2**30, "2^30")


def check_count(name: str, value: object, most: int, shown: str) -> None:
    """An int in [1, ``most``] (written ``shown``): TypeError or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not 1 <= value <= most:
        raise ValueError(f"{name} {value} is outside [1, {shown}]")
