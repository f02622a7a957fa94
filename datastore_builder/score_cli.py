"""``datastore-builder train-score``: fits the learned node score and ships it with a
snapshot (docs/algorithm.md, "The learned node score").

Example (a corpus replayed against itself, the score added to the snapshot built from
it; the sub-index files are hardlinked, not copied)::

    datastore-builder train-score --records corpus.jsonl.gz \\
        --snapshot /srv/datastore/snap-001 --output /srv/datastore/snap-002
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from datastore_builder.score_training import read_training_records, train
from drafter_service.corpus.build_errors import BuildError
from drafter_service.drafting.draft_config import DraftConfig, config_pair_argument
from drafter_service.drafting.node_score import METADATA_KEY
from drafter_service.snapshot.store import load_snapshot, write_snapshot


def add_train_score_parser(subparsers: Any, positive: Any) -> None:
    """Registers ``train-score``."""
    p = subparsers.add_parser(
        "train-score",
        help="fit the learned node score on a corpus replayed against itself",
        description="Replays held-out token-id records against a datastore of the others, "
        "fits P(draft node accepted | parent accepted) by logistic regression, and writes "
        "it into a copy of a snapshot (--snapshot/--output) and/or a JSON file "
        "(--score-out). Needs scikit-learn (the 'train' extra).",
    )
    p.add_argument(
        "--records", required=True, type=Path, metavar="PATH",
        help="token-id records (.jsonl[.gz], .parquet) with a prompt and an output field",
    )  # fmt: skip
    p.add_argument("--prompt-field", default="prompt_ids", metavar="NAME")
    p.add_argument("--output-field", default="output_ids", metavar="NAME")
    p.add_argument("--snapshot", type=Path, metavar="DIR", help="the snapshot to add it to")
    p.add_argument("--output", type=Path, metavar="DIR", help="the new snapshot (with --snapshot)")
    p.add_argument("--score-out", type=Path, metavar="FILE", help="also write the score's JSON")
    p.add_argument(
        "--vocab-size", type=positive, metavar="N",
        help="token ids are below N (default: the snapshot's vocabulary)",
    )  # fmt: skip
    p.add_argument(
        "--holdout", type=positive, default=300, metavar="N",
        help="records replayed for training (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--candidate-budget", type=positive, default=256, metavar="N",
        help="nodes of the candidate tree labelled at each position (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--config", action="append", default=[], type=config_pair_argument, metavar="KEY=VALUE",
        help="a DraftConfig field of the drafting the score is for, as drafter serve's "
        "--draft-config (the candidates it learns from are drafted with it); repeatable",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="of the held-out sample")
    p.add_argument("--quiet", action="store_true", help="no progress")


def run_train_score(args: argparse.Namespace) -> int:
    """Runs ``train-score``; raises :class:`BuildError` (:class:`SnapshotError` for the
    snapshots) naming what is wrong."""
    if args.snapshot is None and args.score_out is None:
        raise BuildError("nothing to write: give --snapshot DIR --output DIR and/or --score-out")
    if (args.snapshot is None) != (args.output is None):
        raise BuildError("--snapshot and --output go together")
    if args.output is not None and (args.output.exists() or args.output.is_symlink()):
        raise BuildError(f"{args.output}: already exists; the builder never overwrites")
    datastore = info = None
    vocab_size = args.vocab_size
    if args.snapshot is not None:
        datastore, info = load_snapshot(args.snapshot)
        vocab_size = vocab_size or info.tokenizer.vocab_size
    if vocab_size is None:
        raise BuildError("give --vocab-size (or --snapshot, whose vocabulary is used)")
    records = read_training_records(args.records, vocab_size, args.prompt_field, args.output_field)

    def progress(done: int) -> None:
        if not args.quiet:
            # Three passes over the held-out records: against the datastore, with a live
            # source beside it, and with requests in flight beside it (the recent tier).
            print(f"\rreplayed {done}/{3 * min(args.holdout, len(records))} records",
                  end="", file=sys.stderr, flush=True)  # fmt: skip

    overrides = dict(args.config)
    if "max_budget" in overrides:
        raise BuildError("--config: max_budget is not set here (--candidate-budget sizes the "
                         "trees learned from)")  # fmt: skip
    try:
        config = DraftConfig(**overrides)
    except (TypeError, ValueError) as exc:
        raise BuildError(f"--config: {exc}") from None
    trained_on = (f"{args.records.name}: {args.holdout} held-out records, candidate budget "
                  f"{args.candidate_budget}, seed {args.seed}")  # fmt: skip
    if overrides:
        trained_on += ", " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    score, report = train(
        records, vocab_size, holdout=args.holdout, seed=args.seed,
        candidate_budget=args.candidate_budget, config=config, trained_on=trained_on,
        progress=progress,
    )  # fmt: skip
    if not args.quiet:
        print(file=sys.stderr)
    print(
        f"fitted on {report.nodes:,} nodes ({report.live_nodes:,} of them with a live source; "
        f"{report.positions:,} positions of {report.records} records, twice; "
        f"{report.positive_rate:.3f} accepted): held-out log-loss "
        f"{report.validation_logloss:.4f} (always the base rate: {report.base_logloss:.4f})"
    )
    recent = report.recent
    print(
        f"recent tier: {recent.nodes:,} nodes it proposed with requests in flight; held-out "
        f"log-loss {recent.validation_logloss:.4f} (its weights at 0: {recent.before_logloss:.4f})"
    )
    if args.score_out is not None:
        args.score_out.write_text(json.dumps(score.to_json(), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.score_out}")
    if datastore is not None and info is not None:
        new = write_snapshot(
            args.output, datastore, info.tokenizer,
            wal_position=info.wal_position,
            metadata={**info.metadata, METADATA_KEY: score.to_json()},
        )  # fmt: skip
        print(f"wrote {new.path}: {info.path}'s sub-indices with the node score")
    return 0
