"""Prompt files (JSONL, gzipped or not), read by the reference worker and the engine
comparison alike."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

__all__ = ["read_prompts"]


def read_prompts(
    path: str | Path, *, vocab_size: int = 2**31, limit: int | None = None
) -> list[tuple[str, list[int]]]:
    """The first ``limit`` prompts (all when None) of a JSONL(.gz) file as (request id, token
    ids): each line a JSON list of ids in [0, vocab_size), or an object with ``prompt_ids``
    (the dev data format of ``../shared/data``) and optionally ``id``, the request's name.
    Errors name the file and line."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"prompt file {str(path)!r} does not exist")
    with open(file, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    prompts: list[tuple[str, list[int]]] = []
    opener = gzip.open if gzipped else open
    with opener(file, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if limit is not None and len(prompts) >= limit:
                break
            if not line.strip():
                continue
            where = f"{file}:{number}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not JSON ({err.msg})") from None
            request_id = f"{file.name}:{number}"
            if isinstance(value, dict):
                request_id = str(value.get("id", request_id))
                value = value.get("prompt_ids")
            prompts.append((request_id, _token_ids(value, vocab_size, where)))
    return prompts


def _token_ids(value: object, vocab_size: int, where: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: expected a non-empty list of token ids (or an object with "
                         f"'prompt_ids'), got {type(value).__name__}")  # fmt: skip
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise ValueError(f"{where}: token {token!r} at index {i} is not an id in "
                             f"[0, {vocab_size})")  # fmt: skip
    return value
