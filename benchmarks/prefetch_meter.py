"""What pre-drafting could hit during the greedy replay (``replay --prefetch``, issue 13).

After each step's plain trees, the replay asks for the pre-drafts of every fan-out
(``predraft_batch``, one call per fan-out: the first ``f`` pre-drafts of a larger
fan-out are not in general the fan-out-``f`` choice, see :class:`FanOutCounts`) and
compares them with the outcome the recorded output gives (``observed_outcome``):

- a **hit** at fan-out ``f``: the observed (accepted node, bonus token) is among the
  fan-out-``f`` pre-drafts; ``hit_rate`` = hits / steps that have an outcome (a step
  whose tree covers the rest of the output has none);
- on a hit followed by another step, the pre-draft's accepted length is compared with
  that of the plain tree the next step really drafts (the pre-draft's input trie lacks
  the last step's tokens, by design);
- the cost: native time, Python planning time and nodes drafted, per request-step;
- two bounds, per step with an outcome: the observed stop node among the ``f`` of
  highest ``stop`` (``candidate_nodes``), and the bonus among the drafter's
  continuations beyond the tree at that node (the first level of a ``max_budget``
  draft after its path, drafted children left out), anywhere or among the best ``f``.

Pre-drafting changes no drafter state: the plain trees, hence tau, are the replay's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from benchmarks.acceptance import accepted_length
from benchmarks.proposers import DrafterProposer
from drafter_service.drafting.drafter import DraftTree
from drafter_service.drafting.predraft import candidate_nodes, observed_outcome, path_tokens

Outcome = tuple[int, int]
"""(accepted node or -1, bonus token), as ``observed_outcome`` gives it."""


@dataclass(slots=True)
class FanOutCounts:
    """Counts of one fan-out over a replay."""

    fan_out: int
    hits: int = 0
    prefix_hits: int = 0
    """Hits counted against the first ``fan_out`` pre-drafts of the largest fan-out."""
    agreeing_steps: int = 0
    """Request-steps whose pre-drafted outcomes equal the first ``fan_out`` of the largest
    fan-out's (the planner only looks for bonus candidates below the ``fan_out`` likeliest
    stops, with a ``fan_out``-dependent budget, so the lists need not agree)."""
    stop_in_top: int = 0
    bonus_in_top: int = 0
    compared: int = 0
    """Hits followed by a step, where the pre-draft meets the next plain tree."""
    predraft_accepted: int = 0
    plain_accepted: int = 0
    same_tree: int = 0
    predrafts: int = 0
    nodes: int = 0
    native_ns: int = 0
    total_ns: int = 0


@dataclass(slots=True)
class PrefetchMeter:
    """Measures the pre-drafts of ``proposer``'s requests at ``fan_outs``, step by step
    (:meth:`step`, :meth:`end`)."""

    proposer: DrafterProposer
    fan_outs: tuple[int, ...]
    max_budget: int
    """Budget of the draft whose first level stands for the drafter's continuations."""
    counts: list[FanOutCounts] = field(init=False)
    request_steps: int = field(default=0, init=False)
    outcome_steps: int = field(default=0, init=False)
    bonus_known: int = field(default=0, init=False)
    _pending: dict[int, list[tuple[FanOutCounts, DraftTree]]] = field(
        default_factory=dict, init=False
    )
    """Per slot: pre-drafts that hit, waiting for the slot's next plain tree."""

    def __post_init__(self) -> None:
        if not self.fan_outs or min(self.fan_outs) < 1:
            raise ValueError(f"fan-outs must be >= 1, got {list(self.fan_outs)}")
        self.fan_outs = tuple(sorted(set(self.fan_outs)))
        self.counts = [FanOutCounts(f) for f in self.fan_outs]

    def step(self, slots: Sequence[int], targets: Sequence[Sequence[int]]) -> None:
        """After ``proposer.draft(slots, ...)``, before the step commits: ``targets[i]`` is
        the recorded output from slot ``i``'s position on (its first budget + 1 tokens
        suffice: no tree is deeper than its budget)."""
        proposer = self.proposer
        trees = proposer.last_trees
        for slot, tree, target in zip(slots, trees, targets, strict=True):
            for counts, predraft in self._pending.pop(slot, []):
                counts.compared += 1
                counts.predraft_accepted += _accepted(predraft, target)
                counts.plain_accepted += _accepted(tree, target)
                counts.same_tree += np.array_equal(predraft.tokens, tree.tokens) and bool(
                    np.array_equal(predraft.parents, tree.parents)
                )
        outcomes = [observed_outcome(t, target) for t, target in zip(trees, targets, strict=True)]
        self.request_steps += len(slots)
        self.outcome_steps += sum(o is not None for o in outcomes)
        calls = [proposer.predraft(f) for f in self.fan_outs]
        largest = [[(p.outcome.node, p.outcome.bonus) for p in pre] for pre in calls[-1].predrafts]
        for counts, call in zip(self.counts, calls, strict=True):
            f = counts.fan_out
            counts.native_ns += call.native_ns
            counts.total_ns += call.total_ns
            counts.nodes += call.nodes
            for i, (slot, outcome, predrafts) in enumerate(
                zip(slots, outcomes, call.predrafts, strict=True)
            ):
                keys = [(p.outcome.node, p.outcome.bonus) for p in predrafts]
                counts.predrafts += len(keys)
                counts.agreeing_steps += keys == largest[i][:f]
                if outcome is None:
                    continue
                counts.prefix_hits += outcome in largest[i][:f]
                if outcome in keys:
                    counts.hits += 1
                    self._pending.setdefault(slot, []).append(
                        (counts, predrafts[keys.index(outcome)].tree)
                    )
        self._bounds(trees, outcomes)

    def end(self, slot: int) -> None:
        """The slot's record finished: its hits have no next step to meet."""
        self._pending.pop(slot, None)

    def _bounds(self, trees: list[DraftTree], outcomes: list[Outcome | None]) -> None:
        rows = [(i, o) for i, o in enumerate(outcomes) if o is not None]
        if not rows:
            return
        # The drafter's continuations at each observed stop node: one native call for all.
        afters = self.proposer.draft_after(
            [(i, path_tokens(trees[i], node)) for i, (node, _) in rows], self.max_budget
        )
        for (i, (node, bonus)), after in zip(rows, afters, strict=True):
            tree = trees[i]
            stops = candidate_nodes(tree, self.fan_outs[-1])
            drafted = {int(t) for t, p in zip(tree.tokens, tree.parents, strict=True) if p == node}
            first = after.parents == -1
            order = np.argsort(-after.scores[first], kind="stable")  # best first, ties by BFS
            beyond = [int(t) for t in after.tokens[first][order] if int(t) not in drafted]
            self.bonus_known += bonus in beyond
            for counts in self.counts:
                f = counts.fan_out
                counts.stop_in_top += node in stops[:f]
                counts.bonus_in_top += bonus in beyond[:f]

    def report(self) -> dict[str, object]:
        """The JSON ``prefetch`` object of a replay report (rates over steps with an
        outcome; costs per request-step; accepted lengths over compared hits)."""

        def per(value: int, steps: int, scale: float = 1.0) -> float | None:
            return round(value / steps / scale, 4) if steps else None

        outcome, steps = self.outcome_steps, self.request_steps
        return {
            "fan_outs": list(self.fan_outs),
            "request_steps": steps,
            "outcome_steps": outcome,
            "bonus_known_rate": per(self.bonus_known, outcome),
            "per_fan_out": [
                {
                    "fan_out": c.fan_out,
                    "hit_rate": per(c.hits, outcome),
                    "hits": c.hits,
                    "prefix_hit_rate": per(c.prefix_hits, outcome),
                    "agreement_rate": per(c.agreeing_steps, steps),
                    "stop_in_top_rate": per(c.stop_in_top, outcome),
                    "bonus_in_top_rate": per(c.bonus_in_top, outcome),
                    "compared_hits": c.compared,
                    "predraft_accepted_mean": per(c.predraft_accepted, c.compared),
                    "plain_accepted_mean": per(c.plain_accepted, c.compared),
                    "same_tree_rate": per(c.same_tree, c.compared),
                    "predrafts_per_request_step": per(c.predrafts, steps),
                    "nodes_per_request_step": per(c.nodes, steps),
                    "native_us_per_request_step": per(c.native_ns, steps, 1e3),
                    "total_us_per_request_step": per(c.total_ns, steps, 1e3),
                }
                for c in self.counts
            ],
        }



def _accepted(tree: DraftTree, target: Sequence[int]) -> int:
    return accepted_length(tree.tokens.tolist(), tree.parents.tolist(), target, 0)
