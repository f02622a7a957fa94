"""Headroom of a learned node score: rerank today's candidate trees, measure tau.

A study for issue 15 (item 1). For every replay position the Drafter (method ``both``,
corpus mode) drafts a large candidate tree (``--candidate-budget``, 256 by default) with
:meth:`Drafter.explain`, which also says what fusion knew of each node (its sources'
counts, the input match length, ...: ``SCORE_FEATURES``). Models of P(node right | parent
right) are trained on features read off that tree's tokens, parents and scores, on the
request's context, and on the native features; the ``budget``-node subtree with the
highest path probabilities (a node needs its parent) is then verified against the
recorded output. Three numbers per dev set and budget, each from its own greedy
trajectory over the same records:

- ``baseline``: the native tree of that budget (what ``drafter-bench replay`` measures);
- ``reranked``: the learned subtree of the candidate tree;
- ``oracle``: the candidate tree's accepted length capped at the budget (recall ceiling).

Also reported: ``rescored`` (the top nodes of the candidate tree by the native score: a
check that it reproduces ``baseline``); ``reranked_by_model``, tau of every model: the
regression on the output and context features (``full``, reported as ``reranked``),
without the context (``tree_only``), on what a native scorer knows when it offers a
candidate (``pushed``), on everything (``all``) and, with ``--gbdt``, gradient-boosted
trees on the output features (``gbdt``), ``gbdt_pushed`` and ``gbdt_all``; and the
log-loss of each model on a fifth of the training records held out.

Training never sees the dev sets: ``--holdout`` records of the corpus (fixed seed) are
replayed against a datastore of the rest of the corpus, less every other answer to the
same prompts (the corpus answers each prompt up to 25 times; the dev sets share no prompt
with it). The dev sets are replayed against a datastore of the whole corpus, as
``drafter-bench replay --corpus`` builds it.

Every position of a record is drafted once (trees at the candidate budget and at each
budget), so each method's trajectory is exact: tau = output tokens / steps, steps
advancing ``accepted + 1`` as in :mod:`drafter_bench.replay`.

Example::

    python -m drafter_bench.rerank_headroom --data-dir ../shared/data --out /tmp/rerank.jsonl

scikit-learn is needed at run time only (``pip install scikit-learn``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from datastore_builder.training_data import labelled_nodes
from drafter_bench.acceptance import accepted_length
from drafter_bench.node_score_ablation import emit_row
from drafter_bench.token_records import LLAMA3_VOCAB_SIZE, Record, data_name, read_records
from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import SCORE_FEATURES, Drafter

FEATURES = (
    "log_parent_score", "log_cond", "depth", "root_child", "log1p_siblings",
    "sibling_rank", "log_score_over_best_sibling", "log1p_children", "token_in_last64",
    "token_in_context", "bigram_in_context", "trigram_in_context", "log_root_top_score",
    "log_parent_cond", "log1p_output_pos",
)  # fmt: skip
"""Features read off the tree's output (and the context), in the column order of
:func:`node_features`. The node's own (path) score is left out: its log is
log_parent_score + log_cond."""

NATIVE_FEATURES = tuple(f"native_{name}" for name in SCORE_FEATURES)
"""Features from what fusion knew of each node when it offered it (:meth:`Drafter.explain`,
:data:`SCORE_FEATURES`): per source whether it offers the node, its conditional and
counts; the input match length and members; the datastore prefixes; the siblings offered
beside it and its rank among them; the context n-grams it extends."""

PUSHED = ("log_parent_score", "log_cond", "depth", "root_child", *NATIVE_FEATURES)
"""Features a native scorer could compute when a candidate is offered (no look at the
finished tree: no rank among siblings, no children)."""

ALL_FEATURES = (*FEATURES, *NATIVE_FEATURES)

CONTEXT_FEATURES = (
    "token_in_last64", "token_in_context", "bigram_in_context", "trigram_in_context",
    "log1p_output_pos",
)  # fmt: skip
"""Features that look at the request's context rather than the tree."""

