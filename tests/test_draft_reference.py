"""Datastore retrieval and fusion: native core vs. the brute-force reference, plus invariants."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import numpy as np
import pytest
import reference as ref
from conftest import LLAMA3_VOCAB
from hypothesis import given
from hypothesis import strategies as st
from reference import assert_same_draft
from strategies import MAX_BUDGET, Corpus, corpora, draft_configs, natural_corpora, natural_corpus

from drafter_service import Datastore, DraftConfig, Drafter, SubIndex
from drafter_service.drafting.drafter import SCORE_FEATURES
from drafter_service.drafting.node_score import default_node_score
from drafter_service.native import _core

# --- helpers ------------------------------------------------------------------------------


def native_tree(datastore: Datastore, context: np.ndarray, config: DraftConfig,
                max_len: int) -> ref.Tree:
    tokens, parents, counts = _core.retrieve_datastore(
        datastore.native, context, config.to_native(), max_len
    )
    assert tokens.dtype == np.int32 and parents.dtype == np.int32
    assert len(tokens) == len(parents) == len(counts) >= 1
    assert tokens[0] == -1 and parents[0] == -1
    assert (tokens[1:] >= 0).all(), "a separator became a tree node"
    return ref.tree_from_rows(tokens, parents, counts)


def native_draft(corpus: Corpus, datastore: Datastore | None, config: DraftConfig, budget: int,
                 use_input: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    native = datastore.native if datastore is not None else None
    return _core.draft_context(corpus.context_array(), native, config.to_native(), budget,
                               use_input, corpus.vocab_size)




def draft_paths(tokens: np.ndarray, parents: np.ndarray) -> list[ref.Path]:
    paths: list[ref.Path] = []
    for t, p in zip(tokens.tolist(), parents.tolist(), strict=True):
        paths.append((*(paths[p] if p >= 0 else ()), t))
    return paths


def assert_draft_invariants(tokens: np.ndarray, parents: np.ndarray, scores: np.ndarray,
                            budget: int, vocab_size: int) -> None:
    n = len(tokens)
    assert len(parents) == len(scores) == n <= budget
    assert ((tokens >= 0) & (tokens < vocab_size)).all()
    depth: list[int] = []
    siblings: set[tuple[int, int]] = set()
    for i, (t, p) in enumerate(zip(tokens.tolist(), parents.tolist(), strict=True)):
        assert -1 <= p < i, f"node {i} has parent {p}"
        depth.append(1 if p < 0 else depth[p] + 1)
        assert (p, t) not in siblings, f"token {t} twice under parent {p}"
        siblings.add((p, t))
    assert depth == sorted(depth), "nodes are not in breadth-first order"
    assert np.isfinite(scores).all() and (scores >= 0).all()


def follows_a_context_suffix(texts: list[list[int]], context: list[int], path: ref.Path,
                             lengths: range) -> bool:
    """Whether context[-m:] + path occurs inside one of the texts for some m in lengths."""
    for m in lengths:
        needle = [*context[len(context) - m :], *path]
        for text in texts:
            for i in range(len(text) - len(needle) + 1):
                if text[i : i + len(needle)] == needle:
                    return True
    return False


def occurs_after_prefix(documents: list[list[int]], context: list[int], path: ref.Path,
                        config: DraftConfig) -> bool:
    """Whether ctx[-m:] + path lies inside one document for some allowed m."""
    longest = min(config.datastore_max_prefix, len(context))
    return follows_a_context_suffix(documents, context, path,
                                    range(config.datastore_min_prefix, longest + 1))


def follows_an_input_match(context: list[int], path: ref.Path, config: DraftConfig) -> bool:
    """Whether context[-m:] + path occurs in the context for some m <= input_max_prefix with
    m + len(path) <= input_max_depth (a path of the input trie below the match of m)."""
    longest = min(config.input_max_prefix, len(context), config.input_max_depth - len(path))
    return follows_a_context_suffix([context], context, path, range(1, longest + 1))


# --- datastore tree (Algorithm 2) -----------------------------------------------------------


@given(corpora(), draft_configs(), st.integers(-2, MAX_BUDGET))
def test_retrieve_datastore_equals_reference(corpus: Corpus, config: DraftConfig,
                                             max_len: int) -> None:
    got = native_tree(corpus.datastore(), corpus.context_array(), config, max_len)
    want = ref.retrieve_datastore(corpus.reference(), corpus.context, config, max_len)
    # Same nodes with the same counts. (The order nodes come in is not part of the
    # contract: the native tree materializes them lazily, and fusion's result does
    # not depend on sibling order; the draft tests below check that end to end.)
    assert got == want


@given(corpora(max_doc_len=60, max_vocab=4), draft_configs(), st.integers(1, 4),
       st.integers(1, MAX_BUDGET))
def test_interval_sampling_equals_reference(corpus: Corpus, config: DraftConfig, samples: int,
                                            max_len: int) -> None:
    """Many matches, few samples: rows begin + (k * f) // S of every sub-index."""
    config = dataclasses.replace(config, datastore_samples=samples)
    got = native_tree(corpus.datastore(), corpus.context_array(), config, max_len)
    want = ref.retrieve_datastore(corpus.reference(), corpus.context, config, max_len)
    assert got == want


