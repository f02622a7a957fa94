"""Streaming reader of token records in ``.jsonl`` / ``.jsonl.gz`` files.

Each non-blank line is one JSON object; the fields the caller asks for must be
lists of token ids in ``[0, vocab_size)``. Every problem is reported as a
:class:`DataError` naming the file, the line and the field.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from drafter_service.corpus.record_checks import parse_json_line, token_id_array

LLAMA3_VOCAB_SIZE = 128256
"""Vocabulary of the Llama-3 family tokenizer (the development data)."""

_EMPTY = np.zeros(0, dtype=np.int32)


class DataError(ValueError):
    """A record file is unreadable or malformed; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Record:
    """One replayable generation: the prompt and the model's output, as int32 ids."""

    id: str
    prompt_ids: npt.NDArray[np.int32]
    output_ids: npt.NDArray[np.int32]


def _open_text(path: Path) -> IO[str]:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _token_field(
    obj: dict[str, object], name: str, vocab_size: int, where: str
) -> npt.NDArray[np.int32]:
    if name not in obj:
        raise DataError(f"{where}: missing field {name!r}")
    return token_id_array(obj[name], name, where, vocab_size, DataError)


def iter_records(
    path: str | Path,
    *,
    fields: Sequence[str] = ("prompt_ids", "output_ids"),
    vocab_size: int = LLAMA3_VOCAB_SIZE,
    limit: int | None = None,
) -> Iterator[Record]:
    """Yields the records of ``path`` one at a time (gzip is detected by content).

    Only ``fields`` are required and validated; a field not asked for is left
    empty in the record. ``id`` defaults to ``"<file stem>:<line>"``.
    Raises :class:`DataError` for an unreadable file, a line that is not a JSON
    object, or a missing / malformed field.
    """
    p = Path(path)
    if limit is not None and limit <= 0:
        return
    try:
        stream = _open_text(p)
    except OSError as exc:
        raise DataError(f"{p}: cannot open: {exc.strerror or exc}") from None
    count = 0
    with stream:
        lineno = 0
        while True:
            lineno += 1
            where = f"{p}:{lineno}"
            try:
                line = stream.readline()
            except (OSError, EOFError, zlib.error) as exc:
                raise DataError(f"{where}: cannot read: {exc}") from None
            except UnicodeDecodeError as exc:
                raise DataError(f"{where}: not UTF-8 text: {exc.reason}") from None
            if not line:
                return
            if not line.strip():
                continue
            obj = parse_json_line(line, where, lineno, DataError)
            if not isinstance(obj, dict):
                raise DataError(f"{where}: line {lineno} is not a JSON object")
            arrays = {name: _token_field(obj, name, vocab_size, where) for name in fields}
            rid = obj.get("id")
            yield Record(
                id=str(rid) if rid is not None else f"{p.stem}:{lineno}",
                prompt_ids=arrays.get("prompt_ids", _EMPTY),
                output_ids=arrays.get("output_ids", _EMPTY),
            )
            count += 1
            if limit is not None and count >= limit:
                return


def read_records(
    path: str | Path, *, vocab_size: int = LLAMA3_VOCAB_SIZE, limit: int | None = None
) -> list[Record]:
    """All records of ``path`` (both ``prompt_ids`` and ``output_ids`` required)."""
    return list(iter_records(path, vocab_size=vocab_size, limit=limit))


def iter_documents(
    path: str | Path, *, vocab_size: int = LLAMA3_VOCAB_SIZE
) -> Iterator[npt.NDArray[np.int32]]:
    """The ``output_ids`` of every record of ``path``: one datastore document each."""
    for record in iter_records(path, fields=("output_ids",), vocab_size=vocab_size):
        yield record.output_ids


def data_name(path: str | Path) -> str:
    """File stem without ``.jsonl`` / ``.jsonl.gz`` (the ``data`` key of a report)."""
    name = Path(path).name
    for suffix in (".jsonl.gz", ".json.gz", ".gz", ".jsonl", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
