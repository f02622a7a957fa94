"""Prompts for the reference worker: JSONL(.gz) lines, each a JSON list of token ids or an
object with ``prompt_ids`` (the dev data format of ``../shared/data``) and optionally ``id``,
the request's name. Errors name the file and line."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Prompt", "read_prompts"]


@dataclass(frozen=True, slots=True)
class Prompt:
    request_id: str
    prompt_ids: list[int]


def read_prompts(path: str | Path, *, vocab_size: int, limit: int | None = None) -> list[Prompt]:
    """The first ``limit`` prompts of ``path`` (all when None); ids must lie in [0, vocab_size)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"prompt file {str(path)!r} does not exist")
    with open(file, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    prompts: list[Prompt] = []
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
            prompts.append(Prompt(request_id, _token_ids(value, vocab_size, where)))
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
