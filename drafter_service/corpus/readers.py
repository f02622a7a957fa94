"""Streaming readers of the input files: JSONL(.gz), Parquet and plain text.

Every reader yields ``(where, record)`` pairs: ``where`` names the file and line (or
Parquet row) for error messages, ``record`` maps field names to values. Memory stays
bounded by one record, one Parquet record batch or one whole text file; input bytes
consumed are reported through ``advance`` (progress against the file size).
"""

from __future__ import annotations

import gzip
import itertools
import os
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from drafter_service.corpus.build_errors import BuildError
from drafter_service.corpus.record_checks import parse_json_line

Format = Literal["jsonl", "parquet", "text"]
TextSplit = Literal["document", "blank-line", "line"]
Advance = Callable[[int], None]
"""Called with the number of input bytes consumed since the previous call."""

FORMATS: tuple[Format, ...] = ("jsonl", "parquet", "text")
TEXT_SPLITS: tuple[TextSplit, ...] = ("document", "blank-line", "line")
TEXT_KEY = "text"
"""Field name of the records that plain-text files yield."""

_SUFFIXES: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
}
_PROGRESS_EVERY = 512  # records between two progress reports
_PARQUET_BATCH_ROWS = 2048
_READ_ERRORS = (OSError, EOFError, zlib.error)


def detect_format(path: Path) -> Format:
    """The format named by the file's extension (``.gz`` is looked through)."""
    name = path.name.lower().removesuffix(".gz")
    fmt = _SUFFIXES.get(Path(name).suffix)
    if fmt is None:
        known = ", ".join(sorted(_SUFFIXES))
        raise BuildError(
            f"{path}: cannot tell the format from the extension (known: {known}, each "
            f"optionally .gz); name it with --format {'|'.join(FORMATS)}"
        )
    if fmt == "parquet" and path.name.lower().endswith(".gz"):
        raise BuildError(f"{path}: gzip-compressed Parquet is not supported; decompress it")
    return fmt


def input_size(path: Path) -> int:
    """Size in bytes of a readable input file; refuses missing and unreadable ones."""
    try:
        st = path.stat()
        if not path.is_file():
            raise BuildError(f"{path}: not a regular file")
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise BuildError(f"{path}: no such input file") from None
    except OSError as exc:
        raise BuildError(f"{path}: cannot open: {exc.strerror or exc}") from None
    return st.st_size


def _iter_lines(path: Path, advance: Advance) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of a possibly gzipped file, reporting progress (the raw
    file's position is the number of input bytes consumed)."""
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise BuildError(f"{path}: cannot open: {exc.strerror or exc}") from None
    gzipped = raw.peek(2)[:2] == b"\x1f\x8b"
    stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
    with raw, stream:
        lineno = 0
        reported = 0
        while True:
            try:
                line = stream.readline()
            except _READ_ERRORS as exc:
                raise BuildError(f"{path}:{lineno + 1}: cannot read: {exc}") from None
            if not line:
                break
            lineno += 1
            yield lineno, line
            if lineno % _PROGRESS_EVERY == 0:
                pos = raw.tell()
                advance(pos - reported)
                reported = pos
        advance(os.fstat(raw.fileno()).st_size - reported)


def iter_jsonl(path: Path, advance: Advance) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """One JSON object per non-blank line."""
    for lineno, line in _iter_lines(path, advance):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = parse_json_line(line, where, lineno, BuildError)
        except UnicodeDecodeError as exc:
            raise BuildError(f"{where}: line {lineno} is not UTF-8 text: {exc.reason}") from None
        if not isinstance(obj, dict):
            raise BuildError(
                f"{where}: line {lineno} is a JSON {type(obj).__name__}, not an object"
            )
        yield where, obj


def iter_parquet(
    path: Path, columns: Sequence[str], advance: Advance
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Rows of ``columns``, read one record batch at a time."""
    import pyarrow.parquet as pq  # deferred: only Parquet inputs need pyarrow

    try:
        pf = pq.ParquetFile(str(path))
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
        raise BuildError(f"{path}: not a readable Parquet file: {exc}") from None
    names = list(pf.schema_arrow.names)
    for column in columns:
        if column not in names:
            raise BuildError(
                f"{path}: Parquet file has no column {column!r} "
                f"(its columns: {', '.join(map(repr, names)) or 'none'})"
            )
    size, total_rows = os.path.getsize(path), max(1, pf.metadata.num_rows)
    row, reported = 0, 0
    try:
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=list(columns)):
            values = [batch.column(i).to_pylist() for i in range(len(columns))]
            for i in range(batch.num_rows):
                row += 1
                yield f"{path}: row {row}", {c: v[i] for c, v in zip(columns, values, strict=True)}
            done = size * row // total_rows
            advance(done - reported)
            reported = done
    except Exception as exc:  # pyarrow's errors; nothing in the loop raises BuildError
        raise BuildError(f"{path}: cannot read Parquet row group after row {row}: {exc}") from None
    advance(size - reported)


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        at = f" at line {line} of the document" if b"\n" in data.rstrip(b"\r\n") else ""
        raise BuildError(f"{where}: not UTF-8 text ({exc.reason}{at})") from None


def iter_text(
    path: Path, split: TextSplit, advance: Advance
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Plain text: the whole file as one document, or one per paragraph / line."""
    lines = _iter_lines(path, advance)
    if split == "document":
        yield str(path), {TEXT_KEY: _decode(b"".join(line for _, line in lines), str(path))}
        return
    if split == "line":
        documents: Iterator[list[tuple[int, bytes]]] = ([n] for n in lines if n[1].strip())
    else:  # runs of non-blank lines
        runs = itertools.groupby(lines, key=lambda n: bool(n[1].strip()))
        documents = (list(run) for text, run in runs if text)
    for document in documents:
        where = f"{path}:{document[0][0]}"
        data = b"".join(line for _, line in document).rstrip(b"\r\n")
        yield where, {TEXT_KEY: _decode(data, where)}


def iter_records(
    path: Path, fmt: Format, columns: Sequence[str], split: TextSplit, advance: Advance
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The records of one input file in format ``fmt``."""
    if fmt == "jsonl":
        return iter_jsonl(path, advance)
    if fmt == "parquet":
        return iter_parquet(path, columns, advance)
    return iter_text(path, split, advance)