VARIANTS = {
    "full": FEATURES,
    "tree_only": tuple(f for f in FEATURES if f not in CONTEXT_FEATURES),
    "pushed": PUSHED,
    "all": ALL_FEATURES,
}
"""Models trained and evaluated: name -> the features they use (``full`` is reported as
``reranked``)."""

CORPUS = "corpus/datastore_llama3_family.jsonl.gz"
DEV_SETS = (
    "dev/chat_alpacaeval_llama3_8b.jsonl.gz",
    "dev/code_humaneval_llama31_8b.jsonl.gz",
    "dev/multilingual_mtbench_suzume.jsonl.gz",
)
_EPS = 1e-9
_EMPTY = np.zeros(0, dtype=np.int32)
Array = npt.NDArray[Any]


@dataclass(slots=True)
class _Context:
    """What a record's context has shown so far, for the context features."""

    vocab_size: int
    tokens: list[int] = field(default_factory=list)
    seen: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    bigrams: set[int] = field(default_factory=set)
    trigrams: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.seen = np.zeros(self.vocab_size, dtype=np.bool_)

    def extend(self, new: Sequence[int]) -> None:
        v = self.vocab_size
        for t in new:
            self.tokens.append(t)
            self.seen[t] = True
            if len(self.tokens) >= 2:
                self.bigrams.add(self.tokens[-2] * v + t)
            if len(self.tokens) >= 3:
                self.trigrams.add((self.tokens[-3] * v + self.tokens[-2]) * v + t)


def node_depths(parents: Array) -> Array:
    """Depth of every node (1 = child of the root); parents precede children."""
    depth = np.zeros(len(parents), dtype=np.int64)
    for i, parent in enumerate(parents.tolist()):
        depth[i] = 1 if parent < 0 else depth[parent] + 1
    return depth


def node_features(
    tokens: Array, parents: Array, scores: Array, depth: Array, ctx: _Context, output_pos: int
) -> Array:
    """One row of :data:`FEATURES` per node of a breadth-first tree."""
    n = len(tokens)
    sc = np.maximum(scores.astype(np.float64), _EPS)
    root = parents < 0
    par = np.where(root, 0, parents)
    psc = np.where(root, 1.0, sc[par])
    cond = sc / psc
    pcond = np.where(root, 1.0, cond[par])
    key = parents + 1  # 0 = the root's children
    counts = np.bincount(key, minlength=n + 1)
    order = np.lexsort((-sc, key))
    starts = np.concatenate(([0], np.cumsum(counts)))[:-1]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - starts[key[order]]
    best = np.zeros(n + 1)
    np.maximum.at(best, key, sc)
    ctx_tokens = ctx.tokens
    last = ctx_tokens[-1] if ctx_tokens else -1
    last2 = ctx_tokens[-2] if len(ctx_tokens) >= 2 else -1
    v = ctx.vocab_size
    tok = tokens.tolist()
    prev = [last if p < 0 else tok[p] for p in parents.tolist()]
    prev2 = [
        last2 if p < 0 else (last if parents[p] < 0 else tok[int(parents[p])])
        for p in parents.tolist()
    ]
    bigram = [(a * v + t) in ctx.bigrams for a, t in zip(prev, tok, strict=True)]
    trigram = [
        b >= 0 and ((b * v + a) * v + t) in ctx.trigrams
        for b, a, t in zip(prev2, prev, tok, strict=True)
    ]
    root_top = float(sc[root].max()) if root.any() else _EPS
    recent = np.asarray(ctx_tokens[-64:], dtype=np.int64)
    columns = [
        np.log(psc), np.log(cond), depth, root, np.log1p(counts[key] - 1),
        rank, np.log(sc / best[key]), np.log1p(counts[1:]), np.isin(tokens, recent),
        ctx.seen[tokens], bigram, trigram, np.full(n, math.log(root_top)), np.log(pcond),
        np.full(n, math.log1p(output_pos)),
    ]  # fmt: skip
    return np.column_stack(columns).astype(np.float64)


def native_columns(native: Array) -> Array:
    """:data:`NATIVE_FEATURES` from :data:`SCORE_FEATURES` rows (the same columns)."""
    return native.astype(np.float64)


