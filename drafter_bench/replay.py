"""Greedy replay: how many tokens per step a drafter would give on recorded outputs.

A record's output is taken as what the target model generates greedily. At
each step, with ``p`` output tokens committed, the drafter proposes a tree;
``accepted`` is the depth of the deepest root path whose tokens equal
``output[p], output[p+1], ...``; the step commits ``accepted + 1`` tokens (the
target's bonus token), capped at the end of the output. tau = output tokens /
steps. ``batch`` records run in lockstep, one drafter call per step.

With ``siblings`` N the records come in groups of N answering one prompt
(:func:`sibling_groups`) and a group occupies N lanes together, as parallel sampling or
RL rollouts put siblings in flight: with the recent tier on
(``DraftConfig.recent_samples``) each drafts from the others. ``stagger`` S starts
sibling j S * j steps after the first, as queued rollouts start.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from drafter_bench.acceptance import accepted_length
from drafter_bench.live_replay import ReplayLiveStore
from drafter_bench.proposers import (
    ContextProposer,
    DrafterProposer,
    PldProposer,
    Proposer,
)
from drafter_bench.token_records import Record
from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import Drafter, DraftTree
from drafter_service.live.live_datastore import LivePolicy
from verifier_client.results import Tree

METHODS = ("pld", "input", "datastore", "both")
"""pld: prompt lookup (vLLM ngram); input: input trie only; datastore: datastore
tree only; both: SSSD (input trie fused with the datastore)."""

USES_DATASTORE = frozenset({"datastore", "both"})

_EMPTY = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """One configuration to replay."""

    method: str
    budget: int
    batch: int = 1
    threads: int = 1
    config: DraftConfig = field(default_factory=DraftConfig)
    pld_min: int = 1
    pld_max: int = 4
    live: bool = False
    live_policy: LivePolicy = field(default_factory=lambda: LivePolicy(rebuild_min_tokens=1))
    """Rebuild policy of the live datastore; the default folds every finished record in
    before the next one starts."""
    live_base: str = "pinned"
    """With ``live`` and a base: how the base joins the live datastore, one of
    :data:`~drafter_bench.live_replay.LIVE_BASE_LAYOUTS` (``seed``: its initial snapshot,
    finished records fold into its newest sub-index; ``pinned``: a pinned corpus,
    finished records get sub-indices of their own)."""
    vocab_size: int = 128256
    datastore_via: str = "drafter"
    """How ``datastore`` (datastore tree only) drafts: ``drafter`` = the Drafter with a
    depth-1 input trie (its match node has no children, so the input adds nothing);
    ``context`` = ``_core.draft_context(use_input=False)``. Same trees either way."""
    chain: int | None = None
    """Verify chains, as vLLM does (None: trees): each step's tree becomes its best chain
    of at most this many tokens (``Tree.best_chain``; 0: none), ending before a node scored
    below ``chain_min_score``. Drafter methods only (the chain is chosen by node scores)."""
    chain_min_score: float = 0.0
    siblings: int = 0
    """Records per sibling group (0: none): see the module docstring."""
    stagger: int = 0
    """Steps between the starts of two siblings of a group."""
    ceiling: int = 0
    """Recall ceiling (0: off): draft trees of this many nodes and accept at most
    ``budget`` tokens of each, so tau is what the best ``budget``-node subtree of every
    step's ``ceiling``-node tree would reach: the bound of any re-ranking of those
    candidates (any node score), given the output."""


@dataclass(slots=True)
class ReplayResult:
    """Counts and timings of one configuration."""

    records: int = 0
    steps: int = 0
    output_tokens: int = 0
    accepted_tokens: int = 0
    drafted_tokens: int = 0
    """Draft tokens verified, over all steps (tree nodes, or chain tokens)."""
    draft_ns: list[int] = field(default_factory=list)
    """Per drafter call for one request (batch 1 only)."""
    batch_ns: list[int] = field(default_factory=list)
    """Per drafter call for the whole batch (batch > 1 only)."""
    live_rebuilds: int = 0
    live_rebuild_s: float = 0.0
    finished: list[tuple[int, int]] = field(default_factory=list)
    """(output tokens, steps) of each record, in the order records finished."""
    datastore_tokens: int = 0
    wall_s: float = 0.0

    def tau_curve(self, window: int) -> list[tuple[int, float]]:
        """(records finished so far, tau over the last ``window`` of them) per window."""
        curve = []
        for end in range(window, len(self.finished) + 1, window):
            chunk = self.finished[end - window : end]
            curve.append((end, sum(t for t, _ in chunk) / max(1, sum(s for _, s in chunk))))
        return curve

    @property
    def tau(self) -> float:
        return self.output_tokens / self.steps if self.steps else 0.0


def make_proposer(settings: ReplaySettings, datastore: Datastore) -> Proposer:
    """The proposer for ``settings.method`` over ``datastore`` (ignored by pld/input)."""
    s = settings
    if s.method == "pld":
        return PldProposer(s.budget, s.pld_min, s.pld_max)
    if s.method == "datastore" and s.datastore_via == "context":
        return ContextProposer(datastore, s.config, s.budget)
    if s.method == "datastore" and s.datastore_via == "drafter":
        config = replace(s.config, input_max_prefix=1, input_max_depth=1)
        return DrafterProposer(Drafter(s.vocab_size, config, datastore, s.threads), s.budget)
    if s.method in ("input", "both"):
        store = datastore if s.method == "both" else None
        return DrafterProposer(Drafter(s.vocab_size, s.config, store, s.threads), s.budget)
    raise ValueError(
        f"unknown method {s.method!r} (datastore via {s.datastore_via!r}); "
        f"expected one of {', '.join(METHODS)}"
    )


@dataclass(slots=True)
class _Lane:
    record: Record
    output: list[int]
    p: int = 0
    steps: int = 0
    delta: npt.NDArray[np.int32] = field(default_factory=lambda: _EMPTY)
    start_at: int = 0  # the step it starts at (a staggered sibling waits until then)
    started: bool = False


def sibling_groups(records: Sequence[Record], n: int) -> list[Record]:
    """The records in groups of ``n`` that answer one prompt (identical ``prompt_ids``),
    group after group: the first ``n`` of every prompt that has at least ``n`` answers, in
    the order each prompt first appears."""
    by_prompt: dict[bytes, list[Record]] = {}
    for record in records:
        by_prompt.setdefault(np.asarray(record.prompt_ids, dtype=np.int32).tobytes(),
                             []).append(record)  # fmt: skip
    return [r for group in by_prompt.values() if len(group) >= n for r in group[:n]]


def replay(
    records: Sequence[Record], settings: ReplaySettings, base: Sequence[SubIndex] = ()
) -> ReplayResult:
    """Replays ``records`` under ``settings`` over the datastore of ``base`` sub-indices.

    With ``settings.live`` the datastore starts as ``base`` (laid out as
    ``settings.live_base``) and each finished record (last prompt tokens + output) is
    ingested at the step boundary, before the next record starts. Methods that use no
    datastore ignore both.
    """
    if settings.batch < 1:
        raise ValueError(f"batch must be >= 1, got {settings.batch}")
    group = max(1, settings.siblings)
    if settings.batch % group:
        raise ValueError(f"batch {settings.batch} is not a multiple of siblings {group}")
    uses_store = settings.method in USES_DATASTORE
    store = Datastore(base if uses_store else (), settings.vocab_size)
    if settings.ceiling and settings.ceiling < settings.budget:
        raise ValueError(f"ceiling {settings.ceiling} is below budget {settings.budget}")
    # Under a ceiling every step drafts its large tree; a path of up to `budget` tokens
    # of it is a `budget`-node subtree, so capping the accepted length bounds re-ranking.
    proposer = make_proposer(replace(settings, budget=settings.ceiling or settings.budget), store)
    # With the recent tier, every stored record is drafted from until a rebuild folds it in.
    tier = (proposer.drafter if isinstance(proposer, DrafterProposer)
            and settings.config.recent_samples > 0 else None)  # fmt: skip
    live = (
        ReplayLiveStore(base, settings.vocab_size, settings.live_policy, settings.live_base,
                        unfolded=tier)
        if settings.live and uses_store
        else None
    )
    accept_cap = settings.budget if settings.ceiling else None
    if settings.chain is not None and not isinstance(proposer, DrafterProposer):
        raise ValueError(f"chains are chosen by node scores: method {settings.method!r} has "
                         "none")  # fmt: skip
    result = ReplayResult()
    lanes: list[_Lane | None] = [None] * settings.batch
    queue = iter(records)
    wall_start = time.perf_counter()

    step = 0

    def fill() -> None:
        """Gives every free block of ``group`` lanes the next ``group`` records (a sibling
        group, or one record), the j-th starting ``stagger * j`` steps from now."""
        for block in range(0, len(lanes), group):
            if any(lane is not None for lane in lanes[block : block + group]):
                continue
            for j in range(group):
                record = next(queue, None)
                if record is None:
                    return
                result.records += 1
                if len(record.output_ids):
                    lanes[block + j] = _Lane(record, record.output_ids.tolist(),
                                             start_at=step + settings.stagger * j)  # fmt: skip

    fill()
    while any(lane is not None for lane in lanes):
        for slot, lane in enumerate(lanes):
            if lane is not None and not lane.started and lane.start_at <= step:
                proposer.begin(slot, lane.record)
                lane.started = True
        active = [s for s, lane in enumerate(lanes) if lane is not None and lane.started]
        step += 1
        if not active:
            continue
        trees = proposer.draft(active, [lanes[s].delta for s in active])  # type: ignore[union-attr]
        (result.draft_ns if settings.batch == 1 else result.batch_ns).append(proposer.call_ns)
        finished: list[Record] = []
        if settings.chain is not None:
            assert isinstance(proposer, DrafterProposer) and proposer.last is not None
            batch = proposer.last
            trees = [_chain(batch.tree(i), settings) for i in range(len(batch))]
        for slot, (tokens, parents) in zip(active, trees, strict=True):
            lane = lanes[slot]
            assert lane is not None
            result.drafted_tokens += len(tokens)
            accepted = accepted_length(tokens, parents, lane.output, lane.p)
            if accept_cap is not None:
                accepted = min(accepted, accept_cap)
            commit = min(accepted + 1, len(lane.output) - lane.p)
            lane.delta = lane.record.output_ids[lane.p : lane.p + commit]
            lane.p += commit
            lane.steps += 1
            result.steps += 1
            result.accepted_tokens += accepted
            result.output_tokens += commit
            if lane.p == len(lane.output):
                proposer.end(slot)
                lanes[slot] = None
                result.finished.append((len(lane.output), lane.steps))
                finished.append(lane.record)
        if live is not None and finished:
            proposer.set_datastore(live.ingest(finished))
        fill()
    result.wall_s = time.perf_counter() - wall_start
    final = live.datastore if live is not None else store
    result.datastore_tokens = final.num_tokens
    if live is not None:
        stats = live.store.stats()
        result.live_rebuilds, result.live_rebuild_s = stats.rebuilds, stats.rebuild_seconds_total
        live.close()
    return result


def _chain(tree: DraftTree, settings: ReplaySettings) -> tuple[list[int], list[int]]:
    """``tree``'s best chain as a tree (each token the child of the one before)."""
    assert settings.chain is not None
    scored = Tree.of(tree.tokens.tolist(), tree.parents.tolist(), tree.scores.tolist())
    chain = scored.best_chain(settings.chain, settings.chain_min_score)
    return chain, list(range(-1, len(chain) - 1))
