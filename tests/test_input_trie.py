"""The per-request input trie, observed through drafts made from the input alone."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import reference as ref
from conftest import LLAMA3_VOCAB
from hypothesis import given
from hypothesis import strategies as st
from reference import assert_same_draft
from strategies import MAX_BUDGET, draft_configs, token_lists, vocab_sizes

from drafter_service import DraftConfig
from drafter_service.native import _core


def input_draft(
    context: list[int], config: DraftConfig, budget: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _core.draft_context(
        np.array(context, dtype=np.int32), None, config.to_native(), budget, True, vocab_size
    )




@given(st.data(), draft_configs(), st.integers(0, MAX_BUDGET))
def test_input_only_draft_equals_reference(
    data: st.DataObject, config: DraftConfig, budget: int
) -> None:
    vocab = data.draw(vocab_sizes)
    context = data.draw(token_lists(vocab, 40))
    got = input_draft(context, config, budget, vocab)
    assert_same_draft(got, ref.draft(context, None, config, budget, use_input=True))


@given(st.lists(st.sampled_from([0, 1, 2, 128000, 128255]), max_size=60), draft_configs(),
       st.integers(1, MAX_BUDGET))
def test_input_draft_with_large_token_ids(context: list[int], config: DraftConfig,
                                          budget: int) -> None:
    got = input_draft(context, config, budget, LLAMA3_VOCAB)
    assert_same_draft(got, ref.draft(context, None, config, budget, use_input=True))


@pytest.mark.parametrize("seed", [0, 1])
def test_long_input_equals_reference(seed: int) -> None:
    """Thousands of tokens: the trie's hash table grows several times."""
    rng = np.random.default_rng(seed)
    context = rng.integers(0, 5, size=3000).tolist()
    config = DraftConfig(input_max_prefix=4, input_max_depth=8, max_budget=64)
    got = input_draft(context, config, 64, 5)
    assert len(got[0]) == 64
    assert_same_draft(got, ref.draft(context, None, config, 64, use_input=True))


@given(st.data())
def test_first_level_scores_are_follower_frequencies(data: st.DataObject) -> None:
    """With P = 1 the first level lists every token that followed an earlier
    occurrence of the last token, scored count(last, t) / (count(last) - 1) * weight."""
    vocab = data.draw(vocab_sizes)
    context = data.draw(token_lists(vocab, 40))
    weight = data.draw(st.floats(0.01, 2.0))
    depth = data.draw(st.integers(2, 6))
    config = DraftConfig(input_max_prefix=1, input_max_depth=depth, input_weight=weight,
                         input_child_discount_base=0.0, input_child_discount_per_match=0.0)
    tokens, parents, scores = input_draft(context, config, vocab, vocab)
    followers: dict[int, int] = {}
    if context:
        last = context[-1]
        for a, b in itertools.pairwise(context):
            if a == last:
                followers[b] = followers.get(b, 0) + 1
    occurrences = context.count(context[-1]) if context else 0
    first = {int(t): float(s) for t, s, p in zip(tokens, scores, parents, strict=True) if p == -1}
    want = {t: float(np.float32(c / (occurrences - 1) * weight)) for t, c in followers.items()}
    assert first == want
    # Deeper nodes score 0 (discount 0), so they can only come after the whole first level.
    assert all(p == -1 for p in parents[: len(want)])


@given(st.data(), st.integers(2, 6))
def test_match_at_max_depth_has_no_children(data: st.DataObject, depth: int) -> None:
    """Paths longer than input_max_depth are not stored, so a match of length
    input_max_depth adds nothing: P = depth drafts exactly like P = depth - 1."""
    vocab = data.draw(vocab_sizes)
    context = data.draw(token_lists(vocab, 30))
    budget = data.draw(st.integers(0, MAX_BUDGET))
    at_depth = DraftConfig(input_max_prefix=depth, input_max_depth=depth)
    below = DraftConfig(input_max_prefix=depth - 1, input_max_depth=depth)
    got = input_draft(context, at_depth, budget, vocab)
    want = input_draft(context, below, budget, vocab)
    for g, w in zip(got, want, strict=True):
        assert g.tobytes() == w.tobytes()


@given(token_lists(4, 30))
def test_depth_one_trie_drafts_nothing(context: list[int]) -> None:
    config = DraftConfig(input_max_prefix=1, input_max_depth=1)
    tokens, _, _ = input_draft(context, config, 16, 4)
    assert len(tokens) == 0


def test_counts_by_hand() -> None:
    """[a a a]: count(a) = 3, count(a a) = 2, count(a a a) = 1."""
    config = DraftConfig(input_max_prefix=1, input_max_depth=3, input_weight=0.5,
                         input_child_discount_base=0.25, input_child_discount_per_match=0.5)
    tokens, parents, scores = input_draft([0, 0, 0], config, 10, 1)
    d = 0.25 + 0.5 * 1
    s1 = 2 / (3 - 1) * 0.5  # child (a a) of the match (a): denominator count(a) - 1
    s2 = (1 / 2) * (s1 * d)  # child (a a a) of (a a)
    assert tokens.tolist() == [0, 0]
    assert parents.tolist() == [-1, 0]
    assert scores.tolist() == [np.float32(s1), np.float32(s2)]


def test_occurrence_at_end_is_not_a_continuation() -> None:
    """A token seen only at the end of the input has no follower to draft."""
    tokens, _, _ = input_draft([0, 1, 2, 3], DraftConfig(), 10, 4)
    assert len(tokens) == 0
    tokens, parents, _ = input_draft([0, 1, 2, 3, 0], DraftConfig(), 10, 4)
    assert tokens.tolist() == [1, 2, 3, 0]
    assert parents.tolist() == [-1, 0, 1, 2]


def test_trie_counts_reference_is_sane() -> None:
    counts = ref.input_trie_counts([1, 2, 1, 2], 2)
    assert counts == {(): 0, (1,): 2, (2,): 2, (1, 2): 2, (2, 1): 1}
