"""What the recent tier gives siblings in flight, and what it costs everyone else (issue 31).

Siblings: the corpus answers each of 400 AlpacaEval prompts 24-25 times (25 Llama-3-family
models) and each MMLU-Pro question twice; groups of N answers to one prompt are replayed
in N lanes at once (``drafter-bench replay --siblings N``), in lockstep or staggered (the
j-th sibling starts ``stagger * j`` steps after the first), with and without the tier, no
datastore (what siblings give each other is the question). The same records, the same
lanes, the same drafter: the rows differ only in ``recent_samples``.

Everyone else: the dev sets against the 6.4M-token corpus datastore in lockstep batches of
unrelated requests (``--dev-batch``), with and without the tier: tau and the batch's step
time. Follow-up turns are left out (:func:`first_turns`): a second turn's prompt holds the
first turn's answer, and the two cannot be in flight together. Last, the step's cost: chat
in batches of 64 at budget 32, with and without the tier; and the per-request latency
(one request a call, one thread, budget 32, the corpus datastore; the request's own tokens
in the tier), with and without it. ``--phase`` picks phases (default: all).

    python -m drafter_bench.recent_tier --data-dir ../shared/data \
        --out benchmarks/results/recent_tier.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np

from drafter_bench.replay import ReplaySettings, replay, sibling_groups
from drafter_bench.token_records import Record, iter_documents, read_records
from drafter_service.datastore.sub_indices import SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.node_score import default_node_score

CORPUS = "corpus/datastore_llama3_family.jsonl.gz"
DEV_SETS = ("chat_alpacaeval_llama3_8b", "code_humaneval_llama31_8b", "multilingual_mtbench_suzume")
VOCAB = 128256
PHASES = ("siblings", "unrelated", "step", "latency")
TIER_SAMPLES = 16
"""The tier's recent_samples measured (recent_candidates at its default, 64), at
recent_min_match 2 (the default) and 1."""


def first_turns(records: list[Record], n: int = 8) -> list[Record]:
    """``records`` less those whose prompt holds another record's output (a follow-up
    turn, e.g. MT-Bench's second turns): one could not be in flight before the other
    finished, so replaying both in one batch would let the first draft from its own
    future answer. Known by another record's first ``n`` output tokens in the prompt, or
    by an id naming a later turn (``...-t2``)."""
    starts: dict[tuple[int, ...], set[int]] = {}
    for i, r in enumerate(records):
        if len(r.output_ids) >= n:
            starts.setdefault(tuple(r.output_ids[:n].tolist()), set()).add(i)
    kept = []
    for i, r in enumerate(records):
        prompt = r.prompt_ids.tolist()
        owners = set().union(*(starts.get(tuple(prompt[j : j + n]), set())
                               for j in range(len(prompt) - n + 1)))  # fmt: skip
        later_turn = re.search(r"-t([0-9]+)$", r.id)  # MT-Bench's ids: <conversation>-t<turn>
        if not owners - {i} and not (later_turn and int(later_turn.group(1)) > 1):
            kept.append(r)
    return kept


def _row(kind: str, settings: ReplaySettings, result: object, **extra: object) -> dict[str, object]:
    r = result  # a ReplayResult
    batch_ms = np.asarray(r.batch_ns, dtype=np.float64) / 1e6  # type: ignore[attr-defined]
    draft_us = np.asarray(r.draft_ns, dtype=np.float64) / 1e3  # type: ignore[attr-defined]
    if len(draft_us):  # batch 1: per-request latency
        extra = {**extra, "draft_us_p50": round(float(np.percentile(draft_us, 50)), 1),
                 "draft_us_p99": round(float(np.percentile(draft_us, 99)), 1)}  # fmt: skip
    return {
        "kind": kind, **extra, "budget": settings.budget, "batch": settings.batch,
        "recent_samples": settings.config.recent_samples,
        "recent_min_match": settings.config.recent_min_match,
        "tau": round(r.tau, 4),  # type: ignore[attr-defined]
        "records": r.records, "steps": r.steps,  # type: ignore[attr-defined]
        "batch_ms_p50": round(float(np.percentile(batch_ms, 50)), 4) if len(batch_ms) else None,
        "batch_ms_p99": round(float(np.percentile(batch_ms, 99)), 4) if len(batch_ms) else None,
        "wall_s": round(r.wall_s, 2),  # type: ignore[attr-defined]
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--sibling-records", type=int, default=1600,
                        help="records per sibling replay (whole groups; default 1600)")
    parser.add_argument("--siblings", type=int, action="append",
                        help="group sizes (default 2, 4, 8)")
    parser.add_argument("--stagger", type=int, action="append",
                        help="steps between siblings' starts (default 0 and 8)")
    parser.add_argument("--dev-batch", type=int, default=16)
    parser.add_argument("--phase", action="append", choices=PHASES,
                        help="phases to run (repeatable; default: all)")
    args = parser.parse_args(argv)
    phases = set(args.phase or PHASES)
    score = default_node_score().as_config()
    plain = DraftConfig(node_score=score, recent_samples=0)  # the tier is on by default
    tiers = [dataclasses.replace(plain, recent_samples=TIER_SAMPLES, recent_min_match=k)
             for k in (2, 1)]  # fmt: skip
    corpus_path = args.data_dir / CORPUS
    rows: list[dict[str, object]] = []
    out = args.out.open("w")

    def emit(row: dict[str, object]) -> None:
        rows.append(row)
        print(json.dumps(row), file=out, flush=True)
        print(json.dumps(row), file=sys.stderr)

    if "siblings" in phases:
        corpus = read_records(corpus_path, vocab_size=VOCAB)
        for n in args.siblings or [2, 4, 8]:
            groups = sibling_groups(corpus, n)[: (args.sibling_records // n) * n]
            for stagger in args.stagger or [0, 8]:
                for config in (plain, *tiers):
                    settings = ReplaySettings("both", args.budget, batch=n, config=config,
                                              siblings=n, stagger=stagger)  # fmt: skip
                    emit(_row("siblings", settings, replay(groups, settings), siblings=n,
                              stagger=stagger))  # fmt: skip
        del corpus
    if phases - {"siblings"}:
        base = [SubIndex.build(list(iter_documents(corpus_path, vocab_size=VOCAB)), VOCAB)]
    for name in DEV_SETS if "unrelated" in phases else ():
        records = first_turns(
            read_records(args.data_dir / "dev" / f"{name}.jsonl.gz", vocab_size=VOCAB)
        )
        for config in (plain, *tiers):
            settings = ReplaySettings("both", args.budget, batch=args.dev_batch,
                                      config=config)  # fmt: skip
            emit(_row("unrelated", settings, replay(records, settings, base), data=name,
                      kept=len(records)))  # fmt: skip
    if "step" in phases:  # the step's cost: 64 requests a call at budget 32
        chat = first_turns(read_records(args.data_dir / "dev" / f"{DEV_SETS[0]}.jsonl.gz",
                                        vocab_size=VOCAB))  # fmt: skip
        for config in (plain, tiers[0]):
            settings = ReplaySettings("both", 32, batch=64, config=config)
            emit(_row("step", settings, replay(chat, settings, base), data=DEV_SETS[0]))
    for name in DEV_SETS if "latency" in phases else ():  # one request a call, budget 32
        records = read_records(args.data_dir / "dev" / f"{name}.jsonl.gz", vocab_size=VOCAB)
        for config in (plain, tiers[0]):
            settings = ReplaySettings("both", 32, batch=1, config=config)
            emit(_row("latency", settings, replay(records, settings, base), data=name))
    out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