def matched_depth(tokens: Array, parents: Array, output: Sequence[int], p: int) -> Array:
    """Per node, its depth if its root path equals ``output[p:]``, else 0."""
    left = len(output) - p
    depth = [0] * len(tokens)
    for i, (token, parent) in enumerate(zip(tokens.tolist(), parents.tolist(), strict=True)):
        d = 1 if parent < 0 else depth[parent] + 1 if depth[parent] else 0
        if d and d <= left and token == output[p + d - 1]:
            depth[i] = d
    return np.asarray(depth, dtype=np.int64)


def select_subtree(parents: Array, depth: Array, log_prob: Array, budget: int) -> Array:
    """Indices (ascending) of the ``budget`` nodes with the highest path log-probability;
    with ``log_prob <= 0`` a node never outranks its parent, so the set is a subtree."""
    path = np.zeros(len(parents))
    bounds = np.searchsorted(depth, np.arange(1, int(depth.max(initial=0)) + 2))
    for lo, hi in itertools.pairwise(bounds.tolist()):
        par = parents[lo:hi]
        path[lo:hi] = log_prob[lo:hi] + np.where(par < 0, 0.0, path[np.maximum(par, 0)])
    order = np.lexsort((np.arange(len(parents)), -path))
    return np.sort(order[:budget])


