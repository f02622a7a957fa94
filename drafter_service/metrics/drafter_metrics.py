"""The drafter's Prometheus metrics (docs/metrics.md, section Drafter): one collector per
server, in that server's own registry. What only the serving path knows (latency, trees,
RESYNCs, errors) is recorded per call under one lock into plain counters and histogram
state: a batch of 64 costs one ``bincount`` for its tree sizes, not 64 ``observe`` calls
(~5 us per batch; drafter_bench/metrics_overhead.py). What is state elsewhere (request
states, datastores, the ingest queue) is read at scrape time: serving pays nothing for it.
"""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from drafter_service.engine.catalog import Catalog
from drafter_service.engine.ingest_queue import GenerationIngester
from drafter_service.engine.request_table import RequestTable
from drafter_service.metrics.families import (
    DatastoreCounts,
    Recorded,
    recorded_families,
    state_families,
)
from drafter_service.metrics.histograms import Buckets, SizeCounts

BATCH_METHODS = ("Draft", "DraftStream")
RPC_METHODS = ("Draft", "DraftStream", "Finish", "Ingest", "GetServiceInfo")
RESYNC_REASONS = ("unknown", "length_mismatch")
# Bucket upper bounds. A decode step's drafting budget is about 1 ms, so batch latency
# is resolved finely below 10 ms; per-request time is that divided by up to ~1000.
BATCH_SECONDS: tuple[float, ...] = (
    *(5e-5, 1e-4, 2e-4, 3e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3),
    *(0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
REQUEST_SECONDS: tuple[float, ...] = (
    *(1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 0.01, 0.1),
)
BATCH_REQUESTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TREE_NODES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)  # le="0": empty trees
REBUILD_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class DrafterMetrics(Collector):
    """Every ``sssd_drafter_*`` metric of one server. Recording methods are called from
    the event loop (``record_rebuild`` from a rebuild thread); ``collect`` from the
    HTTP exporter's threads. One lock guards the recorded numbers."""

    def __init__(self, version: str = "unknown", error_codes: Iterable[str] = ()) -> None:
        self._version = version
        self._started_unix = time.time()
        self._lock = threading.Lock()
        self._recorded = Recorded(
            batch_seconds={m: Buckets(BATCH_SECONDS) for m in BATCH_METHODS},
            batch_requests={m: Buckets(BATCH_REQUESTS) for m in BATCH_METHODS},
            datastores={},
            resyncs=dict.fromkeys(RESYNC_REASONS, 0),
            # At zero from the start, so that rate() and alert rules see a series of each
            # code calls can fail with before the first failure.
            errors={(m, c): 0 for m in RPC_METHODS for c in error_codes},
            rebuilds={},
        )
        # Where scrape-time values are read from; set once the datastores are open.
        self._sources: tuple[Catalog, RequestTable, GenerationIngester] | None = None

    def attach(self, catalog: Catalog, table: RequestTable, ingester: GenerationIngester) -> None:
        """Starts reporting the service's state (once its datastores are open) and
        listens to the live datastores' rebuilds."""
        with self._lock:
            for name, slot in catalog.slots.items():
                self._datastore(name)
                if slot.live is not None:
                    self._recorded.rebuilds.setdefault(name, Buckets(REBUILD_SECONDS))
        for name, slot in catalog.slots.items():
            if slot.live is not None:
                slot.live.add_rebuild_listener(functools.partial(self.record_rebuild, name))
        self._sources = (catalog, table, ingester)

    # -- recording (the serving path) -------------------------------------------------

    def record_call(self, method: str, seconds: float) -> None:
        """A call answered: its latency for the drafting methods, nothing for others."""
        buckets = self._recorded.batch_seconds.get(method)
        if buckets is not None:
            with self._lock:
                buckets.add(seconds)

    def record_batch(self, method: str, requests: int) -> None:
        """A Draft batch of ``requests`` requests (RESYNCs included)."""
        buckets = self._recorded.batch_requests.get(method)
        if buckets is not None:
            with self._lock:
                buckets.add(requests)

    def record_trees(
        self, datastore: str, offsets: npt.NDArray[np.int64], job_seconds: float
    ) -> None:
        """One datastore's native batch (of at least one request): tree ``i`` has
        ``offsets[i + 1] - offsets[i]`` nodes; ``job_seconds``, the job's time, is shared
        equally by its requests."""
        n = len(offsets) - 1
        sizes = offsets[1:] - offsets[:-1]  # cheaper than np.diff
        with self._lock:
            counts = self._datastore(datastore)
            empty = counts.tree_nodes.add_all(sizes, int(offsets[-1] - offsets[0]))
            counts.requests += n
            counts.trees += n - empty
            counts.request_seconds.add(job_seconds / n, n)

    def count_resync(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._recorded.resyncs[reason] += n

    def count_error(self, method: str, code: str) -> None:
        with self._lock:
            errors = self._recorded.errors
            errors[method, code] = errors.get((method, code), 0) + 1

    def record_rebuild(self, datastore: str, seconds: float) -> None:
        with self._lock:
            self._recorded.rebuilds.setdefault(datastore, Buckets(REBUILD_SECONDS)).add(seconds)

    def _datastore(self, name: str) -> DatastoreCounts:  # with the lock held
        counts = self._recorded.datastores.get(name)
        if counts is None:
            counts = DatastoreCounts(0, 0, SizeCounts(TREE_NODES), Buckets(REQUEST_SECONDS))
            self._recorded.datastores[name] = counts
        return counts

    # -- scraping ---------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:  # a copy: the families are built without holding the lock
            recorded = copy.deepcopy(self._recorded)
        yield from recorded_families(recorded)
        if self._sources is not None:  # read at scrape time, once attached
            yield from state_families(*self._sources, self._version, self._started_unix)