@given(corpora(), draft_configs(), st.integers(1, MAX_BUDGET))
def test_retrieved_paths_follow_the_prefix_inside_one_document(
    corpus: Corpus, config: DraftConfig, max_len: int
) -> None:
    tree = native_tree(corpus.datastore(), corpus.context_array(), config, max_len)
    documents = [d for sub in corpus.sub_documents for d in sub]
    cap = min(config.datastore_max_continuation, max_len)
    for path, count in tree.items():
        assert len(path) <= cap
        if path:
            assert count >= 1
            assert count <= tree[path[:-1]], f"{path} counted more often than its parent"
            assert occurs_after_prefix(documents, corpus.context, path, config), path
    if len(tree) > 1:
        assert tree[()] >= 1


def test_retrieve_datastore_by_hand() -> None:
    """Documents [0 1 2] and [0 1 3 | 0]: after context [0], continuations are
    '1 2', '1 3' and '' (the match at the end of a document), so the root counts 3."""
    ds = Datastore.from_documents([[0, 1, 2], [0, 1, 3], [0]], 4)
    config = DraftConfig(datastore_max_prefix=1, datastore_min_tree_nodes=100)
    tree = native_tree(ds, np.array([0], dtype=np.int32), config, 16)
    assert tree == {(): 3, (1,): 2, (1, 2): 1, (1, 3): 1}
    tree = native_tree(ds, np.array([0], dtype=np.int32), config, 1)  # cap = max_len
    assert tree == {(): 3, (1,): 2}
    assert native_tree(ds, np.array([], dtype=np.int32), config, 16) == {(): 0}
    assert native_tree(ds, np.array([0], dtype=np.int32), config, 0) == {(): 0}
    assert native_tree(ds, np.array([0], dtype=np.int32), config, -1) == {(): 0}
    assert native_tree(Datastore.empty(4), np.array([0], dtype=np.int32), config, 8) == {(): 0}


def test_sampling_splits_over_sub_indices() -> None:
    """3 matches in the first sub-index, 1 in the second, 2 samples: S = max(1, 2*f // 4)."""
    subs = [SubIndex.build([[5, 0], [5, 1], [5, 2]], 6), SubIndex.build([[5, 3]], 6)]
    ds = Datastore(subs, 6)
    config = DraftConfig(datastore_max_prefix=1, datastore_samples=2)
    tree = native_tree(ds, np.array([5], dtype=np.int32), config, 4)
    # First sub-index: S = 1 sample at row begin + 0; second: S = max(1, 0) = 1.
    assert tree == {(): 2, (0,): 1, (3,): 1}
    want = ref.retrieve_datastore(
        [ref.RefSubIndex.from_documents([[5, 0], [5, 1], [5, 2]]),
         ref.RefSubIndex.from_documents([[5, 3]])],
        [5], config, 4,
    )
    assert tree == want


