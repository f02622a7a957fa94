"""Hypothesis strategies: small vocabularies so that n-gram matches are frequent."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import reference as ref
from hypothesis import strategies as st

from drafter_service import Datastore, DraftConfig, SubIndex
from drafter_service.drafting.drafter import SCORE_FEATURES

MAX_BUDGET = 40

vocab_sizes = st.integers(2, 8)


def token_lists(vocab_size: int, max_size: int = 24) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, vocab_size - 1), max_size=max_size)


@st.composite
def texts(draw: st.DrawFn, max_size: int = 40) -> tuple[list[int], int]:
    """A sub-index text (tokens and -1 separators, any arrangement) and its vocab size."""
    vocab = draw(vocab_sizes)
    shape = draw(st.sampled_from(["random", "constant", "periodic"]))
    n = draw(st.integers(0, max_size))
    if shape == "random":
        text = draw(st.lists(st.integers(-1, vocab - 1), min_size=n, max_size=n))
    elif shape == "constant":
        text = [draw(st.integers(-1, vocab - 1))] * n
    else:
        period = draw(st.lists(st.integers(-1, vocab - 1), min_size=1, max_size=4))
        text = (period * (n // len(period) + 1))[:n]
    return text, vocab


weights = st.one_of(st.sampled_from([0.0, 0.1, 0.6, 1.0]), st.floats(0.0, 3.0))
smoothings = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 10.0))
# The hand-set score, or a learned node score: a bias and one weight per ScoreFeature.
node_scores = st.one_of(
    st.just(()),
    st.tuples(*[st.floats(-4.0, 4.0)] * (len(SCORE_FEATURES) + 1)),
)


@st.composite
def draft_configs(draw: st.DrawFn, max_discount: float = 3.0) -> DraftConfig:
    """Any valid DraftConfig with small limits (budgets up to MAX_BUDGET are allowed)."""
    discounts = st.one_of(st.sampled_from([0.0, 0.1, 0.6, 1.0]), st.floats(0.0, max_discount))
    p = draw(st.integers(1, 5))
    dmin = draw(st.integers(1, 3))
    base = draw(discounts)
    per_match = draw(discounts) / 8  # keeps base + per_match * p <= max_discount (p <= 5)
    if base + per_match * p > max_discount:
        base = 0.0
    return DraftConfig(
        input_max_prefix=p,
        input_max_depth=draw(st.integers(p, 8)),
        datastore_max_prefix=draw(st.integers(dmin, 6)),
        datastore_min_prefix=dmin,
        datastore_samples=draw(st.one_of(st.integers(1, 4), st.integers(1, 40))),
        datastore_max_continuation=draw(st.integers(1, 10)),
        datastore_min_tree_nodes=draw(st.integers(0, 60)),
        input_weight=draw(weights),
        input_child_discount_base=base,
        input_child_discount_per_match=per_match,
        datastore_weight=draw(weights),
        datastore_child_discount=draw(discounts),
        max_budget=draw(st.integers(MAX_BUDGET, 64)),
        input_smoothing=draw(smoothings),
        datastore_smoothing=draw(smoothings),
        node_score=draw(node_scores),
    )


@dataclass
class Corpus:
    """Documents per sub-index, plus a context that often continues one of them."""

    vocab_size: int
    sub_documents: list[list[list[int]]]
    context: list[int]
    base_count: int = 0  # the first sub-indices are a base: a split datastore

    def datastore(self) -> Datastore:
        subs = [SubIndex.build(docs, self.vocab_size) for docs in self.sub_documents]
        return Datastore(subs, self.vocab_size, base_count=self.base_count)

    def reference(self) -> list[ref.RefSubIndex]:
        return [ref.RefSubIndex.from_documents(docs) for docs in self.sub_documents]

    def context_array(self) -> np.ndarray:
        return np.array(self.context, dtype=np.int32)


@st.composite
def corpora(draw: st.DrawFn, max_sub_indices: int = 3, max_doc_len: int = 20,
            max_vocab: int = 8, split: bool = False) -> Corpus:
    vocab = draw(st.integers(2, max_vocab))
    docs = st.lists(token_lists(vocab, max_doc_len), min_size=1, max_size=4)
    sub_documents = draw(st.lists(docs, min_size=1, max_size=max_sub_indices))
    context = draw(token_lists(vocab, 12))
    # Often end the context with a piece of a document, so long prefixes match too.
    all_docs = [d for sub in sub_documents for d in sub if d]
    if all_docs and draw(st.booleans()):
        doc = draw(st.sampled_from(all_docs))
        lo = draw(st.integers(0, len(doc) - 1))
        hi = draw(st.integers(lo + 1, len(doc)))
        context += doc[lo:hi]
    base_count = draw(st.integers(0, len(sub_documents))) if split else 0
    return Corpus(vocab, sub_documents, context, base_count)


class MarkovSource:
    """"Natural" token streams: each token has four likely successors, mixed with uniform
    noise (15 %), so that n-grams repeat at many lengths as they do in text and code."""

    def __init__(self, vocab_size: int, rng: random.Random) -> None:
        self.vocab_size = vocab_size
        self.rng = rng
        self.successors = [[rng.randrange(vocab_size) for _ in range(4)]
                           for _ in range(vocab_size)]

    def stream(self, length: int, prev: int = -1) -> list[int]:
        out = []
        for _ in range(length):
            if prev < 0 or self.rng.random() < 0.15:
                prev = self.rng.randrange(self.vocab_size)
            else:
                prev = self.successors[prev][self.rng.randrange(4)]
            out.append(prev)
        return out


def natural_corpus(rng: random.Random, vocab_size: int, doc_lengths: list[list[int]],
                   context_len: int, piece_len: int) -> Corpus:
    """Documents (doc_lengths[s][d] tokens) and a context drawn from one MarkovSource; the
    context is a stream of its own, then up to piece_len tokens of the first document."""
    source = MarkovSource(vocab_size, rng)
    sub_documents = [[source.stream(n) for n in lengths] for lengths in doc_lengths]
    context = source.stream(context_len)
    first = sub_documents[0][0]
    if piece_len and first:
        start = rng.randrange(len(first))
        context += first[start : start + piece_len]
    return Corpus(vocab_size, sub_documents, context)


@st.composite
def natural_corpora(draw: st.DrawFn, max_sub_indices: int = 3, max_docs: int = 6,
                    max_doc_len: int = 120, max_vocab: int = 12) -> Corpus:
    """Corpora of natural streams (MarkovSource): longer documents and contexts than
    corpora(), matches of every length. Hypothesis draws the sizes and a seed."""
    vocab = draw(st.integers(2, max_vocab))
    doc_lengths = draw(st.lists(
        st.lists(st.integers(0, max_doc_len), min_size=1, max_size=max_docs),
        min_size=1, max_size=max_sub_indices))
    context_len = draw(st.integers(0, 40))
    piece_len = draw(st.sampled_from([0, 0, 1, 5, 30]))
    seed = draw(st.integers(0, 2**32 - 1))
    return natural_corpus(random.Random(seed), vocab, doc_lengths, context_len, piece_len)
