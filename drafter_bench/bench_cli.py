"""``drafter-bench``: benchmarks of the drafter, one subcommand each (:data:`DESCRIPTION`;
the example of ``--help`` is :data:`EPILOG`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from datastore_builder.builder_cli import positive
from drafter_bench.engine_bench import add_engine_parser
from drafter_bench.gpu_bench import add_gpu_parser
from drafter_bench.live_replay import LIVE_BASE_LAYOUTS
from drafter_bench.load import add_load_parser
from drafter_bench.replay import METHODS, USES_DATASTORE, ReplaySettings, replay, sibling_groups
from drafter_bench.scale_bench import add_scale_parser
from drafter_bench.token_records import (
    LLAMA3_VOCAB_SIZE,
    DataError,
    data_name,
    iter_documents,
    read_records,
)
from drafter_bench.worker_bench import add_worker_parser
from drafter_service.datastore.sub_indices import SubIndex
from drafter_service.drafting.draft_config import DraftConfig, config_pair_argument
from drafter_service.drafting.node_score import NodeScoreError, resolve_node_score
from drafter_service.live.live_datastore import LivePolicy
from drafter_service.snapshot.store import SnapshotError, load_snapshot

REPORT_KEYS = (
    "data", "method", "budget", "mode", "tau", "steps", "output_tokens", "records",
    "accepted_tokens", "draft_us_p50", "draft_us_p99", "batch_ms_p50", "batch_ms_p99",
    "datastore_tokens", "build_s", "live_rebuilds", "live_rebuild_s", "wall_s",
    "batch", "threads", "live_base",
)  # fmt: skip
"""Keys of every JSON report line (null where a value does not apply)."""


def add_replay_parser(subparsers: Any) -> None:
    """Registers ``replay`` (greedy replay of recorded outputs)."""
    p = subparsers.add_parser(
        "replay",
        help="greedy replay: tokens per step (tau) of drafting methods on recorded outputs",
        description="Replays recorded generations: at each step the method drafts, the longest "
        "tree path matching the real output is accepted, plus one bonus token.",
    )
    p.add_argument("--data", required=True, metavar="FILE", help="records (.jsonl[.gz])")
    p.add_argument(
        "--corpus", metavar="FILE", help="prebuild a datastore from these records' output_ids"
    )
    p.add_argument(
        "--budget",
        type=positive,
        action="append",
        metavar="N",
        help="draft budget (tree nodes); repeatable (default 16)",
    )
    p.add_argument(
        "--sources",
        action="append",
        choices=METHODS,
        metavar="METHOD",
        help="input|datastore|both|pld; repeatable (default both)",
    )
    p.add_argument(
        "--pld",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the PLD (vLLM ngram) baseline (default on)",
    )
    p.add_argument("--pld-min", type=positive, default=1, help="shortest n-gram (default 1)")
    p.add_argument("--pld-max", type=positive, default=4, help="longest n-gram (default 4)")
    p.add_argument(
        "--snapshot",
        metavar="DIR",
        help="load the datastore from a snapshot (e.g. written by datastore-builder)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="finished records (last 3 prompt tokens + output) join the live datastore",
    )
    p.add_argument(
        "--live-rebuild-tokens",
        type=positive,
        default=1,
        metavar="N",
        help="live policy: rebuild once N tokens wait (default 1: every finished record "
        "joins before the next starts)",
    )
    p.add_argument(
        "--live-sub-index-tokens",
        type=positive,
        default=512_000_000,
        metavar="N",
        help="live policy: text positions per sub-index (default 512M)",
    )
    p.add_argument(
        "--live-base",
        choices=LIVE_BASE_LAYOUTS,
        default="pinned",
        help="with --live and --corpus/--snapshot, how the base joins the live datastore: "
        "pinned = a pinned corpus, drafted from as a source of its own beside sub-indices of "
        "the finished records (as drafter serve --snapshot seeds it and the admin API adds a "
        "corpus; default); seed = its initial learned snapshot, finished records fold into "
        "its newest sub-index and share its samples (one index)",
    )
    p.add_argument("--batch", type=positive, default=1, help="records in lockstep (default 1)")
    p.add_argument(
        "--siblings",
        type=positive,
        metavar="N",
        help="replay groups of N records that answer one prompt, each group in N lanes at "
        "once (parallel sampling, RL rollouts): the first N answers of every prompt with at "
        "least N; --batch must be a multiple of N (default N). With the recent tier on "
        "(--config recent_samples=S) siblings draft from each other",
    )
    p.add_argument(
        "--stagger",
        type=int,
        default=0,
        metavar="S",
        help="with --siblings: sibling j starts S * j steps after the first (default 0: "
        "lockstep)",
    )
    p.add_argument(
        "--curve",
        type=positive,
        metavar="N",
        help="also report tau over each window of N finished records (tau_curve)",
    )
    p.add_argument("--limit", type=positive,
                   help="replay only the first N records (with --siblings: of the groups)")
    p.add_argument("--threads", type=positive, default=1, help="drafter threads (default 1)")
    p.add_argument(
        "--config",
        type=config_pair_argument,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a DraftConfig field; repeatable",
    )
    p.add_argument(
        "--datastore-via",
        choices=("drafter", "context"),
        default="drafter",
        help="datastore-only drafting: Drafter with a depth-1 input trie (default) "
        "or _core.draft_context(use_input=False); identical trees",
    )
    p.add_argument(
        "--ceiling",
        type=positive,
        metavar="C",
        help="recall ceiling instead of tau: draft C-node trees and accept at most --budget "
        "tokens of each; what the best --budget-node choice among each step's C candidates "
        "would reach (the bound of any node score); needs C >= every --budget and "
        "--config max_budget >= C",
    )
    p.add_argument(
        "--chain",
        type=positive,
        metavar="K",
        help="verify chains as vLLM does: each step's --budget-node tree becomes its best "
        "chain of at most K tokens (drafter methods); rows add drafted_per_step",
    )
    p.add_argument(
        "--chain-rule",
        metavar="SPEC",
        help="with --chain: at most what this budget rule (a GPU profile such as h100, or "
        "FLOPS/BW) lets a batch of --batch verify for free, as the vLLM plug-in's chain_rule "
        "does (none past the ridge point)",
    )
    p.add_argument(
        "--chain-min-score",
        type=float,
        default=0.0,
        metavar="S",
        help="with --chain: end each chain before a node scored below S (with the learned "
        "score, the estimated probability that the path is accepted; default 0)",
    )
    p.add_argument(
        "--node-score",
        default="default",
        metavar="hand|default|FILE",
        help="how draft nodes are scored: default = the learned node score shipped with "
        "the package, what drafter serve drafts with (the default), hand = the hand-set "
        "SSSD fusion, FILE = a node score's JSON (datastore-builder train-score --score-out)",
    )
    p.add_argument("--vocab-size", type=positive, default=LLAMA3_VOCAB_SIZE)
    p.add_argument("--json", action="store_true", help="one JSON object per configuration")
    p.set_defaults(func=run_replay)


def _node_score(name: str) -> tuple[float, ...]:
    """``--node-score``'s DraftConfig value, chosen as ``drafter serve`` chooses it (no
    snapshot score: the replay builds its datastore itself)."""
    try:
        return resolve_node_score(name, None, "--node-score")
    except NodeScoreError as exc:
        raise DataError(str(exc)) from None


def _percentile(values: Sequence[int], q: float, scale: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(np.asarray(values, dtype=np.float64), q)) / scale, 3)


def run_replay(args: argparse.Namespace) -> int:
    """Runs every (budget, method) configuration and prints one report each."""
    if args.pld_min > args.pld_max:
        raise DataError(f"--pld-min {args.pld_min} exceeds --pld-max {args.pld_max}")
    config = replace(DraftConfig(**dict(args.config)), node_score=_node_score(args.node_score))
    wanted = set(args.sources or ["both"]) | ({"pld"} if args.pld else set())
    methods = [m for m in METHODS if m in wanted]
    budgets = list(dict.fromkeys(args.budget or [16]))
    if args.ceiling is not None:
        if args.ceiling < max(budgets):
            raise DataError(f"--ceiling {args.ceiling} is below --budget {max(budgets)}")
        if args.ceiling > config.max_budget and methods != ["pld"]:
            raise DataError(f"--ceiling {args.ceiling} exceeds max_budget {config.max_budget} "
                            "(raise it with --config max_budget=N)")  # fmt: skip
    too_big = [b for b in budgets if b > config.max_budget and methods != ["pld"]]
    if too_big:
        raise DataError(
            f"budget {too_big[0]} exceeds max_budget {config.max_budget} "
            "(raise it with --config max_budget=N)"
        )
    live_base = args.live and bool(args.corpus or args.snapshot)
    if args.live_base != "pinned" and not live_base:
        raise DataError(f"--live-base {args.live_base} needs --live and --corpus or --snapshot")
    records = read_records(args.data, vocab_size=args.vocab_size,
                           limit=None if args.siblings else args.limit)  # fmt: skip
    if args.stagger < 0 or (args.stagger and not args.siblings):
        raise DataError(f"--stagger {args.stagger} needs --siblings and must be >= 0")
    if args.siblings:
        records = sibling_groups(records, args.siblings)
        if args.limit:  # whole groups
            records = records[: max(1, args.limit // args.siblings) * args.siblings]
        if not records:
            raise DataError(f"{args.data}: no prompt has {args.siblings} answers (--siblings)")
        if args.batch == 1:
            args.batch = args.siblings
        if args.batch % args.siblings:
            raise DataError(f"--batch {args.batch} is not a multiple of --siblings "
                            f"{args.siblings}")  # fmt: skip
    base: list[SubIndex] = []
    build_s = load_s = None
    if args.corpus and args.snapshot:
        raise DataError("give --corpus or --snapshot, not both")
    if args.snapshot:
        start = time.perf_counter()
        try:
            loaded, info = load_snapshot(args.snapshot)
        except SnapshotError as exc:
            raise DataError(str(exc)) from None
        if info.tokenizer.vocab_size < args.vocab_size:
            raise DataError(
                f"snapshot {args.snapshot} has vocab_size {info.tokenizer.vocab_size}, "
                f"smaller than --vocab-size {args.vocab_size} of the data"
            )
        # A tokenizer file may add ids past the model's (Llama 3.2's <|image|>): the
        # drafter takes the snapshot's vocabulary; the data's ids were checked already.
        args.vocab_size = info.tokenizer.vocab_size
        base.extend(loaded.sub_indices)
        load_s = build_s = time.perf_counter() - start
        if not args.json:
            print(f"snapshot: {loaded.num_tokens:,} positions, loaded in {load_s:.2f} s",
                  file=sys.stderr)
    if args.corpus:
        start = time.perf_counter()
        documents = list(iter_documents(args.corpus, vocab_size=args.vocab_size))
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        base.append(SubIndex.build(documents, args.vocab_size))
        build_s = time.perf_counter() - start
        del documents
        if not args.json:
            print(
                f"corpus: {base[0].num_tokens:,} positions, loaded in {load_s:.1f} s, "
                f"built in {build_s:.2f} s",
                file=sys.stderr,
            )
    sources = (("corpus", args.corpus), ("snapshot", args.snapshot), ("live", args.live))
    mode = "+".join(m for m, on in sources if on) or "none"
    settings = ReplaySettings(
        method="",
        budget=0,
        batch=args.batch,
        threads=args.threads,
        config=config,
        pld_min=args.pld_min,
        pld_max=args.pld_max,
        live=args.live,
        live_base=args.live_base,
        live_policy=LivePolicy(
            rebuild_min_tokens=args.live_rebuild_tokens,
            max_sub_index_tokens=args.live_sub_index_tokens,
            snapshot_interval_s=0,
        ),
        vocab_size=args.vocab_size,
        datastore_via=args.datastore_via,
        ceiling=args.ceiling or 0,
        chain=_chain_length(args),
        chain_min_score=args.chain_min_score,
        siblings=args.siblings or 0,
        stagger=args.stagger,
    )
    if args.chain and "pld" in methods:
        raise DataError("--chain needs drafter methods (input, datastore, both), not pld")
    rows = []
    for budget in budgets:
        for method in methods:
            result = replay(records, replace(settings, method=method, budget=budget), base)
            uses_store = method in USES_DATASTORE
            row: dict[str, object] = {
                "data": data_name(args.data), "method": method, "budget": budget, "mode": mode,
                "tau": round(result.tau, 4), "steps": result.steps,
                "output_tokens": result.output_tokens, "records": result.records,
                "accepted_tokens": result.accepted_tokens,
                "draft_us_p50": _percentile(result.draft_ns, 50, 1e3),
                "draft_us_p99": _percentile(result.draft_ns, 99, 1e3),
                "batch_ms_p50": _percentile(result.batch_ns, 50, 1e6),
                "batch_ms_p99": _percentile(result.batch_ns, 99, 1e6),
                "datastore_tokens": result.datastore_tokens,
                "build_s": round(build_s, 3) if build_s is not None and uses_store else None,
                "live_rebuilds": result.live_rebuilds if args.live and uses_store else None,
                "live_rebuild_s": (round(result.live_rebuild_s, 3)
                                   if args.live and uses_store else None),
                "wall_s": round(result.wall_s, 3), "batch": args.batch, "threads": args.threads,
                "live_base": args.live_base if live_base and uses_store else None,
                "node_score": args.node_score if method != "pld" else None,
                "recent_samples": config.recent_samples if method != "pld" else None,
            }  # fmt: skip
            if args.siblings:
                row["siblings"], row["stagger"] = args.siblings, args.stagger
            if method == "pld":
                row["pld_n"] = [args.pld_min, args.pld_max]
            if load_s is not None and uses_store:
                row["corpus_load_s"] = round(load_s, 3)
            if args.ceiling:
                row["ceiling"] = args.ceiling
            if args.chain:
                row["chain"], row["chain_min_score"] = settings.chain, args.chain_min_score
                row["chain_rule"] = args.chain_rule
                row["drafted_per_step"] = round(result.drafted_tokens / max(1, result.steps), 4)
            if args.curve:
                row["tau_curve"] = [[n, round(t, 4)] for n, t in result.tau_curve(args.curve)]
            if args.json:
                print(json.dumps(row), flush=True)
            rows.append(row)
    if not args.json:
        print_table(rows)
    return 0


def _chain_length(args: argparse.Namespace) -> int | None:
    """Chain tokens per step: --chain, capped by --chain-rule's budget at --batch (the
    replay's lockstep batch; 0 past the ridge point); None (trees) without --chain."""
    if not args.chain:
        if args.chain_rule:
            raise DataError("--chain-rule needs --chain (the longest chain)")
        return None
    if not args.chain_rule:
        return int(args.chain)
    from verifier_client.budget import BudgetRule

    try:
        rule = BudgetRule.parse(args.chain_rule)
    except ValueError as exc:
        raise DataError(f"--chain-rule: {exc}") from None
    return min(int(args.chain), rule.draft_budget(args.batch))


def print_table(rows: Sequence[dict[str, object]]) -> None:
    """Readable table of report rows (a subset of the keys)."""
    cols = ("data", "method", "budget", "mode", "tau", "steps", "output_tokens",
            "draft_us_p50", "draft_us_p99", "batch_ms_p50", "batch_ms_p99",
            "live_rebuild_s", "wall_s")  # fmt: skip
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


DESCRIPTION = (
    "Benchmarks of the drafter on recorded model outputs, one subcommand each;\n"
    "'drafter-bench COMMAND --help' lists a subcommand's options."
)
EPILOG = """example (tau of three drafting sources at two budgets, as JSON):
  drafter-bench replay --data dev.jsonl.gz --corpus corpus.jsonl.gz \\
      --budget 16 --budget 32 --sources input --sources datastore --sources both --json"""


def build_parser() -> argparse.ArgumentParser:
    """The ``drafter-bench`` parser with one sub-parser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="drafter-bench", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_replay_parser(subparsers)
    add_load_parser(subparsers)
    add_worker_parser(subparsers)
    add_engine_parser(subparsers)
    add_scale_parser(subparsers)
    add_gpu_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``drafter-bench``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (DataError, ValueError, TypeError) as exc:
        print(f"drafter-bench {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
