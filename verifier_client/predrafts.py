"""Pre-drafts on the client: next-step trees the drafter sent ahead, keyed by the
verification outcome each assumes, and the walk that finds the outcome a step's commits made.

With ``prefetch_fan_out`` the drafter follows its answer to a step with a prefetch
response (DraftResponse.prefetch, same ``step``): for some of the step's requests,
the trees of the next step for their likeliest outcomes. An outcome of greedy
verification is ``(accepted node, bonus token)``: the deepest node of the tree the
client got whose path the target accepted (-1: none), then the token the target
emitted after it. The committed tokens of the next step are exactly that path plus
the bonus, so the client reads the outcome back from them (:func:`verified_outcome`)
and, when the drafter pre-drafted it, has its next tree without asking.

:class:`PredraftCache` keeps, per request, the tree returned at its latest step (the
DraftRequest ``step`` it was answered in) and the pre-drafts that came for that very
step; pre-drafts for any other step are stale and dropped. Decoding
(:func:`decode_predrafts`) happens on the stream's reader, off the decode loop.

Pure: no I/O, no numpy (the client wheel has neither). Not thread-safe but for
``decode_predrafts``, which touches nothing shared.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from sssd.drafter.v1 import drafter_pb2 as pb
from verifier_client.deltas import read_column
from verifier_client.results import ClientStats, Tree

__all__ = ["PredraftCache", "PredraftSet", "decode_predrafts", "verified_outcome"]

log = logging.getLogger(__name__)

VerifiedOutcome = tuple[int, int]  # (accepted node, -1 = none; bonus token)


@dataclass(frozen=True, slots=True)
class PredraftSet:
    """One prefetch response, decoded: each listed request's pre-drafts for the outcomes
    of the tree it got in message ``step``."""

    step: int
    trees: Mapping[str, Mapping[VerifiedOutcome, Tree]]
    size_bytes: int  # the serialized response
    malformed: str = ""  # why it was refused whole ("" = its arrays add up)


def decode_predrafts(response: pb.DraftResponse) -> PredraftSet:
    """The pre-drafts of a prefetch response; never raises: a payload whose arrays do not
    add up comes back empty, with the reason in ``malformed``."""
    size_bytes = response.ByteSize()
    try:
        trees = _decode(response.prefetch)
    except (TypeError, ValueError) as error:  # TypeError: bytes not a whole number of entries
        return PredraftSet(response.step, {}, size_bytes, str(error) or type(error).__name__)
    return PredraftSet(response.step, trees, size_bytes)


def _decode(message: pb.PrefetchedDrafts) -> dict[str, dict[VerifiedOutcome, Tree]]:
    request_ids = list(message.request_ids)
    counts: list[int] = read_column(message.outcome_counts, "I").tolist()
    nodes: list[int] = read_column(message.accepted_nodes, "i").tolist()
    bonuses: list[int] = read_column(message.bonus_tokens, "i").tolist()
    sizes: list[int] = read_column(message.node_counts, "I").tolist()
    tokens = read_column(message.tokens, "i")
    parents = read_column(message.parents, "i")
    scores = read_column(message.scores, "f")
    if len(counts) != len(request_ids) or len(set(request_ids)) != len(request_ids):
        raise ValueError(f"{len(request_ids)} request ids ({len(set(request_ids))} distinct), "
                         f"{len(counts)} outcome counts")  # fmt: skip
    outcomes = sum(counts)
    if not len(nodes) == len(bonuses) == len(sizes) == outcomes:
        raise ValueError(f"{outcomes} outcomes, {len(nodes)} accepted nodes, {len(bonuses)} "
                         f"bonus tokens, {len(sizes)} node counts")  # fmt: skip
    bounds = [0, *accumulate(sizes)]
    if not len(tokens) == len(parents) == len(scores) == bounds[-1]:
        raise ValueError(f"{bounds[-1]} nodes, {len(tokens)}/{len(parents)}/{len(scores)} "
                         f"tokens/parents/scores")  # fmt: skip
    out: dict[str, dict[VerifiedOutcome, Tree]] = {}
    first = 0  # the request's first outcome
    for request_id, count in zip(request_ids, counts, strict=True):
        trees: dict[VerifiedOutcome, Tree] = {}
        for k in range(first, first + count):
            lo, hi = bounds[k], bounds[k + 1]
            trees[nodes[k], bonuses[k]] = Tree(tokens[lo:hi], parents[lo:hi], scores[lo:hi])
        out[request_id] = trees
        first += count
    return out


def verified_outcome(tree: Tree, new_tokens: Sequence[int]) -> VerifiedOutcome | None:
    """The outcome of greedy verification of ``tree`` that committed ``new_tokens``, or
    None when they are not one (not exactly an accepted path plus one bonus token).

    From the root, each token moves to the child holding it (the first such, by index,
    as the drafter walks); the first token that is no child is the bonus, and it must
    be the last token.
    """
    tokens: list[int] = tree.tokens.tolist()
    parents = tree.parents
    node = -1
    last = len(new_tokens) - 1
    for i, token in enumerate(new_tokens):
        # The first child of ``node`` holding ``token``: count and index scan in C, and
        # no ValueError is raised (an exception costs more than the whole walk).
        at = -1
        for _ in range(tokens.count(token)):
            at = tokens.index(token, at + 1)
            if parents[at] == node:
                node = at
                break
        else:
            return (node, token) if i == last else None  # no such child: the bonus
    return None  # the tokens end inside the tree: no bonus


@dataclass(slots=True)
class _Latest:
    """A request's tree at its latest step and what was pre-drafted for it."""

    step: int  # DraftRequest.step of the message the tree answered
    tree: Tree  # as returned to the caller
    length: int  # the request's context length then: its outcome is in the tokens after
    predrafts: Mapping[VerifiedOutcome, Tree] | None = None  # None until they arrive


