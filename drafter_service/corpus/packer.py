"""Packing documents into sub-indices of bounded size, built in the background.

Documents are never split (one over the limit alone is an error naming it). Each closed
sub-index is built (SA-IS, without the GIL) on a worker thread, one at a time, so memory
stays bounded by the finished sub-indices, the one being built and the one being filled.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from drafter_service.corpus.build_errors import BuildError
from drafter_service.corpus.chunks import Chunk
from drafter_service.datastore.sub_indices import MAX_SUB_INDEX_TOKENS, SubIndex


class SubIndexPacker:
    """Accepts chunks in order; :meth:`finish` returns the built sub-indices, oldest first."""

    def __init__(self, limit: int, vocab_size: int) -> None:
        if not 1 <= limit <= MAX_SUB_INDEX_TOKENS:
            raise BuildError(
                f"--max-sub-index-tokens {limit} is outside [1, {MAX_SUB_INDEX_TOKENS}]"
            )
        self.limit = limit
        self.vocab_size = vocab_size
        self.documents: list[int] = []  # documents of each closed sub-index
        self._parts: list[npt.NDArray[np.int32]] = []
        self._size = 0  # positions held, counting a separator after the last document
        self._docs = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sa-build")
        self._futures: list[Future[SubIndex]] = []

    def add(self, chunk: Chunk) -> None:
        """Appends the chunk's documents, closing sub-indices as they fill up."""
        ends = chunk.ends
        start = 0
        while start < len(ends):
            base = int(ends[start - 1]) if start else 0
            # Documents [start, stop) fit if the text (without its final separator) does.
            stop = int(np.searchsorted(ends, self.limit + 1 - self._size + base, side="right"))
            if stop <= start:
                if self._docs == 0:
                    length = int(ends[start]) - base - 1
                    raise BuildError(
                        f"{chunk.wheres[start]}: the document has {length:,} tokens, more than "
                        f"--max-sub-index-tokens {self.limit:,}; documents are never split"
                    )
                self._close()
                continue
            self._parts.append(chunk.tokens[base : int(ends[stop - 1])])
            self._size += int(ends[stop - 1]) - base
            self._docs += stop - start
            start = stop
            if start < len(ends):
                self._close()

    def finish(self) -> list[SubIndex]:
        """Closes the last sub-index and waits for every build."""
        if self._docs:
            self._close()
        try:
            return [f.result() for f in self._futures]
        finally:
            self._executor.shutdown(wait=True)

    def abort(self) -> None:
        """Drops pending work (after an error elsewhere)."""
        self._parts.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _close(self) -> None:
        parts, self._parts = self._parts, []
        text = parts[0] if len(parts) == 1 else np.concatenate(parts)
        del parts
        text = text[:-1]  # no separator after the last document
        self.documents.append(self._docs)
        self._size = self._docs = 0
        if self._futures:
            self._futures[-1].result()  # one build at a time bounds memory
        self._futures.append(self._executor.submit(SubIndex.from_text, text, self.vocab_size))
