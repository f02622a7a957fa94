"""How soon the live datastore drafts from a generation it has just stored.

A finished generation is searchable after the next background rebuild. Rebuilds run
once ``rebuild_min_tokens`` wait, at least every ``rebuild_interval_s`` (60 s), and,
with ``rebuild_max_share``, sooner while the rebuild is cheap. For live datastores of
several sizes (random documents; the rebuild re-sorts the newest sub-index, so its cost
grows with it), this stores one generation with the default policy and times how long
until the datastore holds it. Prints one JSON line per size: seconds until searchable,
the rebuild's own seconds, and its share of the time since the rebuild before it.

With the recent tier (docs/algorithm.md, "The recent tier"), a second line per size: a
drafter (``recent_samples=16``) holding a request whose context ends inside the
generation is attached to the live datastore (``unfolded``), the generation is stored,
and the request's very next draft (budget 16, the shipped node score) is checked against
the generation's continuation: the tokens greedy verification would accept from it, with
the tier and without it (the same datastore), the rebuilds that ran in between (0), and
the time from the ingest call (fsynced) to that draft.

    python -m drafter_bench.live_freshness --tokens 0,1000000,4000000,16000000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from drafter_bench.acceptance import accepted_length
from drafter_service.datastore.sub_indices import Datastore
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import Drafter, DraftTree
from drafter_service.drafting.node_score import default_node_score
from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.snapshot.store import TokenizerIdentity

VOCAB = 128256
TOKENIZER = TokenizerIdentity(name="bench", vocab_size=VOCAB, fingerprint="")
BUDGET = 16


def holds(store: LiveDatastore, tokens: np.ndarray) -> bool:
    ranges = (s.find_range(tokens) for s in store.datastore.sub_indices)
    return any(end > begin for begin, end in ranges)


def measure(
    directory: Path, tokens: int, policy: LivePolicy, timeout_s: float
) -> dict[str, object]:
    rng = np.random.default_rng(tokens)
    with LiveDatastore(directory, TOKENIZER, policy, background=True) as store:
        if tokens:  # the datastore's learned text so far, folded in at once
            store.ingest(rng.integers(0, VOCAB, size=tokens).astype(np.int32))
            store.rebuild()
        last_rebuild = time.monotonic()
        time.sleep(1.0)  # traffic arrives some time after the last rebuild
        probe = rng.integers(0, VOCAB, size=200).astype(np.int32)
        start = time.monotonic()
        store.ingest(probe)
        while not holds(store, probe) and time.monotonic() - start < timeout_s:
            time.sleep(0.005)
        found_at = time.monotonic()
        waited = found_at - start
        stats = store.stats()
    return {
        "kind": "rebuild",
        "live_tokens": tokens,
        "searchable_after_s": round(waited, 3),
        "found": waited < timeout_s,
        "rebuild_s": round(stats.last_rebuild_seconds, 4),
        # the probe's rebuild against the time since the one before it
        "rebuild_share": round(stats.last_rebuild_seconds / (found_at - last_rebuild), 4),
        "rebuild_max_share": policy.rebuild_max_share,
        "rebuild_interval_s": policy.rebuild_interval_s,
    }


def measure_tier(directory: Path, tokens: int, policy: LivePolicy) -> dict[str, object]:
    rng = np.random.default_rng(tokens)
    plain = DraftConfig(node_score=default_node_score().as_config(), recent_samples=0)
    with_tier = Drafter(VOCAB, dataclasses.replace(plain, recent_samples=16))
    without = Drafter(VOCAB, plain)

    def swap(datastore: Datastore) -> None:
        with_tier.set_datastore(datastore)
        without.set_datastore(datastore)

    # No background thread: a rebuild runs only when called, so none runs in between.
    with LiveDatastore(directory, TOKENIZER, policy, on_swap=swap, unfolded=with_tier,
                       background=False) as store:  # fmt: skip
        if tokens:
            store.ingest(rng.integers(0, VOCAB, size=tokens).astype(np.int32))
            store.rebuild()
        probe = rng.integers(0, VOCAB, size=200).astype(np.int32)
        context = [*rng.integers(0, VOCAB, size=20).tolist(), *probe[:50].tolist()]
        with_tier.start("reader", context)
        without.start("reader", context)
        rebuilds = store.stats().rebuilds
        start = time.perf_counter()
        store.ingest(probe)
        tree = with_tier.speculate(["reader"], [[]], BUDGET).tree(0)
        elapsed = time.perf_counter() - start
        control = without.speculate(["reader"], [[]], BUDGET).tree(0)
        held = with_tier.held[1]
        between = store.stats().rebuilds - rebuilds
    continuation = probe.tolist()

    def accepted(t: DraftTree) -> int:
        return accepted_length(t.tokens.tolist(), t.parents.tolist(), continuation, 50)

    return {
        "kind": "tier",
        "live_tokens": tokens,
        "budget": BUDGET,
        "accepted_next_step": accepted(tree),
        "accepted_next_step_without_tier": accepted(control),
        "rebuilds_between": between,
        "ingest_to_draft_ms": round(elapsed * 1e3, 3),
        "held_tokens": held,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="0,1000000,4000000,16000000",
                        help="comma-separated live datastore sizes (tokens)")  # fmt: skip
    parser.add_argument("--rebuild-max-share", type=float, default=LivePolicy().rebuild_max_share)
    parser.add_argument("--timeout-s", type=float, default=90.0)
    args = parser.parse_args()
    policy = LivePolicy(rebuild_max_share=args.rebuild_max_share, snapshot_interval_s=0)
    for size in (int(t) for t in args.tokens.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(Path(tmp), size, policy, args.timeout_s)), flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure_tier(Path(tmp), size, policy)), flush=True)


if __name__ == "__main__":
    main()