# --- fusion (Algorithm 3) ------------------------------------------------------------------


@given(corpora(), draft_configs(), st.integers(0, MAX_BUDGET), st.booleans())
def test_draft_equals_reference(corpus: Corpus, config: DraftConfig, budget: int,
                                use_input: bool) -> None:
    """Datastore only (use_input False) and datastore + input."""
    got = native_draft(corpus, corpus.datastore(), config, budget, use_input)
    assert_same_draft(got, ref.draft(corpus.context, corpus.reference(), config, budget,
                                     use_input))
    assert_draft_invariants(*got, budget, corpus.vocab_size)
    if not config.node_score:  # the hand-set score: offering every child changes nothing
        assert_same_draft(got, ref.draft(corpus.context, corpus.reference(), config, budget,
                                         use_input, offer_all=True))


@given(corpora(max_sub_indices=4, split=True), draft_configs(), st.integers(0, MAX_BUDGET),
       st.booleans())
def test_split_datastore_draft_equals_reference(corpus: Corpus, config: DraftConfig, budget: int,
                                                use_input: bool) -> None:
    """A datastore split into a base and live sub-indices: each part is its own source with
    its own samples (0 or all of them in the base: one source, as before)."""
    got = native_draft(corpus, corpus.datastore(), config, budget, use_input)
    want = ref.draft(corpus.context, corpus.reference(), config, budget, use_input,
                     base_count=corpus.base_count)
    assert_same_draft(got, want)
    assert_draft_invariants(*got, budget, corpus.vocab_size)


def test_split_datastore_keeps_a_live_continuation_the_base_outvotes() -> None:
    """The dilution a split prevents: a base where the context continues with 5, 6 a
    hundred times and live data where it continued with 7 once. Pooled, 7 gets 1 of 101
    samples and loses the second node to 6; split, the live source's own tree offers it
    at its own probability and it is drafted."""
    vocab, context = 10, [1, 2, 3]
    base = SubIndex.build([[1, 2, 3, 5, 6]] * 100, vocab)
    live = SubIndex.build([[1, 2, 3, 7, 8]], vocab)
    config = DraftConfig(datastore_smoothing=0.0)

    def first_level(datastore: Datastore, budget: int) -> set[int]:
        tokens, parents, _ = _core.draft_context(
            np.array(context, dtype=np.int32), datastore.native, config.to_native(), budget,
            False, vocab)
        return {int(t) for t, p in zip(tokens, parents, strict=True) if p == -1}

    pooled = Datastore([base, live], vocab)
    split = Datastore([base, live], vocab, base_count=1)
    assert first_level(pooled, 2) == {5}  # 7 at 1/101 loses to 5 -> 6
    assert first_level(split, 2) == {5, 7}  # both at probability 1
    with pytest.raises(ValueError, match="base_count must be in"):
        Datastore([base, live], vocab, base_count=3)


@given(corpora(), draft_configs(), st.integers(0, MAX_BUDGET))
def test_draft_without_datastore_equals_reference(corpus: Corpus, config: DraftConfig,
                                                  budget: int) -> None:
    got = native_draft(corpus, None, config, budget, True)
    assert_same_draft(got, ref.draft(corpus.context, None, config, budget, True))
    assert_draft_invariants(*got, budget, corpus.vocab_size)
    # A datastore with no sub-index is the same as none.
    empty = native_draft(corpus, Datastore.empty(corpus.vocab_size), config, budget, True)
    for a, b in zip(got, empty, strict=True):
        assert a.tobytes() == b.tobytes()
    # Neither source: nothing to draft.
    assert len(native_draft(corpus, None, config, budget, False)[0]) == 0


