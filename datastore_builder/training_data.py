"""The records ``train-score`` learns from, how a candidate tree's nodes are labelled
against a record's continuation (:func:`replay`), and a score's log-loss on such labels."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drafter_service.drafting.drafter import Drafter
from drafter_service.drafting.node_score import NodeScore

PROMPT_KEY_TOKENS = 48
"""A prompt is known by its last tokens (the end of the last user turn and the assistant
header): system prompts that differ by model do not hide a repeated question."""


@dataclass(frozen=True, slots=True)
class TrainingRecord:
    prompt: npt.NDArray[np.int32]
    output: npt.NDArray[np.int32]

    def prompt_key(self) -> bytes:
        return self.prompt[-PROMPT_KEY_TOKENS:].tobytes()


def labelled_nodes(
    parents: npt.NDArray[np.int32], tokens: npt.NDArray[np.int32], truth: Sequence[int]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int8]]:
    """Which nodes of a breadth-first tree are labelled (parent on the path ``truth``
    starts, or a child of the root), and their labels (on that path)."""
    on_path = np.zeros(len(tokens), dtype=np.bool_)
    labelled = np.zeros(len(tokens), dtype=np.bool_)
    depth = np.zeros(len(tokens), dtype=np.int64)
    for i, (parent, token) in enumerate(zip(parents.tolist(), tokens.tolist(), strict=True)):
        depth[i] = 1 if parent < 0 else depth[parent] + 1
        labelled[i] = parent < 0 or on_path[parent]
        d = int(depth[i])
        on_path[i] = labelled[i] and d <= len(truth) and token == truth[d - 1]
    return labelled, on_path[labelled].astype(np.int8)


def replay(
    drafter: Drafter, request_id: str, output: npt.NDArray[np.int32], candidate_budget: int
) -> Iterator[tuple[int, npt.NDArray[np.float64], npt.NDArray[np.int8]]]:
    """Steps the started ``request_id`` through ``output``: at each position ``p``, the
    features and labels of the labelled nodes of the tree it would draft there (none for
    an empty tree), yielded before it commits ``output[p]``."""
    budgets = np.zeros(1, dtype=np.int32)  # advancing only: explain drafts
    truth = output.tolist()
    for p in range(len(truth)):
        delta = output[p - 1 : p] if p else output[:0]
        drafter.draft_batch([request_id], delta, np.array([0, len(delta)]), budgets)
        explained = drafter.explain(request_id, candidate_budget)
        tree = explained.tree
        labelled, labels = labelled_nodes(tree.parents, tree.tokens, truth[p:])
        yield p, explained.features[labelled], labels


def log_loss(score: NodeScore, x: npt.NDArray[np.float64], y: npt.NDArray[np.int8]) -> float:
    """Mean negative log-likelihood of ``y`` under ``score``."""
    z = x @ np.asarray(score.weights) + score.bias
    # log sigmoid(z) and log sigmoid(-z), stably.
    return float(np.mean(np.where(y > 0, np.logaddexp(0.0, -z), np.logaddexp(0.0, z))))
