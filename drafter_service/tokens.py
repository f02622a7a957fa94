"""Validation of token-id inputs at the Python boundary."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def as_token_array(
    tokens: Sequence[int] | npt.NDArray[np.integer], vocab_size: int, *, what: str = "tokens"
) -> npt.NDArray[np.int32]:
    """Returns ``tokens`` as a contiguous 1-D int32 array of ids in ``[0, vocab_size)``.

    Accepts any integer NumPy array or a sequence of ints. Raises ``ValueError``
    naming the bad dtype, shape or value (and its index), so callers can pass
    the message straight to their own users.
    """
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
    if arr.size:
        lo = int(arr.min())
        hi = int(arr.max())
        if lo < 0 or hi >= vocab_size:
            bad_index = int(np.argmax((arr < 0) | (arr >= vocab_size)))
            raise ValueError(
                f"{what}: token id {int(arr[bad_index])} at index {bad_index} is outside "
                f"[0, {vocab_size})"
            )
    return np.ascontiguousarray(arr, dtype=np.int32)