@given(st.one_of(corpora(), natural_corpora()), draft_configs(max_discount=1.0),
       st.integers(0, MAX_BUDGET), st.booleans())
def test_scores_never_grow_along_a_path_when_discounts_are_at_most_one(
    corpus: Corpus, config: DraftConfig, budget: int, use_input: bool
) -> None:
    """Probabilities are <= 1, so with discounts <= 1 candidates pop in non-increasing
    score order: a child never outscores its parent, and each level is sorted."""
    tokens, parents, scores = native_draft(corpus, corpus.datastore(), config, budget, use_input)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            assert scores[i] <= scores[p]
    paths = draft_paths(tokens, parents)
    for i in range(1, len(paths)):
        if len(paths[i]) == len(paths[i - 1]):
            assert scores[i] <= scores[i - 1]


@given(corpora(), draft_configs(), st.integers(0, MAX_BUDGET), st.booleans())
def test_every_draft_path_comes_from_a_source(corpus: Corpus, config: DraftConfig, budget: int,
                                              use_input: bool) -> None:
    """A draft path is a path of the datastore tree or follows an input match."""
    datastore = corpus.datastore()
    tokens, parents, _ = native_draft(corpus, datastore, config, budget, use_input)
    tree = native_tree(datastore, corpus.context_array(), config, budget)
    trie = ref.input_trie_counts(corpus.context, config.input_max_depth) if use_input else {}
    ctx = tuple(corpus.context)
    matches = [ctx[len(ctx) - m :] for m in range(1, min(config.input_max_prefix, len(ctx)) + 1)]
    matches = [u for u in matches if len(u) <= config.input_max_depth and trie.get(u, 0) >= 2]
    for path in draft_paths(tokens, parents):
        assert path in tree or any((*u, *path) in trie for u in matches), path


@pytest.mark.parametrize("budget", [0, 1, 2, 5])
def test_small_budgets(budget: int) -> None:
    corpus = Corpus(3, [[[0, 1, 2, 0, 1, 2, 0, 1, 0, 2]]], [2, 0, 1, 2, 0])
    config = DraftConfig(max_budget=8)
    got = native_draft(corpus, corpus.datastore(), config, budget, True)
    assert len(got[0]) == budget
    assert_same_draft(got, ref.draft(corpus.context, corpus.reference(), config, budget, True))


def test_merge_of_sources_keeps_first_score() -> None:
    """The same token from the datastore and the input becomes one node, scored by the
    first (best) pop; its children come from both sources."""
    corpus = Corpus(4, [[[0, 1, 2]]], [0, 1, 3, 0])
    config = DraftConfig(
        input_weight=0.5, datastore_weight=1.0, max_budget=8, datastore_smoothing=0.0
    )
    tokens, parents, scores = native_draft(corpus, corpus.datastore(), config, 8, True)
    # Datastore after [0]: '1 2' (prob 1); input after [0]: '1 3 0' (prob 1 * 0.5).
    assert tokens.tolist() == [1, 2, 3, 0]
    assert parents.tolist() == [-1, 0, 0, 2]
    assert scores[0] == np.float32(1.0)
    want = ref.draft(corpus.context, corpus.reference(), config, 8, True)
    assert_same_draft((tokens, parents, scores), want)


def test_zero_weights_tie_break_by_push_order() -> None:
    """All scores 0: ties go to the earliest push; one expansion pushes its candidates
    (the union of every source's children) in ascending token order."""
    corpus = Corpus(5, [[[3, 4], [3, 1], [3, 2]]], [3, 0, 3, 2, 3])
    config = DraftConfig(input_weight=0.0, datastore_weight=0.0, max_budget=16)
    got = native_draft(corpus, corpus.datastore(), config, 16, True)
    assert (got[2] == 0).all()
    # Root candidates: 0 and 2 (input: "3" was followed by 0 and 2), 1, 2, 4 (datastore).
    assert got[0][:4].tolist() == [0, 1, 2, 4]
    assert_same_draft(got, ref.draft(corpus.context, corpus.reference(), config, 16, True))


