"""Records from all inputs grouped into batches of documents, produced ahead of the
consumer on a thread (:func:`prefetch`): reading, JSON parsing and chat rendering hold the
GIL, tokenization and suffix-array builds do not, so the two overlap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from drafter_service.corpus.readers import TEXT_KEY, Format, TextSplit, iter_records
from drafter_service.corpus.records import RecordSpec, Renderer, id_parts, text_parts

T = TypeVar("T")
_PLAIN_TEXT = RecordSpec(kind="text", text_field=TEXT_KEY)


@dataclass(slots=True)
class InputFile:
    """One input and what was read from it."""

    path: Path
    format: Format
    bytes: int  # on disk
    records: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    """Documents, each ``parts_per_doc`` consecutive ``parts``: texts to tokenize, or
    token-id arrays (``ids``)."""

    parts: list[Any]
    ids: bool
    parts_per_doc: int
    wheres: list[str]
    consumed: int  # input bytes read since the previous batch


def iter_batches(
    inputs: list[InputFile],
    spec: RecordSpec,
    text_split: TextSplit,
    render: Renderer | None,
    vocab_size: int,
    *,
    batch_docs: int,
    batch_chars: int = 32 << 20,
) -> Generator[Batch, None, None]:
    """Batches of at most ``batch_docs`` documents (and about ``batch_chars`` characters
    of text), in input order. A batch never mixes parts-per-document shapes."""
    parts: list[Any] = []  # texts, or token-id arrays (a batch holds one kind)
    wheres: list[str] = []
    size = 0
    consumed = 0
    shape = (False, 0)  # (token ids?, parts per document) of the batch being filled

    def advance(n: int) -> None:
        nonlocal consumed
        consumed += n

    def flush() -> Batch:
        nonlocal parts, wheres, size, consumed
        batch = Batch(parts, shape[0], shape[1], wheres, consumed)
        parts, wheres, size, consumed = [], [], 0, 0
        return batch

    for item in inputs:
        file_spec = _PLAIN_TEXT if item.format == "text" else spec
        file_shape = (file_spec.kind == "token-ids", len(file_spec.fields))
        if file_shape != shape and wheres:
            yield flush()
        shape = file_shape
        records = iter_records(item.path, item.format, file_spec.fields, text_split, advance)
        for where, record in records:
            item.records += 1
            if shape[0]:
                new: list[Any] = id_parts(file_spec, record, where, vocab_size)
            else:
                new = text_parts(file_spec, record, where, render)
            parts.extend(new)
            size += sum(len(p) for p in new)
            wheres.append(where)
            if len(wheres) >= batch_docs or size >= batch_chars:
                yield flush()
    if wheres or consumed:
        yield flush()


_DONE = object()


def prefetch(items: Generator[T, None, None], depth: int = 2) -> Generator[T, None, None]:
    """Yields ``items`` produced on a background thread, at most ``depth`` ahead.

    An exception in the producer is re-raised in the consumer; when the consumer
    stops early (or fails), the producer is stopped (its step in progress finished).
    """
    # One worker advances ``items``: a generator never runs on two threads at once.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="builder-reader")
    ahead = deque(pool.submit(next, items, _DONE) for _ in range(depth))
    try:
        while (value := ahead.popleft().result()) is not _DONE:
            ahead.append(pool.submit(next, items, _DONE))
            yield cast(T, value)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        items.close()  # stops a chained prefetch's thread too
