"""Fits the learned node score (``datastore-builder train-score``): held-out records are
replayed against a datastore of the others, and a logistic regression of whether each
candidate node whose parent lies on the recorded continuation does too is
P(node accepted | parent accepted). The three passes, and why the datastore leaves out
other answers to a held-out prompt and the live columns are tied to the base's, are in
docs/algorithm.md, "The learned node score". scikit-learn (the ``train`` extra) is needed
here only, never by the service.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import numpy as np
import numpy.typing as npt

from datastore_builder.recent_training import RecentReport, train_recent
from datastore_builder.training_data import TrainingRecord, log_loss, replay
from drafter_service.corpus.build_errors import BuildError
from drafter_service.corpus.readers import detect_format, iter_records
from drafter_service.corpus.records import RecordSpec, id_parts
from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import SCORE_FEATURES, Drafter
from drafter_service.drafting.node_score import NodeScore
from drafter_service.live.ingestion import generation_document
from drafter_service.live.live_policy import LivePolicy

LIVE_BASE = [
    (i, SCORE_FEATURES.index("base_" + name.removeprefix("live_")))
    for i, name in enumerate(SCORE_FEATURES)
    if name.startswith("live_")
]
"""Each live source's column and its base counterpart's."""
_NO_FEATURES = np.zeros((0, len(SCORE_FEATURES)))
_NO_LABELS = np.zeros(0, dtype=np.int8)
_NO_GROUPS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class TrainingReport:
    """What a fit saw: nodes, positions, the positive rate and the held-out log-loss of
    the model against always predicting that rate."""

    records: int
    positions: int
    nodes: int
    live_nodes: int
    """Of ``nodes``, those of the live pass."""
    positive_rate: float
    validation_logloss: float
    base_logloss: float
    recent: RecentReport
    """The third pass's: the recent tier's weights (:mod:`datastore_builder.recent_training`)."""


def read_training_records(
    path: Path, vocab_size: int, prompt_field: str = "prompt_ids", output_field: str = "output_ids"
) -> list[TrainingRecord]:
    """Token-id records (JSONL or Parquet) with a prompt and an output field."""
    spec = RecordSpec(
        kind="token-ids", prompt_field=prompt_field, output_field=output_field,
        store="prompt+output",
    )  # fmt: skip
    fmt = detect_format(path)
    if fmt == "text":
        raise BuildError(f"{path}: train-score reads token-id records (.jsonl[.gz], .parquet)")
    records = []
    for where, record in iter_records(path, fmt, spec.fields, "line", lambda _: None):
        prompt, output = id_parts(spec, record, where, vocab_size)
        records.append(TrainingRecord(prompt, output))
    if not records:
        raise BuildError(f"{path}: no records")
    return records


def split_holdout(
    records: Sequence[TrainingRecord], holdout: int, seed: int
) -> tuple[list[TrainingRecord], list[npt.NDArray[np.int32]]]:
    """The held-out records, and the outputs of the others that answer none of their
    prompts (the training datastore's documents)."""
    if not 1 <= holdout < len(records):
        raise BuildError(f"--holdout {holdout} must be in [1, {len(records) - 1}] "
                         f"for {len(records)} records")  # fmt: skip
    rng = np.random.default_rng(seed)
    chosen = set(rng.choice(len(records), holdout, replace=False).tolist())
    held = [r for i, r in enumerate(records) if i in chosen]
    prompts = {r.prompt_key() for r in held}
    rest = [r.output for i, r in enumerate(records)
            if i not in chosen and r.prompt_key() not in prompts]  # fmt: skip
    return held, rest


def collect(
    drafter: Drafter,
    records: Sequence[TrainingRecord],
    candidate_budget: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8], npt.NDArray[np.int64], int]:
    """Features, labels and record index of every labelled node, over every output
    position of ``records`` (none if nothing was drafted); and the number of positions."""
    xs, ys, gs = [_NO_FEATURES], [_NO_LABELS], [_NO_GROUPS]
    for index, record in enumerate(records):
        rid = f"train-{index}"
        drafter.start(rid, record.prompt)
        try:
            for _, x, y in replay(drafter, rid, record.output, candidate_budget):
                xs.append(x)
                ys.append(y)
                gs.append(np.full(len(y), index, dtype=np.int64))
        finally:
            drafter.stop(rid)
        if progress is not None:
            progress(index + 1)
    positions = sum(len(r.output) for r in records)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(gs), positions


