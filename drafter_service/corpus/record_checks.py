"""Checks of one JSON-lines record shared by the corpus readers and drafter-bench's record
reader, so both name a bad line or token-id field alike: each raises the caller's ``error``
type, its message starting with ``where`` (file and line).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.tokens import as_token_array


def parse_json_line(line: str | bytes, where: str, lineno: int, error: type[ValueError]) -> Any:
    """The JSON value on line ``lineno``; ``error`` saying why when it is not valid JSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: bad JSON on line {lineno}: {exc.msg} (column {exc.colno})") from None


def token_id_array(
    value: Any, name: str, where: str, vocab_size: int, error: type[ValueError]
) -> npt.NDArray[np.int32]:
    """The value of field ``name`` as int32 token ids in ``[0, vocab_size)``.

    ``value`` is a list (JSON), tuple or array (Parquet) of ints; ``error`` names the field
    and the first bad value (its index, for an id out of range) otherwise.
    """
    if not isinstance(value, list | tuple | np.ndarray):
        raise error(
            f"{where}: field {name!r} must be a list of token ids, got {type(value).__name__}"
        )
    if len(value) == 0:
        return np.zeros(0, dtype=np.int32)
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):  # ragged, or ints beyond int64
        arr = np.zeros((0, 0))
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        bad = next((v for v in value if isinstance(v, bool) or not isinstance(v, int)), None)
        what = f"holds a non-integer value {bad!r:.40}" if bad is not None else "is too large"
        raise error(f"{where}: field {name!r} must be a flat list of token ids; it {what}")
    try:
        return as_token_array(arr, vocab_size, what=f"{where}: field {name!r}")
    except ValueError as exc:  # an id out of range, named with its index
        raise error(str(exc)) from None
