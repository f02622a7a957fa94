"""Stores finished generations in the background, through a bounded queue.

A Finish call only enqueues (O(1), never waits on the disk; a full queue drops and counts
the generation); one thread drains it into the live datastore, resolving each one's
future with whether it is durable (a Finish may wait for that). Failures are counted and
logged rate-limited per kind, since a full disk or a down shared log fails every Finish.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from drafter_service.live.ingestion import VolumeFull
from drafter_service.live.live_datastore import DatastoreFull, LiveDatastore
from drafter_service.live.thread_priority import check_nice, lower_thread_priority
from drafter_service.log_limits import RateLimitedLog
from drafter_service.replication.shared_log import LogError, describe

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Generation:
    live: LiveDatastore
    chunks: list[npt.NDArray[np.int32]]  # the request's tokens, in order
    prompt_length: int  # leading tokens that are the prompt
    stored: Future[bool] = field(default_factory=Future)  # True once durable, False if refused


class GenerationIngester:
    """Bounded queue (``max_queued`` >= 1: the settings check it) + one worker thread.
    Counters of what was not stored are for logs and metrics."""

    def __init__(self, max_queued: int, background_nice: int = 0) -> None:
        self._nice = check_nice(background_nice)
        self._queue: queue.Queue[_Generation | None] = queue.Queue(maxsize=max_queued)
        # Each counter is written by one thread only (dropped: the caller of offer; the
        # others: the worker), so metrics may read them from any thread.
        self.dropped = 0  # queue full
        self.refused_full = 0  # the datastore is at its memory bound
        self.failed = 0  # any other refusal (bad tokens, closed datastore, disk)
        self._closed = False
        self._dropped_log = RateLimitedLog(log)
        self._refused_log = RateLimitedLog(log)  # the datastore full, bad tokens
        self._shared_log_down = RateLimitedLog(log)
        self._failed_log = RateLimitedLog(log)
        self._thread = threading.Thread(target=self._run, name="generation-ingest", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Generations waiting to be stored (approximate while the worker runs)."""
        return self._queue.qsize()

    def offer(
        self, live: LiveDatastore, chunks: list[npt.NDArray[np.int32]], prompt_length: int
    ) -> Future[bool] | None:
        """Queues a generation (prompt then output, as ``chunks``); None if the queue is
        full or closed. Never blocks. The future resolves True once the generation is
        durable, False if it was refused."""
        if self._closed:
            return None
        item = _Generation(live, chunks, prompt_length)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            self._dropped_log.warning(
                "ingest queue full: dropped a finished generation (%d so far)", self.dropped
            )
            return None
        return item.stored

    def close(self) -> None:
        """Stores what is queued, then stops the worker."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        lower_thread_priority(self._nice)
        while (item := self._queue.get()) is not None:
            tokens = np.concatenate(item.chunks)
            p = item.prompt_length
            durable = False
            try:
                item.live.ingest_generation(tokens[:p], tokens[p:])
            except VolumeFull:  # ingestion logged it (one rate-limited line for all)
                self.failed += 1
            except DatastoreFull as exc:
                self.refused_full += 1
                self._refused_log.warning("finished generation not stored: %s", exc)
            except ValueError as exc:
                self.failed += 1
                self._refused_log.warning("finished generation not stored: %s", exc)
            except LogError as exc:
                self.failed += 1
                self._shared_log_down.warning(
                    "finished generation not stored: the shared ingest log did not take it "
                    "(%d not stored so far): %s", self.failed, describe(exc),
                )  # fmt: skip
            except Exception as exc:  # disk or closed datastore: keep draining
                self.failed += 1
                self._failed_log.error("finished generation not stored: %r", exc, error=exc)
            else:
                durable = True  # ingest_generation fsynced the log
            item.stored.set_result(durable)