def collect_live(
    drafter: Drafter,
    records: Sequence[TrainingRecord],
    base: SubIndex,
    candidate_budget: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8], npt.NDArray[np.int64], int]:
    """The live pass (docs/algorithm.md): :func:`collect` over ``records[1:]``, each drafted
    against ``base`` plus a live source of the records before it. Group indices are the
    records' own; ``progress`` counts on from ``len(records)``."""
    vocab_size = base.vocab_size
    policy = LivePolicy()
    # What each record stores once finished, and its prompt, computed once.
    documents = [generation_document(r.prompt, r.output, policy, vocab_size) for r in records]
    keys = [r.prompt_key() for r in records]
    xs, ys, gs = [_NO_FEATURES], [_NO_LABELS], [_NO_GROUPS]
    positions = 0
    try:
        for index in range(1, len(records)):
            live = [doc for doc, key in zip(documents[:index], keys[:index], strict=True)
                    if key != keys[index]]  # fmt: skip
            if live:
                drafter.set_datastore(
                    Datastore([base, SubIndex.build(live, vocab_size)], vocab_size, base_count=1)
                )
                x, y, _, n = collect(drafter, [records[index]], candidate_budget)
                xs.append(x)
                ys.append(y)
                gs.append(np.full(len(y), index, dtype=np.int64))
                positions += n
            if progress is not None:
                progress(len(records) + index + 1)
    finally:
        drafter.set_datastore(Datastore([base], vocab_size))
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(gs), positions


def tie_live_to_base(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``x`` with each live column added into its base column and then zeroed: a linear
    fit on it has one weight for both sources (w·base + w·live = w·(base + live)), which
    :func:`share_datastore_weights` then copies to the live columns."""
    tied = x.copy()
    for live, base in LIVE_BASE:
        tied[:, base] += x[:, live]
        tied[:, live] = 0.0
    return tied


def fit(x: npt.NDArray[np.float64], y: npt.NDArray[np.int8], trained_on: str) -> NodeScore:
    """Logistic regression (scikit-learn, L2, C = 1) on standardized features, folded back
    into weights on the raw features that the native core evaluates."""
    try:
        linear_model = import_module("sklearn.linear_model")
    except ImportError:
        raise BuildError(
            "train-score needs scikit-learn: pip install 'sssd-drafter[train]'"
        ) from None
    if len(np.unique(y)) < 2:
        raise BuildError("the held-out records gave only one kind of label; hold out more")
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    model = linear_model.LogisticRegression(max_iter=2000)
    model.fit((x - mean) / scale, y)
    coef = model.coef_[0] / scale
    bias = float(model.intercept_[0] - np.sum(model.coef_[0] * mean / scale))
    return NodeScore(bias, tuple(float(c) for c in coef), trained_on)


def share_datastore_weights(score: NodeScore, x: npt.NDArray[np.float64]) -> NodeScore:
    """A fit on one datastore never sees a split datastore's live source (its columns are
    all 0, so their weights are too): give the live columns the base's weights, since
    both are suffix-array samples read the same way."""
    if x[:, [live for live, _ in LIVE_BASE]].any():
        return score
    weights = list(score.weights)
    for live, base in LIVE_BASE:
        weights[live] = weights[base]
    return dataclasses.replace(score, weights=tuple(weights))


def train(
    records: Sequence[TrainingRecord],
    vocab_size: int,
    *,
    holdout: int = 300,
    seed: int = 0,
    candidate_budget: int = 256,
    config: DraftConfig | None = None,
    trained_on: str = "",
    progress: Callable[[int], None] | None = None,
    recent_pass: bool = True,
) -> tuple[NodeScore, TrainingReport]:
    """Fits a node score on ``records`` replayed against themselves (module docstring).

    A fifth of the held-out records (by record) is kept out of a first fit to report its
    log-loss; the score returned is fitted on all of them. ``recent_pass``: fit the recent
    tier's weights in a third pass (else they are 0)."""
    held, rest = split_holdout(records, holdout, seed)
    if not rest:
        raise BuildError("every record shares a prompt with a held-out one: no datastore left")
    base = config if config is not None else DraftConfig()
    hand = dataclasses.replace(base, node_score=())
    index = SubIndex.build(rest, vocab_size)
    drafter = Drafter(vocab_size, hand, Datastore([index], vocab_size))
    x, y, groups, positions = collect(drafter, held, candidate_budget, progress)
    if not len(y):
        raise BuildError("the held-out records gave no draft nodes to learn from")
    lx, ly, lgroups, live_positions = collect_live(drafter, held, index, candidate_budget,
                                                   progress)  # fmt: skip
    x = tie_live_to_base(np.concatenate([x, lx]))
    y = np.concatenate([y, ly])
    groups = np.concatenate([groups, lgroups])
    positions += live_positions
    val = groups % 5 == 0
    rate = float(np.clip(y[~val].mean(), 1e-6, 1 - 1e-6))
    base_loss = -float(np.mean(np.where(y[val] > 0, math.log(rate), math.log1p(-rate))))
    val_loss = math.nan
    if val.any():
        val_loss = log_loss(fit(x[~val], y[~val], trained_on), x[val], y[val])
    score = share_datastore_weights(fit(x, y, trained_on), x)
    recent = RecentReport(0, math.nan, math.nan)
    if recent_pass:
        score, recent = train_recent(
            score, hand, Datastore([index], vocab_size), held, records, candidate_budget, seed,
            None if progress is None else lambda n: progress(2 * len(held) + n),
        )  # fmt: skip
    report = TrainingReport(len(held), positions, len(y), len(ly), float(y.mean()), val_loss,
                            base_loss, recent)  # fmt: skip
    return score, report