# --- natural streams, wide nodes, every path from a source ---------------------------------


@given(natural_corpora(), draft_configs(), st.integers(0, MAX_BUDGET))
def test_natural_streams_equal_reference(corpus: Corpus, config: DraftConfig,
                                         budget: int) -> None:
    """Markov-chain documents of up to 120 tokens and contexts from the same source (matches
    of every length, many samples): the datastore tree, and the drafts from the datastore,
    from the input and from both, are the reference's; drafting twice on one Drafter (its
    scratch reused) gives the same bytes as a fresh call."""
    datastore = corpus.datastore()
    subs = corpus.reference()
    got_tree = native_tree(datastore, corpus.context_array(), config, budget)
    assert got_tree == ref.retrieve_datastore(subs, corpus.context, config, budget)
    for store, use_input in ((datastore, False), (None, True), (datastore, True)):
        got = native_draft(corpus, store, config, budget, use_input)
        want_subs = subs if store is not None else None
        assert_same_draft(got, ref.draft(corpus.context, want_subs, config, budget, use_input))
        assert_draft_invariants(*got, budget, corpus.vocab_size)
        if not config.node_score:
            assert_same_draft(got, ref.draft(corpus.context, want_subs, config, budget,
                                             use_input, offer_all=True))
    drafter = Drafter(corpus.vocab_size, config, datastore)
    drafter.start("r", corpus.context)
    first, second = (drafter.speculate(["r"], [[]], budget).tree(0) for _ in range(2))
    for a, b in ((first.tokens, got[0]), (first.parents, got[1]), (first.scores, got[2]),
                 (second.tokens, got[0]), (second.parents, got[1]), (second.scores, got[2])):
        assert a.tobytes() == b.tobytes()


def test_natural_streams_draft_from_every_source() -> None:
    """The natural corpora exercise something: with the default config most of them give
    non-empty drafts from the datastore alone and from the input alone."""
    from_datastore = from_input = 0
    config = DraftConfig()
    for seed in range(40):
        rng = random.Random(seed)
        lengths = [[rng.randrange(121) for _ in range(rng.randrange(1, 7))] for _ in range(3)]
        corpus = natural_corpus(rng, rng.randrange(2, 13), lengths, rng.randrange(41), 5)
        from_datastore += len(native_draft(corpus, corpus.datastore(), config, 16, False)[0]) > 0
        from_input += len(native_draft(corpus, None, config, 16, True)[0]) > 0
    assert from_datastore >= 30 and from_input >= 30, (from_datastore, from_input)


@given(st.integers(0, 2**32 - 1), draft_configs(), st.integers(1, 6))
def test_wide_nodes_with_small_budgets_equal_reference(seed: int, config: DraftConfig,
                                                       budget: int) -> None:
    """A token followed by up to 200 different tokens, in the input and in the datastore (a
    shuffle of the input), and a budget of a few nodes: the core offers only each member's
    best children, as many as nodes remain; with the hand-set score that is the tree of
    offering every child."""
    rng = random.Random(seed)
    vocab, hub = 200, rng.randrange(200)
    context = [t for _ in range(300)
               for t in (hub, rng.randrange(6) if rng.random() < 0.5 else rng.randrange(vocab))]
    context.append(hub)
    document = rng.sample(context, len(context))
    corpus = Corpus(vocab, [[document]], context)
    got = native_draft(corpus, corpus.datastore(), config, budget, True)
    assert_same_draft(got, ref.draft(context, corpus.reference(), config, budget, True))
    if config.input_max_depth >= 2:  # the input's match "hub" alone has ~200 children
        assert len(got[0]) == budget
    if not config.node_score:
        assert_same_draft(got, ref.draft(context, corpus.reference(), config, budget, True,
                                         offer_all=True))