class PredraftCache:
    """Per request: the tree returned at its latest step and the pre-drafts for its outcomes.

    The session records every tree it returns (:meth:`record`) and forgets a request
    that got none (:meth:`forget`), so an entry always names the tree the caller is
    verifying now. Counts into ``stats`` (ClientStats.predraft_*).
    """

    __slots__ = ("_latest", "_stats")

    def __init__(self, stats: ClientStats) -> None:
        self._stats = stats
        self._latest: dict[str, _Latest] = {}

    def __len__(self) -> int:
        return len(self._latest)

    def record(self, request_id: str, step: int, tree: Tree, length: int) -> None:
        """``tree`` was returned for ``request_id``, answered in message ``step``, when its
        context held ``length`` tokens."""
        entry = self._latest.get(request_id)
        if entry is None:
            self._latest[request_id] = _Latest(step, tree, length)
        else:  # reused: this runs for every request of every step
            entry.step, entry.tree, entry.length, entry.predrafts = step, tree, length, None

    def forget(self, request_ids: Iterable[str]) -> None:
        """These requests got no tree (or ended): nothing can be pre-drafted for them."""
        latest = self._latest
        for request_id in request_ids:
            latest.pop(request_id, None)

    def clear(self) -> None:
        """Forgets every request (the stream the pre-drafts came on is gone)."""
        self._latest.clear()

    def take(self, sets: Iterable[PredraftSet]) -> None:
        """Files arrived pre-drafts under their requests' latest trees; drops (and counts)
        those for any other step and whole malformed responses."""
        stats, latest = self._stats, self._latest
        for predrafts in sets:
            stats.predraft_bytes += predrafts.size_bytes
            if predrafts.malformed:
                stats.predrafts_malformed += 1
                log.warning("prefetch response for step %d dropped: %s", predrafts.step,
                            predrafts.malformed)  # fmt: skip
                continue
            for request_id, trees in predrafts.trees.items():
                entry = latest.get(request_id)
                if entry is None or entry.step != predrafts.step:
                    stats.predrafts_stale += 1
                else:
                    entry.predrafts = trees

    def hit(self, request_id: str, context: Sequence[int]) -> Tree | None:
        """The pre-draft for the outcome that ``context`` (the request's whole committed
        context) makes of its latest tree; None when there is none (counted as a miss when
        the request had pre-drafts)."""
        entry = self._latest.get(request_id)
        if entry is None or not entry.predrafts:
            return None
        outcome = verified_outcome(entry.tree, context[entry.length :])
        tree = None if outcome is None else entry.predrafts.get(outcome)
        if tree is None:
            self._stats.predraft_misses += 1
        else:
            self._stats.predraft_hits += 1
        return tree
