"""Ablation of the learned node score (issue 15): what each group of features gains.

Fits the node score as ``datastore-builder train-score`` does (held-out corpus records
replayed against the rest), once with every feature and once without each group
(columns zeroed before the fit), then replays the dev sets against the whole corpus
(corpus mode, method ``both``) with each score and with the hand-set fusion. One JSON
line per (variant, dev set, budget).

Example::

    python -m drafter_bench.node_score_ablation --data-dir ../shared/data \\
        --out benchmarks/results/node_score_ablation.jsonl
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from datastore_builder.score_training import (
    collect,
    fit,
    read_training_records,
    share_datastore_weights,
    split_holdout,
)
from drafter_bench.replay import ReplaySettings, replay
from drafter_bench.token_records import LLAMA3_VOCAB_SIZE, data_name, iter_documents, read_records
from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import SCORE_FEATURES, Drafter

CORPUS = "corpus/datastore_llama3_family.jsonl.gz"
DEV_SETS = (
    "dev/chat_alpacaeval_llama3_8b.jsonl.gz",
    "dev/code_humaneval_llama31_8b.jsonl.gz",
    "dev/multilingual_mtbench_suzume.jsonl.gz",
)
_SOURCES = ("input_", "base_", "live_")
GROUPS: dict[str, tuple[str, ...]] = {
    "all": (),
    "no_ngram": ("unigram_seen", "bigram_seen", "trigram_seen"),
    "no_sources": tuple(
        f for f in SCORE_FEATURES
        if f.startswith(_SOURCES) and f not in ("input_match", "input_members")
    ),
    "no_hand": ("log_hand_cond", "log_over_best"),
    "no_siblings": ("log_siblings", "log_over_best"),
}
"""Variant -> the features left out of its fit."""


def emit_row(row: Mapping[str, object], out: Path | None) -> None:
    """Prints ``row`` as one JSON line, and appends it to ``out`` when given."""
    line = json.dumps(row)
    print(line, flush=True)
    if out is not None:
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drafter_bench.node_score_ablation")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--holdout", type=int, default=300)
    parser.add_argument("--candidate-budget", type=int, default=256)
    parser.add_argument("--out", type=Path, help="also append the JSON lines here")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "drafter_bench.node_score_ablation",
                          *(argv if argv is not None else sys.argv[1:])])  # fmt: skip
    vocab = LLAMA3_VOCAB_SIZE
    records = read_training_records(args.data_dir / CORPUS, vocab)
    held, rest = split_holdout(records, args.holdout, seed=0)
    drafter = Drafter(vocab, DraftConfig(), Datastore([SubIndex.build(rest, vocab)], vocab))
    x, y, _, _ = collect(drafter, held, args.candidate_budget)
    configs = {"hand": DraftConfig()}
    for name, dropped in GROUPS.items():
        masked = x.copy()
        for feature in dropped:
            masked[:, SCORE_FEATURES.index(feature)] = 0.0
        score = share_datastore_weights(fit(masked, y, name), masked)
        configs[name] = DraftConfig(node_score=score.as_config())
    whole = [SubIndex.build(iter_documents(args.data_dir / CORPUS, vocab_size=vocab), vocab)]
    for dev in DEV_SETS:
        dev_records = read_records(args.data_dir / dev, vocab_size=vocab)
        for name, config in configs.items():
            for budget in (16, 32):
                settings = ReplaySettings("both", budget, config=config)
                result = replay(dev_records, settings, whole)
                row = {"variant": name, "dropped": list(GROUPS.get(name, ())),
                       "data": data_name(dev), "mode": "corpus", "budget": budget,
                       "tau": round(result.tau, 4), "steps": result.steps,
                       "command": command}  # fmt: skip
                emit_row(row, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