@given(st.one_of(corpora(), natural_corpora()), draft_configs(), st.integers(0, MAX_BUDGET),
       st.sampled_from(["datastore", "input", "both"]))
def test_draft_paths_occur_in_the_texts(corpus: Corpus, config: DraftConfig, budget: int,
                                        sources: str) -> None:
    """Checked by scanning the texts, without the reference: every draft path continues a
    context suffix of a looked-up length inside one document (and is no longer than the
    continuation cap), or continues an earlier occurrence of an input match inside the
    trie's depth; merging sources never makes a path that neither has."""
    use_datastore, use_input = sources != "input", sources != "datastore"
    store = corpus.datastore() if use_datastore else None
    tokens, parents, _ = native_draft(corpus, store, config, budget, use_input)
    documents = [d for sub in corpus.sub_documents for d in sub]
    cap = min(config.datastore_max_continuation, budget)
    for path in draft_paths(tokens, parents):
        from_datastore = (use_datastore and len(path) <= cap
                          and occurs_after_prefix(documents, corpus.context, path, config))
        from_input = use_input and follows_an_input_match(corpus.context, path, config)
        assert from_datastore or from_input, path


# --- explained drafts: what fusion knew of each node -------------------------------------


@given(corpora(max_sub_indices=4, split=True), draft_configs(), st.integers(0, MAX_BUDGET),
       st.integers(0, 3))
def test_explain_equals_reference(corpus: Corpus, config: DraftConfig, budget: int,
                                  delta: int) -> None:
    """Drafter.explain gives the tree draft_batch would (and changes nothing), and each
    node's features are the reference's (SCORE_FEATURES): per source its presence,
    conditional and counts, the input match length and members, its siblings and rank,
    depth, the datastore's matched prefixes, the context n-grams it extends."""
    drafter = Drafter(corpus.vocab_size, config, corpus.datastore())
    context = list(corpus.context)
    drafter.start("r", context[: len(context) - delta])
    drafter.add("r", context[len(context) - delta :])
    explained = drafter.explain("r", budget)
    batch = drafter.speculate(["r"], [[]], budget).tree(0)
    assert drafter.num_tokens("r") == len(context)
    tree = explained.tree
    assert tree.tokens.tolist() == batch.tokens.tolist()
    assert tree.parents.tolist() == batch.parents.tolist()
    assert tree.scores.tobytes() == batch.scores.tobytes()
    want = ref.draft(corpus.context, corpus.reference(), config, budget, True,
                     base_count=corpus.base_count)
    assert_same_draft((tree.tokens, tree.parents, tree.scores), want)
    assert explained.features.shape == (len(tree), len(SCORE_FEATURES))
    assert want.features is not None
    np.testing.assert_array_equal(explained.features, want.features)


def test_explain_by_hand() -> None:
    """Input only: context 1 2 3 1 2 4 1 2, so "1 2" was followed by 3 and by 4 and "2"
    likewise; the longest match behind each child of the root is m = 2."""
    drafter = Drafter(8, DraftConfig(input_max_prefix=2))
    drafter.start("r", [1, 2, 3, 1, 2, 4, 1, 2])
    explained = drafter.explain("r", 2)
    assert sorted(explained.tree.tokens.tolist()) == [3, 4]
    col = {name: explained.features[:, i] for i, name in enumerate(SCORE_FEATURES)}
    assert col["depth"].tolist() == [1, 1]
    assert col["log_siblings"].tolist() == [math.log(2)] * 2
    assert col["log_over_best"].tolist() == [0.0, 0.0]
    assert col["input_match"].tolist() == [2, 2] and col["input_members"].tolist() == [2, 2]
    # "1 2" occurred twice with a continuation, once followed by each token.
    assert col["input_present"].tolist() == [1, 1]
    assert col["input_log_cond"].tolist() == [math.log(1) - math.log(2)] * 2
    assert col["input_log_count"].tolist() == [math.log(2)] * 2
    assert col["input_log_parent"].tolist() == [math.log(3)] * 2
    assert not col["base_present"].any() and not col["base_prefix"].any()
    # "3", "2 3" and "1 2 3" (and the same for 4) all occur in the context.
    for gram in ("unigram_seen", "bigram_seen", "trigram_seen"):
        assert col[gram].tolist() == [1, 1]
    with pytest.raises(KeyError, match="unknown request"):
        drafter.explain("nobody", 2)
    with pytest.raises(ValueError, match="budget 999"):
        drafter.explain("r", 999)


