"""What online calibration of the node score could gain at most (issue 15, item 3).

Online calibration would refit the node score per datastore from verification outcomes
as traffic arrives. Its ceiling is a fit on the traffic itself: for each dev set, the
first half of its records is drafted at every output position (256-node candidate trees,
the rows ``datastore-builder train-score`` learns from) and two scores are fitted to it:

- ``calibrated``: the shipped score's logit rescaled, ``a * z + b`` (what a light online
  recalibration would learn);
- ``refit``: every weight refitted in-domain (more data than an online fit has early on).

The second half is then replayed greedily with the hand-set fusion, the shipped score and
both fits. ``corpus``: against the 6.4M-token corpus datastore. ``live``: the whole set is
replayed into an empty live datastore (the first half is what the fits drafted from, as
it learned), and tau is taken over the second half's records.

    python -m drafter_bench.calibration_bound --data-dir ../shared/data \
        --out benchmarks/results/calibration_bound.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path

import numpy as np
import numpy.typing as npt

from datastore_builder.score_training import collect, fit
from datastore_builder.training_data import TrainingRecord
from drafter_bench.live_replay import ReplayLiveStore
from drafter_bench.replay import ReplaySettings, replay
from drafter_bench.token_records import Record, iter_documents, read_records
from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import Drafter
from drafter_service.drafting.node_score import NodeScore, default_node_score
from drafter_service.live.live_datastore import LivePolicy

DEV_SETS = ("chat_alpacaeval_llama3_8b", "code_humaneval_llama31_8b", "multilingual_mtbench_suzume")
CORPUS = "corpus/datastore_llama3_family.jsonl.gz"
VOCAB = 128256
CANDIDATE_BUDGET = 256


def _training(records: Sequence[Record]) -> list[TrainingRecord]:
    return [TrainingRecord(r.prompt_ids, r.output_ids) for r in records]


def collect_corpus(
    records: Sequence[Record], base: Sequence[SubIndex], config: DraftConfig
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8]]:
    drafter = Drafter(VOCAB, config, Datastore(base, VOCAB))
    x, y, _, _ = collect(drafter, _training(records), CANDIDATE_BUDGET)
    return x, y


def collect_live(
    records: Sequence[Record], config: DraftConfig
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8]]:
    """Each record drafted against the live datastore of the records before it, then
    ingested: what the service would have seen while learning."""
    live = ReplayLiveStore((), VOCAB, LivePolicy(rebuild_min_tokens=1))
    xs: list[npt.NDArray[np.float64]] = []
    ys: list[npt.NDArray[np.int8]] = []
    try:
        for record in records:
            drafter = Drafter(VOCAB, config, live.datastore)
            x, y, _, _ = collect(drafter, _training([record]), CANDIDATE_BUDGET)
            xs.append(x)
            ys.append(y)
            live.ingest([record])
    finally:
        live.close()
    return np.concatenate(xs), np.concatenate(ys)


def calibrate(
    score: NodeScore, x: npt.NDArray[np.float64], y: npt.NDArray[np.int8]
) -> tuple[NodeScore, float, float]:
    """``score`` with its logit refitted as ``a * z + b`` (logistic regression on z)."""
    linear_model = import_module("sklearn.linear_model")
    z = x @ np.asarray(score.weights) + score.bias
    model = linear_model.LogisticRegression().fit(z[:, None], y)
    a, b = float(model.coef_[0][0]), float(model.intercept_[0])
    scaled = dataclasses.replace(
        score, weights=tuple(a * w for w in score.weights), bias=a * score.bias + b
    )
    return scaled, a, b


def second_half_tau(
    records: Sequence[Record], half: int, budget: int, score: NodeScore | None,
    live: bool, base: Sequence[SubIndex],
) -> float:
    config = DraftConfig(node_score=score.as_config() if score is not None else ())
    settings = ReplaySettings(method="both", budget=budget, config=config, live=live)
    if live:
        # Batch 1 finishes records in order: finished[half:] is the second half.
        result = replay(records, settings)
        tail = result.finished[half:]
        return sum(n for n, _ in tail) / sum(steps for _, steps in tail)
    return replay(records[half:], settings, base).tau


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sets", nargs="*", default=list(DEV_SETS))
    parser.add_argument("--modes", nargs="*", default=["corpus", "live"])
    args = parser.parse_args(argv)
    command = "python -m drafter_bench.calibration_bound " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    documents = list(iter_documents(args.data_dir / CORPUS, vocab_size=VOCAB))
    base = [SubIndex.build(documents, VOCAB)]
    del documents
    shipped = default_node_score()
    shipped_config = DraftConfig(node_score=shipped.as_config())
    with args.out.open("a") as out:
        for name in args.sets:
            records = read_records(args.data_dir / "dev" / f"{name}.jsonl.gz", vocab_size=VOCAB)
            half = len(records) // 2
            for mode in args.modes:
                live = mode == "live"
                x, y = (
                    collect_live(records[:half], shipped_config)
                    if live
                    else collect_corpus(records[:half], base, shipped_config)
                )
                refit = fit(x, y, f"{name} first half ({mode})")
                calibrated, a, b = calibrate(shipped, x, y)
                for budget in (16, 32):
                    taus = {
                        label: round(second_half_tau(records, half, budget, score, live, base), 4)
                        for label, score in (
                            ("hand", None), ("shipped", shipped),
                            ("calibrated", calibrated), ("refit", refit),
                        )
                    }
                    row = {
                        "data": name, "mode": mode, "budget": budget, **taus,
                        "calibration_a": round(a, 4), "calibration_b": round(b, 4),
                        "fit_records": half, "eval_records": len(records) - half,
                        "fit_nodes": len(y), "command": command,
                    }
                    print(json.dumps(row), file=out, flush=True)
                    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