def subtree_accepted(
    tokens: Array, parents: Array, keep: Array, output: Sequence[int], p: int
) -> int:
    """:func:`accepted_length` of the subtree of nodes ``keep`` (ascending, closed)."""
    remap = np.full(len(tokens), -1, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    sub_par = parents[keep]
    new_par = np.where(sub_par < 0, -1, remap[np.maximum(sub_par, 0)])
    return accepted_length(tokens[keep].tolist(), new_par.tolist(), output, p)


def trajectory(accepted: Sequence[int], n: int) -> int:
    """Steps of a greedy replay of ``n`` output tokens with ``accepted[p]`` at position p."""
    p = steps = 0
    while p < n:
        p += min(accepted[p] + 1, n - p)
        steps += 1
    return steps


class Scorer(Protocol):
    """A node model: log P(node right | parent right) for rows of :data:`FEATURES`."""

    def log_prob(self, x: Array) -> Array: ...


@dataclass(slots=True)
class _Model:
    columns: Array
    mean: Array
    scale: Array
    coef: Array
    intercept: float

    def log_prob(self, x: Array) -> Array:
        z = ((x[:, self.columns] - self.mean) / self.scale) @ self.coef + self.intercept
        return -np.logaddexp(0.0, -z)  # log sigmoid


def _draft_positions(
    drafter: Drafter, record: Record, budgets: Sequence[int]
) -> Iterator[tuple[int, list[tuple[Array, Array, Array]], Array]]:
    """(p, one (tokens, parents, scores) per budget, the native features of the first
    budget's tree) at every output position of ``record``."""
    ids = [f"{record.id}#{b}#{i}" for i, b in enumerate(budgets)]
    for rid in ids:
        drafter.start(rid, record.prompt_ids)
    # The first tree comes from explain (same tree, with its features).
    budget_arr = np.asarray([0, *budgets[1:]], dtype=np.int32)
    output = record.output_ids
    try:
        for p in range(len(output)):
            delta = output[p - 1 : p] if p else _EMPTY
            flat = np.concatenate([delta] * len(ids))
            offsets = np.arange(len(ids) + 1, dtype=np.int64) * len(delta)
            batch = drafter.draft_batch(ids, flat, offsets, budget_arr)
            trees = [(t.tokens, t.parents, t.scores) for t in map(batch.tree, range(len(ids)))]
            explained = drafter.explain(ids[0], budgets[0])
            t = explained.tree
            trees[0] = (t.tokens, t.parents, t.scores)
            yield p, trees, explained.features
    finally:
        for rid in ids:
            drafter.stop(rid)


def collect_training(
    drafter: Drafter, records: Sequence[Record], candidate_budget: int, vocab_size: int
) -> tuple[Array, Array, Array, int]:
    """Features, labels and record indices of the labelled nodes (parent on the accepted
    path) at every position of ``records``; and the number of positions."""
    xs: list[Array] = []
    ys: list[Array] = []
    gs: list[Array] = []
    positions = 0
    for index, record in enumerate(records):
        ctx = _Context(vocab_size)
        ctx.extend(record.prompt_ids.tolist())
        output = record.output_ids.tolist()
        for p, [(tokens, parents, scores)], native in _draft_positions(
            drafter, record, [candidate_budget]
        ):
            if p:
                ctx.extend(output[p - 1 : p])
            positions += 1
            if not len(tokens):
                continue
            depth = node_depths(parents)
            labelled, labels = labelled_nodes(parents, tokens, output[p:])
            x = np.hstack([node_features(tokens, parents, scores, depth, ctx, p),
                           native_columns(native)])  # fmt: skip
            xs.append(x[labelled])
            ys.append(labels)
            gs.append(np.full(len(labels), index))
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(gs), positions


def fit(x: Array, y: Array, features: Sequence[str]) -> _Model:
    """Logistic regression on ``features``, standardized (scikit-learn, default C)."""
    linear_model = import_module("sklearn.linear_model")
    columns = np.asarray([ALL_FEATURES.index(f) for f in features])
    x = x[:, columns]
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    lr = linear_model.LogisticRegression(max_iter=2000)
    lr.fit((x - mean) / scale, y)
    return _Model(columns, mean, scale, lr.coef_[0].astype(np.float64), float(lr.intercept_[0]))


@dataclass(slots=True)
class _Gbdt:
    columns: Array
    classifier: Any

    def log_prob(self, x: Array) -> Array:
        p: Array = np.asarray(self.classifier.predict_proba(x[:, self.columns])[:, 1])
        out: Array = np.log(np.clip(p, _EPS, 1.0))
        return out


def fit_gbdt(x: Array, y: Array, features: Sequence[str]) -> _Gbdt:
    """Gradient-boosted trees on ``features`` (scikit-learn's histogram GBDT, defaults)."""
    ensemble = import_module("sklearn.ensemble")
    columns = np.asarray([ALL_FEATURES.index(f) for f in features])
    classifier = ensemble.HistGradientBoostingClassifier(random_state=0)
    classifier.fit(x[:, columns], y)
    return _Gbdt(columns, classifier)


def log_loss(model: Scorer, x: Array, y: Array) -> float:
    """Mean negative log-likelihood of ``y`` under ``model``."""
    lp = model.log_prob(x)
    log_not = np.log(-np.expm1(np.minimum(lp, -1e-12)))
    return float(-np.mean(np.where(y > 0, lp, log_not)))


@dataclass(slots=True)
class _Eval:
    records: int = 0
    output_tokens: int = 0
    steps: dict[str, int] = field(default_factory=dict)

    def tau(self, name: str) -> float:
        return self.output_tokens / self.steps[name] if self.steps.get(name) else 0.0


def evaluate(
    drafter: Drafter,
    records: Sequence[Record],
    models: dict[str, Scorer],
    budgets: Sequence[int],
    candidate_budget: int,
    vocab_size: int,
) -> _Eval:
    """Trajectories of baseline / reranked / oracle (and score-only reselection) per budget.

    Each model scores all of a record's candidate trees in one call."""
    result = _Eval()
    kinds = ["baseline", "oracle", "rescored", *(f"reranked_{m}" for m in models)]
    names = [f"{kind}{b}" for b in budgets for kind in kinds]
    result.steps = dict.fromkeys(names, 0)
    log_cond_col = ALL_FEATURES.index("log_cond")
    for record in records:
        ctx = _Context(vocab_size)
        ctx.extend(record.prompt_ids.tolist())
        output = record.output_ids.tolist()
        n = len(output)
        if not n:
            continue
        acc: dict[str, list[int]] = {name: [0] * n for name in names}
        trees: list[tuple[int, Array, Array, Array]] = []  # p, tokens, parents, depth
        rows: list[Array] = []
        for p, drafted, native in _draft_positions(
            drafter, record, [candidate_budget, *budgets]
        ):
            if p:
                ctx.extend(output[p - 1 : p])
            for b, (bt, bp, _) in zip(budgets, drafted[1:], strict=True):
                acc[f"baseline{b}"][p] = accepted_length(bt.tolist(), bp.tolist(), output, p)
            tokens, parents, scores = drafted[0]
            if not len(tokens):
                continue
            depth = node_depths(parents)
            full = int(matched_depth(tokens, parents, output, p).max(initial=0))
            for b in budgets:
                acc[f"oracle{b}"][p] = min(full, b)
            trees.append((p, tokens, parents, depth))
            rows.append(np.hstack([node_features(tokens, parents, scores, depth, ctx, p),
                                   native_columns(native)]))  # fmt: skip
        if rows:
            x = np.concatenate(rows)
            bounds = np.cumsum([0, *map(len, rows)]).tolist()
            # The native score is a path score: its conditional sums back to it.
            log_probs = {"rescored": x[:, log_cond_col]}
            log_probs.update({f"reranked_{m}": model.log_prob(x) for m, model in models.items()})
            for (p, tokens, parents, depth), lo, hi in zip(trees, bounds, bounds[1:], strict=False):
                for kind, log_prob in log_probs.items():
                    for b in budgets:
                        keep = select_subtree(parents, depth, log_prob[lo:hi], b)
                        acc[f"{kind}{b}"][p] = subtree_accepted(tokens, parents, keep, output, p)
        result.records += 1
        result.output_tokens += n
        for name in names:
            result.steps[name] += trajectory(acc[name], n)
    return result


def prompt_key(record: Record) -> tuple[int, ...]:
    """Identifies a record's prompt across generators: its last 48 tokens (the end of
    the last user turn and the assistant header; system prompts differ by model)."""
    return tuple(record.prompt_ids[-48:].tolist())


def _pick(records: list[Record], limit: int | None, seed: int) -> list[Record]:
    if limit is None or limit >= len(records):
        return records
    rng = np.random.default_rng(seed)
    return [records[i] for i in sorted(rng.choice(len(records), limit, replace=False))]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m drafter_bench.rerank_headroom",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path("../shared/data"),
        help=f"holds {CORPUS} and the dev sets (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--budget", type=int, action="append", help="tree budget to report (repeat; default 16, 32)"
    )
    parser.add_argument(
        "--candidate-budget", type=int, default=256,
        help="budget of the candidate tree the reranker selects from (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--holdout", type=int, default=300, help="corpus records to train on")
    parser.add_argument("--seed", type=int, default=0, help="of the held-out and dev samples")
    parser.add_argument(
        "--dev-records", type=int, help="replay this many records of each dev set (seeded)"
    )
    parser.add_argument(
        "--dev", action="append", help="dev file under --data-dir (repeat; default: all three)"
    )
    parser.add_argument("--out", type=Path, help="also append the JSON lines here")
    parser.add_argument("--vocab-size", type=int, default=LLAMA3_VOCAB_SIZE)
    parser.add_argument(
        "--gbdt", action="store_true", help="also rerank with gradient-boosted trees"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tail = list(argv) if argv is not None else sys.argv[1:]
    command = shlex.join(["python", "-m", "drafter_bench.rerank_headroom", *tail])
    budgets = args.budget or [16, 32]
    vocab = args.vocab_size
    config = DraftConfig()
    start = time.perf_counter()
    corpus = read_records(args.data_dir / CORPUS, vocab_size=vocab)
    rng = np.random.default_rng(args.seed)
    held = set(rng.choice(len(corpus), args.holdout, replace=False).tolist())
    train_records = [r for i, r in enumerate(corpus) if i in held]
    # The corpus answers each prompt many times (25 models on AlpacaEval, 2 on MMLU-Pro),
    # and the dev sets share no prompt with it: the datastore a training record is
    # replayed against leaves out every answer to its prompt, or the datastore would
    # look far more predictive in training than it is on new prompts.
    held_prompts = {prompt_key(r) for r in train_records}
    rest = SubIndex.build(
        (r.output_ids for r in corpus if prompt_key(r) not in held_prompts), vocab
    )
    whole = SubIndex.build((r.output_ids for r in corpus), vocab)
    del corpus
    print(f"datastores built in {time.perf_counter() - start:.1f} s", file=sys.stderr)

    t0 = time.perf_counter()
    drafter = Drafter(vocab, config, Datastore([rest], vocab))
    x, y, groups, train_positions = collect_training(
        drafter, train_records, args.candidate_budget, vocab
    )
    # Held-out log-loss on a fifth of the training records (by record), then refit on all.
    val = groups % 5 == 0
    rate = float(y[~val].mean())
    logloss = {"base_rate": -float(np.mean(np.where(y[val] > 0, np.log(rate), np.log1p(-rate))))}
    for m, features in VARIANTS.items():
        logloss[m] = log_loss(fit(x[~val], y[~val], features), x[val], y[val])
    gbdt_variants = {"gbdt": FEATURES, "gbdt_pushed": PUSHED, "gbdt_all": ALL_FEATURES}
    if args.gbdt:
        for m, features in gbdt_variants.items():
            logloss[m] = log_loss(fit_gbdt(x[~val], y[~val], features), x[val], y[val])
    model = fit(x, y, FEATURES)
    models: dict[str, Scorer] = {"full": model}
    models.update({m: fit(x, y, features) for m, features in VARIANTS.items() if m != "full"})
    if args.gbdt:
        models.update({m: fit_gbdt(x, y, features) for m, features in gbdt_variants.items()})
    train_s = time.perf_counter() - t0
    coefs = {name: round(float(c), 4) for name, c in zip(FEATURES, model.coef, strict=True)}
    logloss = {k: round(v, 5) for k, v in logloss.items()}
    print(f"trained on {len(y):,} nodes ({train_positions:,} positions, "
          f"{y.mean():.3f} positive) in {train_s:.1f} s: {coefs}; "
          f"validation log-loss {logloss}", file=sys.stderr)  # fmt: skip

    drafter.set_datastore(Datastore([whole], vocab))
    for dev in args.dev or DEV_SETS:
        t0 = time.perf_counter()
        records = _pick(read_records(args.data_dir / dev, vocab_size=vocab), args.dev_records,
                        args.seed)  # fmt: skip
        ev = evaluate(drafter, records, models, budgets, args.candidate_budget, vocab)
        wall = time.perf_counter() - t0
        for b in budgets:
            base = ev.tau(f"baseline{b}")
            row = {
                "data": data_name(dev), "mode": "corpus", "budget": b,
                "candidate_budget": args.candidate_budget,
                "baseline_tau": round(base, 4),
                "reranked_tau": round(ev.tau(f"reranked_full{b}"), 4),
                "reranked_tree_only_tau": round(ev.tau(f"reranked_tree_only{b}"), 4),
                "oracle_tau": round(ev.tau(f"oracle{b}"), 4),
                "rescored_tau": round(ev.tau(f"rescored{b}"), 4),
                "reranked_over_baseline": (round(ev.tau(f"reranked_full{b}") / base, 4)
                                           if base else None),
                "records": ev.records, "positions": ev.output_tokens,
                "steps": {k: ev.steps[f"{k}{b}"]
                          for k in ("baseline", "reranked_full", "oracle")},
                "train_records": len(train_records), "train_positions": train_positions,
                "train_nodes": len(y), "train_positive": round(float(y.mean()), 4),
                "coefficients": coefs, "intercept": round(model.intercept, 4),
                "reranked_gbdt_tau": (round(ev.tau(f"reranked_gbdt{b}"), 4)
                                      if args.gbdt else None),
                "reranked_by_model": {m: round(ev.tau(f"reranked_{m}{b}"), 4) for m in models},
                "validation_logloss": logloss,
                "wall_s": round(wall, 1), "train_s": round(train_s, 1), "command": command,
            }  # fmt: skip
            emit_row(row, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