def test_learned_score_by_hand() -> None:
    """A node score that weighs only bigram_seen: after 5 6 7 / 5 6 8 / ... 9 5, the
    context's "5" was followed by 6 only, and a bigram weight makes a child the context
    has seen beat one it has not, whatever their counts."""
    weights = [0.0] * (len(SCORE_FEATURES) + 1)
    weights[1 + SCORE_FEATURES.index("bigram_seen")] = 3.0
    context = [5, 6, 7, 5, 6, 8, 9, 5]
    ctx = np.asarray(context, dtype=np.int32)

    def draft(config: DraftConfig) -> tuple[np.ndarray, ...]:
        return _core.draft_context(ctx, None, config.to_native(), 1, True, 16)

    hand = draft(DraftConfig())
    learned = draft(DraftConfig(node_score=tuple(weights)))
    assert hand[0].tolist() == learned[0].tolist() == [6]
    # The path probability: the logistic of 3 * 1 (bias 0).
    assert learned[2].tolist() == [np.float32(1 / (1 + math.exp(-3.0)))]


def test_node_score_config_is_validated() -> None:
    n = len(SCORE_FEATURES) + 1
    with pytest.raises(ValueError, match="node_score length = 3 must be 0"):
        DraftConfig(node_score=(1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match=r"node_score\[2\] = nan must be finite"):
        DraftConfig(node_score=(0.0, 0.0, math.nan) + (0.0,) * (n - 3))
    with pytest.raises(TypeError, match="node_score must be a tuple of numbers"):
        DraftConfig(node_score=[0.0] * n)  # type: ignore[arg-type]


# --- real token data --------------------------------------------------------------------


# The hand-set score and the shipped learned one.
REAL_OUTPUT_SCORES = {"hand": (), "shipped": default_node_score().as_config()}


@pytest.mark.parametrize("score", REAL_OUTPUT_SCORES)
@pytest.mark.parametrize("num_sub_indices", [1, 2])
def test_draft_on_real_outputs_equals_reference(
    humaneval_records: list[dict[str, Any]], num_sub_indices: int, score: str
) -> None:
    if len(humaneval_records) < 60:
        pytest.skip("needs at least 60 records")
    held_out = humaneval_records[-12:]
    train = [r["output_ids"] for r in humaneval_records[:-12]]
    parts = [train[i::num_sub_indices] for i in range(num_sub_indices)]
    datastore = Datastore([SubIndex.build(p, LLAMA3_VOCAB) for p in parts], LLAMA3_VOCAB)
    reference = [ref.RefSubIndex.from_documents(p) for p in parts]
    config = DraftConfig(max_budget=64, node_score=REAL_OUTPUT_SCORES[score])
    nonempty = 0
    for i, record in enumerate(held_out):
        output = record["output_ids"]
        k = (len(output) * (i + 1)) // (len(held_out) + 1)
        context = record["prompt_ids"][-200:] + output[:k]
        corpus = Corpus(LLAMA3_VOCAB, parts, context)
        for use_input in (False, True):
            got = native_draft(corpus, datastore, config, 32, use_input)
            assert_same_draft(got, ref.draft(context, reference, config, 32, use_input))
            assert_draft_invariants(*got, 32, LLAMA3_VOCAB)
            nonempty += len(got[0]) > 0
    assert nonempty >= len(held_out)  # real code repeats itself: drafts are not all empty
