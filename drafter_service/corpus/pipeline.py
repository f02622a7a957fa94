"""The build: inputs -> batches -> token chunks -> sub-indices -> one snapshot.

Memory stays bounded by the datastore's int32 token arrays plus a few batches: a reader
thread parses ahead, two batches at a time are tokenized (without the GIL, on every core),
the main thread packs their ids and a worker builds suffix arrays as sub-indices fill up.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from drafter_service.corpus.batching import Batch, InputFile, iter_batches, prefetch
from drafter_service.corpus.build_errors import BuildError
from drafter_service.corpus.chunks import Chunk, TextTokenizer, make_chunk
from drafter_service.corpus.packer import SubIndexPacker
from drafter_service.corpus.readers import Format, TextSplit, detect_format, input_size
from drafter_service.corpus.records import RecordSpec
from drafter_service.datastore.sub_indices import Datastore
from drafter_service.snapshot.store import SnapshotInfo, TokenizerIdentity, write_snapshot

if TYPE_CHECKING:
    from drafter_service.corpus.chat import ChatTemplate

DEFAULT_MAX_SUB_INDEX_TOKENS = 512_000_000
DEFAULT_BATCH_DOCS = 1000


@dataclass(frozen=True, slots=True)
class BuildConfig:
    """Everything one build needs (the command line's options, checked by its parser)."""

    inputs: list[Path]
    output: Path
    spec: RecordSpec = field(default_factory=RecordSpec)
    format: Format | None = None  # None: from each file's extension
    text_split: TextSplit = "document"
    tokenizer: Path | None = None  # tokenizer.json; needed unless spec.kind == "token-ids"
    tokenizer_config: Path | None = None  # default: tokenizer_config.json beside tokenizer
    chat_template: Path | None = None
    tokenizer_name: str | None = None
    vocab_size: int | None = None  # default: the tokenizer's, added tokens included
    max_sub_index_tokens: int = DEFAULT_MAX_SUB_INDEX_TOKENS
    batch_docs: int = DEFAULT_BATCH_DOCS
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class BuildReport:
    """What a build wrote and how fast."""

    info: SnapshotInfo
    records: int
    documents: int
    empty_documents: int
    tokens: int  # token ids, separators excluded
    seconds: float


def build(config: BuildConfig) -> BuildReport:
    """Runs one build; raises :class:`BuildError` naming the file, line or field at fault
    (``SnapshotError`` for the tokenizer identity and the snapshot written)."""
    start = time.perf_counter()
    _check_output(config.output)
    inputs = [
        InputFile(path, config.format or detect_format(path), input_size(path))
        for path in config.inputs
    ]
    for item in inputs:
        if item.format == "text" and config.spec.kind == "token-ids":
            raise BuildError(
                f"{item.path}: a plain-text input cannot hold token ids "
                "(--records token-ids needs JSONL or Parquet inputs)"
            )
    tokenizer, identity, vocab_size = _tokenizer(config)
    template = None
    if config.spec.kind == "chat" and any(i.format != "text" for i in inputs):
        from drafter_service.corpus.chat import ChatTemplate  # deferred: only chat needs jinja2

        beside = config.tokenizer.parent / "tokenizer_config.json" if config.tokenizer else None
        template = ChatTemplate.load(config.tokenizer_config or beside, config.chat_template)

    packer = SubIndexPacker(config.max_sub_index_tokens, vocab_size)
    # Token-id records are read, not tokenized: the bar says which work it measures.
    first_stage = "reading token ids" if config.spec.kind == "token-ids" else "tokenizing"
    # On stderr: input bytes against the total (so tqdm gives an ETA), tokens and tokens/s;
    # silent when quiet (a disabled bar ignores updates).
    bar = tqdm(
        total=sum(i.bytes for i in inputs) or None,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=first_stage,
        file=sys.stderr,
        disable=config.quiet,
        mininterval=0.5,
        dynamic_ncols=True,
    )
    started = time.perf_counter()
    documents = empty = tokens = 0
    try:
        render = template.render if template is not None else None
        batches = iter_batches(
            inputs, config.spec, config.text_split, render, vocab_size, batch_docs=config.batch_docs
        )
        # Stages on their own threads: read/parse -> tokenize (x2) -> pack (+ SA builds).
        for chunk in _chunks(prefetch(batches), tokenizer, vocab_size):
            packer.add(chunk)
            documents += chunk.num_documents
            empty += chunk.empty
            tokens += chunk.num_tokens
            rate = tokens / max(time.perf_counter() - started, 1e-9)
            postfix = f"{tqdm.format_sizeof(tokens)} tok, {tqdm.format_sizeof(rate)} tok/s"
            bar.set_postfix_str(postfix, refresh=False)
            bar.update(chunk.consumed)
        records = sum(i.records for i in inputs)
        if tokens == 0:
            raise BuildError(
                f"empty corpus: {records} records in {len(inputs)} input file(s) gave no "
                f"tokens (fields {', '.join(map(repr, config.spec.fields))})"
            )
        bar.set_description_str("suffix arrays")
        datastore = Datastore(packer.finish(), vocab_size)
        bar.set_description_str("writing")
        meta = _metadata(config, inputs, template, packer.documents, documents, empty, tokens)
        info = write_snapshot(config.output, datastore, identity, metadata=meta)
    except BaseException:
        packer.abort()  # after finish: nothing left to drop
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    return BuildReport(info, records, documents, empty, tokens, seconds)


def _check_output(path: Path) -> None:
    """Refuses, before any work, an output that write_snapshot would refuse at the end."""
    if path.exists() or path.is_symlink():
        raise BuildError(f"{path}: already exists; the builder never overwrites")
    if not path.name or path.name.startswith("."):
        raise BuildError(f"{path}: the snapshot directory name must not be empty or hidden")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"{path}: cannot create its parent directory: {exc}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BuildError(f"{path}: its parent directory {parent} is not writable")


def _chunks(
    batches: Iterator[Batch], tokenizer: TextTokenizer | None, vocab_size: int, workers: int = 2
) -> Iterator[Chunk]:
    """Each batch's documents as a token chunk, in order. ``workers`` batches are
    tokenized at once, so the tokenizer's thread pool always has work queued while a
    finished batch's ids are converted (which needs the GIL)."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenize")
    pending: deque[Future[Chunk]] = deque()
    try:
        for batch in batches:
            pending.append(pool.submit(make_chunk, batch, tokenizer, vocab_size))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _tokenizer(config: BuildConfig) -> tuple[TextTokenizer | None, TokenizerIdentity, int]:
    """The text tokenizer (None for token-id records: build refuses them in text files),
    the identity written to the snapshot, and the vocabulary size."""
    if config.tokenizer is None:
        if config.spec.kind != "token-ids":
            raise BuildError("text records need a tokenizer: give --tokenizer PATH/tokenizer.json")
        if config.vocab_size is None:
            raise BuildError("token-id records without --tokenizer need --vocab-size")
        name = config.tokenizer_name or "unknown"
        return None, TokenizerIdentity(name, config.vocab_size), config.vocab_size
    tokenizer = TextTokenizer(config.tokenizer)
    vocab_size = config.vocab_size or tokenizer.vocab_size
    identity = TokenizerIdentity.from_file(
        config.tokenizer, name=config.tokenizer_name, vocab_size=vocab_size
    )
    return tokenizer, identity, vocab_size


def _metadata(
    config: BuildConfig,
    inputs: list[InputFile],
    template: ChatTemplate | None,
    sub_index_documents: list[int],
    documents: int,
    empty: int,
    tokens: int,
) -> dict[str, object]:
    try:
        version = importlib_metadata.version("sssd-drafter")
    except importlib_metadata.PackageNotFoundError:
        version = "unknown"
    meta: dict[str, object] = {
        "tool": "datastore-builder",
        "tool_version": version,
        "records": config.spec.kind,
        "fields": list(config.spec.fields),
        "inputs": [{**asdict(i), "path": str(i.path.resolve())} for i in inputs],
        "documents": documents,
        "empty_documents_skipped": empty,
        "tokens": tokens,
        "sub_index_documents": sub_index_documents,
        "max_sub_index_tokens": config.max_sub_index_tokens,
        "tokenizer_file": str(config.tokenizer.resolve()) if config.tokenizer else None,
    }
    if config.spec.kind in ("prompt-output", "token-ids"):
        meta["store"] = config.spec.store
    if any(i.format == "text" for i in inputs):
        meta["text_split"] = config.text_split
    if template is not None:
        meta["chat_template"] = {"origin": template.origin, "sha256": template.sha256}
    return meta
