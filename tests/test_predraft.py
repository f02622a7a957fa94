"""Pre-draft planning (drafter_service.drafting.predraft): outcomes of greedy verification,
their ranking, and pre-drafted trees that are the drafts after those outcomes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import Corpus, corpora, draft_configs

from drafter_service import DraftConfig, Drafter
from drafter_service.drafting.drafter import DraftTree
from drafter_service.drafting.predraft import (
    candidate_nodes,
    observed_outcome,
    path_tokens,
    plan_outcomes,
    predraft_batch,
    stop_scores,
)


def tree(tokens: list[int], parents: list[int], scores: list[float]) -> DraftTree:
    return DraftTree(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32),
                     np.array(scores, dtype=np.float32))


# root -> 5 (0.6) -> 7 (0.5); root -> 6 (0.25)
T = tree([5, 6, 7], [-1, -1, 0], [0.6, 0.25, 0.5])


def test_observed_outcome_walks_the_accepted_path() -> None:
    assert observed_outcome(T, [9]) == (-1, 9)  # nothing accepted
    assert observed_outcome(T, [5, 9]) == (0, 9)
    assert observed_outcome(T, [5, 7, 1]) == (2, 1)  # a leaf accepted, then the bonus
    assert observed_outcome(T, [6, 6]) == (1, 6)
    assert observed_outcome(T, [5]) is None  # the generation ended inside the tree


def test_stop_scores_and_candidate_nodes() -> None:
    stop = stop_scores(T)
    # root: 1 * (1 - min(0.95, 0.85)); node 5: 0.6 * (1 - 0.5/0.6); leaves keep their score
    np.testing.assert_allclose(stop, [0.15, 0.1, 0.25, 0.5], rtol=1e-6)
    assert candidate_nodes(T, 2) == [2, 1]
    assert candidate_nodes(T, 10) == [2, 1, -1, 0]
    assert path_tokens(T, 2) == [5, 7] and path_tokens(T, -1) == []


def test_plan_outcomes_leaves_out_drafted_children_and_ranks_by_weight() -> None:
    after_root = tree([5, 8, 6], [-1, -1, -1], [0.5, 0.4, 0.2])  # 5 and 6 are drafted children
    after_leaf = tree([3, 4], [-1, 0], [0.9, 0.8])  # 4 is not first-level
    outcomes = plan_outcomes(T, [(-1, after_root), (2, after_leaf)], fan_out=4)
    assert [(o.node, o.bonus) for o in outcomes] == [(2, 3), (-1, 8)]
    assert outcomes[0].weight == pytest.approx(0.5 * 0.9)
    assert outcomes[1].weight == pytest.approx(0.15 * 0.4)
    assert len(plan_outcomes(T, [(-1, after_root), (2, after_leaf)], fan_out=1)) == 1


@given(corpora(), draft_configs(), st.integers(1, 8), st.integers(1, 16), st.data())
def test_predrafts_are_the_drafts_after_their_outcomes(
    corpus: Corpus, config: DraftConfig, fan_out: int, budget: int, data: st.DataObject
) -> None:
    """Every pre-draft is what draft_after gives for its outcome's path plus bonus; no
    bonus is a drafted child; at most fan_out, best first; the request is unchanged."""
    drafter = Drafter(corpus.vocab_size, config, datastore=corpus.datastore())
    drafter.start("r", corpus.context)
    plain = drafter.speculate(["r"], [[]], budget).tree(0)
    [pre] = predraft_batch(drafter, ["r"], [plain], fan_out, budget)
    assert len(pre) <= fan_out
    assert [p.outcome.weight for p in pre] == sorted((p.outcome.weight for p in pre),
                                                     reverse=True)
    for p in pre:
        o = p.outcome
        drafted = {int(t) for t, par in zip(plain.tokens, plain.parents, strict=True)
                   if par == o.node}
        assert o.bonus not in drafted
        ext = np.array([*path_tokens(plain, o.node), o.bonus], dtype=np.int32)
        want = drafter.draft_after(["r"], ext, np.array([0, len(ext)], dtype=np.int64),
                                   budget).tree(0)
        np.testing.assert_array_equal(p.tree.tokens, want.tokens)
        np.testing.assert_array_equal(p.tree.parents, want.parents)
    assert drafter.num_tokens("r") == len(corpus.context)


def test_no_fan_out_no_work() -> None:
    drafter = Drafter(10)
    drafter.start("r", [1, 2, 3, 1, 2])
    assert predraft_batch(drafter, ["r"], [T], 0, 8) == [[]]
    assert predraft_batch(drafter, [], [], 4, 8) == []
