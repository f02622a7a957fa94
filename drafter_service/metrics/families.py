"""Every metric family of a scrape, built from a copy of what the serving path recorded
(``Recorded``) and from the service's state (``state_families``), without holding the
collector's lock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from drafter_service.engine.catalog import Catalog, DatastoreStats
from drafter_service.engine.ingest_queue import GenerationIngester
from drafter_service.engine.request_table import RequestTable
from drafter_service.live.live_stats import LiveStats
from drafter_service.metrics.histograms import Buckets, SizeCounts

PREFIX = "sssd_drafter_"


@dataclass(slots=True)
class DatastoreCounts:
    requests: int  # drafted, one per request per step
    trees: int  # non-empty trees
    tree_nodes: SizeCounts
    request_seconds: Buckets


@dataclass(frozen=True, slots=True)
class Recorded:
    """The numbers recorded while serving (under the collector's lock; a scrape copies them)."""

    batch_seconds: dict[str, Buckets]
    batch_requests: dict[str, Buckets]
    datastores: dict[str, DatastoreCounts]
    resyncs: dict[str, int]
    errors: dict[tuple[str, str], int]
    rebuilds: dict[str, Buckets]


def family(
    kind: type[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily],
    name: str,
    documentation: str,
    label: str,
    series: Mapping[str, Any],
) -> Metric:
    """A family with one series per ``label`` value: a number, or a histogram's buckets."""
    family = kind(PREFIX + name, documentation, labels=[label])
    for value, number in series.items():
        if isinstance(family, HistogramMetricFamily):
            family.add_metric([value], *number.sample())
        else:
            family.add_metric([value], number)
    return family


counter = partial(family, CounterMetricFamily)
gauge = partial(family, GaugeMetricFamily)
histogram = partial(family, HistogramMetricFamily)
_Family = Callable[[str, str, str, Mapping[str, Any]], Metric]  # counter, gauge, histogram


def by_datastore(
    make: _Family, name: str, documentation: str, stats: Mapping[str, Any], attribute: str
) -> Metric:
    """A family with one series per datastore: ``attribute`` of that datastore's ``stats``."""
    series = {datastore: getattr(s, attribute) for datastore, s in stats.items()}
    return make(name, documentation, "datastore", series)


# Per-datastore families, (counter, gauge or histogram; name; help; attribute): recorded
# while serving (of ``DatastoreCounts``), then read at a scrape from every datastore's
# stats, the live ones' and those with a shared log.
_RECORDED: tuple[tuple[_Family, str, str, str], ...] = (
    (
        histogram,
        "request_duration_seconds",
        "Drafting time per request (the native batch job's time divided by its requests).",
        "request_seconds",
    ),
    (counter, "requests", "Requests drafted (one per request per step).", "requests"),
    (counter, "trees", "Non-empty trees served.", "trees"),
    (histogram, "tree_nodes", "Draft nodes per tree served (empty trees included).", "tree_nodes"),
)
_DATASTORE_STATE: tuple[tuple[_Family, str, str, str], ...] = (
    (gauge, "datastore_tokens", "Tokens indexed.", "num_tokens"),
    (
        gauge,
        "datastore_resident_bytes",
        "Bytes of the datastore's arrays (accounted).",
        "resident_bytes",
    ),
    (gauge, "datastore_sub_indices", "Sub-indices.", "sub_indices"),
)
_LIVE_STATE: tuple[tuple[_Family, str, str, str], ...] = (
    (counter, "ingested_tokens", "Tokens ingested (durable).", "ingested_tokens"),
    (counter, "ingested_sequences", "Sequences ingested.", "ingested_sequences"),
    (gauge, "wal_bytes", "Ingest-log bytes not yet covered by a snapshot.", "wal_bytes"),
)
_SHARED_LOG_STATE: tuple[tuple[_Family, str, str, str], ...] = (
    (
        counter,
        "shared_log_skipped_entries",
        "Shared-log entries no replica can store (another format, bad checksum or ids).",
        "stream_skipped",
    ),
    (
        counter,
        "shared_log_errors",
        "Failed reads of the shared log server or writes of taken entries (retried).",
        "stream_errors",
    ),
    (
        counter,
        "shared_log_lost",
        "Times shared-log entries were found trimmed by retention before they were taken.",
        "stream_lost",
    ),
    (
        gauge,
        "shared_log_delay_seconds",
        "Seconds from the newest taken entry's append (log server clock) to its being taken.",
        "stream_delay_s",
    ),
)


def recorded_families(r: Recorded) -> Iterator[Metric]:
    yield histogram(
        "batch_duration_seconds",
        "One decode step's batch in the server: request received to response ready.",
        "method",
        r.batch_seconds,
    )
    yield histogram("batch_requests", "Requests per batch.", "method", r.batch_requests)
    for make, name, documentation, attribute in _RECORDED:
        yield by_datastore(make, name, documentation, r.datastores, attribute)
    yield counter("resyncs", "RESYNC answers.", "reason", r.resyncs)
    errors = CounterMetricFamily(
        PREFIX + "rpc_errors", "Calls that failed.", labels=["method", "code"]
    )
    for (method, code), value in r.errors.items():
        errors.add_metric([method, code], value)
    yield errors
    yield by_datastore(counter, "rebuilds", "Background rebuilds finished.", r.rebuilds, "count")
    yield histogram("rebuild_duration_seconds", "Background rebuild time.", "datastore", r.rebuilds)


def state_families(
    catalog: Catalog,
    table: RequestTable,
    ingester: GenerationIngester,
    version: str,
    started_unix: float,
) -> Iterator[Metric]:
    """What is read from the service's state at a scrape; the ingest, snapshot and log
    series exist for live datastores."""
    stores: dict[str, LiveStats | DatastoreStats] = {}
    held: dict[str, int] = {}
    for name, slot in catalog.slots.items():
        stores[name] = slot.live.stats() if slot.live is not None else slot.stats()
        held[name] = slot.drafter.held[1]  # 0 with the tier off
    gauges = (
        ("active_requests", "Request states held.", len(table)),
        (
            "request_state_bytes",
            "Memory the request states hold: measured by the drafter after each call, plus "
            "a bound on what queued calls may add.",
            table.bytes,
        ),
        ("request_state_budget_bytes", "Bound on request_state_bytes.", table.max_bytes),
        ("ingest_queue_depth", "Finished generations waiting for ingestion.", ingester.depth),
    )
    for name, documentation, value in gauges:
        yield GaugeMetricFamily(PREFIX + name, documentation, value=value)
    yield counter(
        "request_states_evicted",
        "Request states dropped before their request finished, by the bound that "
        "dropped them (their client resends the context: RESYNC).",
        "reason",
        dict(table.evicted),
    )
    dropped = {
        "queue_full": ingester.dropped,
        "datastore_full": ingester.refused_full,
        "error": ingester.failed,
    }
    yield counter("ingest_dropped", "Finished generations not ingested.", "reason", dropped)
    info = GaugeMetricFamily(
        PREFIX + "info",
        "Build and tokenizer identity (=1).",
        labels=["version", "tokenizer_fingerprint"],
    )
    info.add_metric([version, catalog.tokenizer.fingerprint], 1)
    yield info
    live = {name: s for name, s in stores.items() if isinstance(s, LiveStats)}
    shared = {name: s for name, s in live.items() if s.shared_log}
    for states, stats in ((_DATASTORE_STATE, stores), (_LIVE_STATE, live)):
        for make, name, documentation, attribute in states:
            yield by_datastore(make, name, documentation, stats, attribute)
    for make, name, documentation, attribute in _SHARED_LOG_STATE if shared else ():
        yield by_datastore(make, name, documentation, shared, attribute)
    now = time.time()
    yield gauge(
        "snapshot_age_seconds",
        "Seconds since the newest snapshot was written (since start when none).",
        "datastore",
        {
            n: now - (started_unix if s.last_snapshot_unix is None else s.last_snapshot_unix)
            for n, s in live.items()
        },
    )
    yield gauge(
        "recent_held_tokens",
        "Tokens of stored generations the recent tier drafts from until a rebuild folds "
        "them in (at most the recent_held_tokens setting).",
        "datastore",
        held,
    )
