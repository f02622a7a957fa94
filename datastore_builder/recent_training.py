"""The recent tier's weights of the node score, ``train-score``'s third pass
(docs/algorithm.md, "The learned node score"): each held-out record drafted again with
the tier on and requests in flight beside it, in lockstep (other answers to its prompt,
each ahead by a random number of tokens, and records of other prompts); only the tier's
weights are fitted (Newton's method, every other weight held as an offset), so a request
with no other in flight drafts as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from datastore_builder.training_data import TrainingRecord, log_loss, replay
from drafter_service.datastore.sub_indices import Datastore
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import SCORE_FEATURES, Drafter
from drafter_service.drafting.node_score import RECENT_FEATURES, NodeScore

RECENT_COLUMNS = [SCORE_FEATURES.index(name) for name in RECENT_FEATURES]
PRESENT = SCORE_FEATURES.index("recent_present")
RECENT_SAMPLES = 16
"""The tier's ``recent_samples`` while collecting (the default the service turns on)."""


@dataclass(frozen=True, slots=True)
class RecentReport:
    """What the pass saw: labelled nodes the tier proposed, and the held-out log-loss on
    them with the fitted weights against the weights at 0."""

    nodes: int
    validation_logloss: float
    before_logloss: float


def in_flight(
    index: int, held: Sequence[TrainingRecord], siblings: Sequence[TrainingRecord],
    rng: np.random.Generator, most: int = 4,
) -> list[tuple[TrainingRecord, int]]:  # fmt: skip
    """What runs beside ``held[index]``, each with its lead in tokens: up to ``most`` of its
    ``siblings`` (other answers to its prompt) and as many held-out records of other
    prompts."""
    key = held[index].prompt_key()
    chosen = [siblings[i] for i in rng.permutation(len(siblings))[: int(rng.integers(0, most + 1))]]
    others = [i for i in rng.permutation(len(held)) if held[i].prompt_key() != key][:most]
    beside = [*chosen, *(held[i] for i in others)]
    return [(r, int(rng.integers(0, 17))) for r in beside]


def collect_recent(
    config: DraftConfig,
    datastore: Datastore,
    held: Sequence[TrainingRecord],
    answers: dict[bytes, list[TrainingRecord]],
    candidate_budget: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8], npt.NDArray[np.int64]]:
    """Features, labels and record index of every labelled node the tier proposed
    (``recent_present`` > 0), over every output position of ``held``; ``answers``: every
    record by prompt key (a record's siblings are the others under its key)."""
    recent = dataclasses.replace(config, node_score=(), recent_samples=RECENT_SAMPLES)
    rng = np.random.default_rng(seed)
    xs = [np.zeros((0, len(SCORE_FEATURES)))]
    ys, gs = [np.zeros(0, np.int8)], [np.zeros(0, np.int64)]
    for index, record in enumerate(held):
        drafter = Drafter(datastore.vocab_size, recent, datastore)
        siblings = [r for r in answers.get(record.prompt_key(), []) if r is not record]
        beside = in_flight(index, held, siblings, rng)
        for j, (other, lead) in enumerate(beside):
            drafter.start(f"beside-{j}", np.concatenate([other.prompt, other.output[:lead]]))
        drafter.start("r", record.prompt)
        for p, features, labels in replay(drafter, "r", record.output, candidate_budget):
            proposed = features[:, PRESENT] > 0
            xs.append(features[proposed])
            ys.append(labels[proposed])
            gs.append(np.full(int(proposed.sum()), index, dtype=np.int64))
            for j, (other, lead) in enumerate(beside):  # each a token on, in lockstep
                if lead + p < len(other.output):
                    drafter.add(f"beside-{j}", other.output[lead + p : lead + p + 1])
        if progress is not None:
            progress(index + 1)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)


def fit_recent(
    score: NodeScore, x: npt.NDArray[np.float64], y: npt.NDArray[np.int8], l2: float = 1.0
) -> NodeScore:
    """``score`` with its recent weights fitted to ``(x, y)`` (L2 ``l2`` on standardized
    columns, as the first fit's), every other weight held."""
    weights = np.asarray(score.weights, dtype=np.float64).copy()
    weights[RECENT_COLUMNS] = 0.0
    offset = x @ weights + score.bias
    r = x[:, RECENT_COLUMNS]
    scale = r.std(axis=0)
    scale[scale == 0] = 1.0
    z = r / scale
    w = np.zeros(len(RECENT_COLUMNS))
    for _ in range(50):  # Newton's method: the log-loss is convex in w
        p = 1.0 / (1.0 + np.exp(-(offset + z @ w)))
        gradient = z.T @ (p - y) + l2 * w
        hessian = (z * (p * (1 - p))[:, None]).T @ z + l2 * np.eye(len(w))
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-9:
            break
    weights[RECENT_COLUMNS] = w / scale
    return dataclasses.replace(score, weights=tuple(float(v) for v in weights))


def train_recent(
    score: NodeScore,
    config: DraftConfig,
    datastore: Datastore,
    held: Sequence[TrainingRecord],
    records: Sequence[TrainingRecord],
    candidate_budget: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[NodeScore, RecentReport]:
    """The pass (module docstring): ``score`` with its recent weights fitted. A fifth of
    the held-out records is kept out of a first fit to report its log-loss."""
    answers: dict[bytes, list[TrainingRecord]] = {}
    for record in records:
        answers.setdefault(record.prompt_key(), []).append(record)
    x, y, groups = collect_recent(config, datastore, held, answers, candidate_budget, seed,
                                  progress)  # fmt: skip
    if len(np.unique(y)) < 2:
        return score, RecentReport(len(y), float("nan"), float("nan"))
    val = groups % 5 == 0
    unweighted = dataclasses.replace(score, weights=tuple(
        0.0 if i in RECENT_COLUMNS else w for i, w in enumerate(score.weights)))  # fmt: skip
    validation = float("nan")
    if val.any() and len(np.unique(y[~val])) == 2:
        validation = log_loss(fit_recent(score, x[~val], y[~val]), x[val], y[val])
    report = RecentReport(len(y), validation, log_loss(unweighted, x[val], y[val]))
    return fit_recent(score, x, y), report
