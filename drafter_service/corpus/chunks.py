"""Tokenization of document batches into flat int32 chunks: each document's ids followed
by ``SEPARATOR``; documents with no tokens are dropped (never two separators in a row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.corpus.batching import Batch
from drafter_service.corpus.build_errors import BuildError
from drafter_service.datastore.sub_indices import SEPARATOR

_SEP = np.array([SEPARATOR], dtype=np.int32)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Documents of one batch, each followed by a separator."""

    tokens: npt.NDArray[np.int32]
    ends: npt.NDArray[np.int64]  # offset just past each document's separator
    wheres: list[str]  # file and line of each document
    empty: int  # documents of the batch dropped because they had no tokens
    consumed: int  # input bytes read since the previous batch

    @property
    def num_documents(self) -> int:
        return len(self.ends)

    @property
    def num_tokens(self) -> int:
        """Token ids, separators excluded."""
        return len(self.tokens) - len(self.ends)


class TextTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local ``tokenizer.json``."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer  # deferred: token-id inputs do not need it

        if not path.is_file():
            raise BuildError(f"{path}: no such tokenizer file (expected a tokenizer.json)")
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception
            raise BuildError(f"{path}: not a valid tokenizer.json: {exc}") from None
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
        # encode_batch_fast (tokenizers >= 0.20) gives the same ids without char offsets.
        self._encode_batch = getattr(
            self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch
        )

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, no special tokens added; the Rust side runs the
        batch on all cores without the GIL."""
        return [e.ids for e in self._encode_batch(texts, add_special_tokens=False)]


def make_chunk(batch: Batch, tokenizer: TextTokenizer | None, vocab_size: int) -> Chunk:
    """Tokenizes ``batch`` (unless it holds token ids), joins each document's parts and
    lays the documents out with a separator after each; checks ids against ``vocab_size``."""
    parts: Sequence[Sequence[int] | npt.NDArray[np.int32]] = batch.parts
    if not batch.ids:
        assert tokenizer is not None  # pipeline._tokenizer ensures it for text inputs
        parts = tokenizer.encode(batch.parts)
    parts_per_doc, wheres = batch.parts_per_doc, batch.wheres
    pieces: list[npt.NDArray[np.int32] | Sequence[int]] = []
    lengths: list[int] = []
    kept: list[str] = []
    empty = 0
    for d, where in enumerate(wheres):
        doc = parts[d * parts_per_doc : (d + 1) * parts_per_doc]
        n = sum(len(p) for p in doc)
        if n == 0:
            empty += 1
            continue
        pieces.extend(doc)
        pieces.append(_SEP)
        lengths.append(n + 1)
        kept.append(where)
    if not pieces:
        return Chunk(np.zeros(0, np.int32), np.zeros(0, np.int64), [], empty, batch.consumed)
    tokens = np.concatenate([np.asarray(p, dtype=np.int32) for p in pieces])
    ends = np.cumsum(np.array(lengths, dtype=np.int64))
    if int(tokens.max()) >= vocab_size:
        i = int(np.argmax(tokens >= vocab_size))
        bad = int(np.searchsorted(ends, i, side="right"))
        raise BuildError(
            f"{kept[bad]}: token id {int(tokens[i])} is outside [0, {vocab_size}) "
            "(--vocab-size is smaller than the tokenizer's vocabulary)"
        )
    return Chunk(tokens, ends, kept, empty, batch.consumed)
