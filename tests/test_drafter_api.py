"""The Drafter API: request lifecycle, incremental drafting, batches, long prompts."""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
from conftest import LLAMA3_VOCAB
from hypothesis import given
from hypothesis import strategies as st
from strategies import MAX_BUDGET, Corpus, corpora, draft_configs, natural_corpora, token_lists

from drafter_service import Datastore, DraftBatch, DraftConfig, Drafter, DraftTree
from drafter_service.native import _core


def expected_tree(context: list[int], datastore: Datastore | None, config: DraftConfig,
                  budget: int, vocab_size: int) -> DraftTree:
    native = datastore.native if datastore is not None else None
    tokens, parents, scores = _core.draft_context(
        np.array(context, dtype=np.int32), native, config.to_native(), budget, True, vocab_size
    )
    return DraftTree(tokens, parents, scores)


def assert_same_tree(got: DraftTree, want: DraftTree) -> None:
    assert got.tokens.dtype == np.int32 and got.parents.dtype == np.int32
    assert got.scores.dtype == np.float32
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.parents.tolist() == want.parents.tolist()
    assert got.scores.tobytes() == want.scores.tobytes()


def test_lifecycle() -> None:
    drafter = Drafter(4, DraftConfig(max_budget=8))
    assert drafter.num_requests == 0 and "r" not in drafter
    drafter.start("r", [0, 1, 2, 0, 1])
    assert "r" in drafter and drafter.num_requests == 1
    assert drafter.num_tokens("r") == 5
    tree = drafter.speculate(["r"], [[]], 8).tree(0)
    assert tree.tokens.tolist() == [2, 0, 1]  # after '1': '2 0 1' from the prompt
    assert tree.parents.tolist() == [-1, 0, 1]
    drafter.add("r", [2])
    assert drafter.num_tokens("r") == 6
    batch = drafter.speculate(["r"], [[0, 3]], 8)
    assert drafter.num_tokens("r") == 8
    assert len(batch) == 1 and len(batch.tree(0)) == 0  # '3' never seen before
    assert drafter.request_bytes("r") > 0
    assert drafter.stop("r") is True
    assert drafter.stop("r") is False
    assert "r" not in drafter and drafter.num_requests == 0
    with pytest.raises(KeyError, match="'r'"):
        drafter.speculate(["r"], [[]], 4)
    drafter.start("r", [3])  # an id can be reused after stop
    assert drafter.num_tokens("r") == 1


def test_properties() -> None:
    config = DraftConfig(input_max_prefix=2, max_budget=9)
    store = Datastore.from_documents([[1, 2]], 5)
    drafter = Drafter(5, config, store, num_threads=3)
    assert drafter.config is config
    assert drafter.vocab_size == 5
    assert drafter.num_threads == 3
    assert drafter.datastore is store
    assert Drafter(5).datastore.num_tokens == 0
    assert Drafter(5).config == DraftConfig()


def test_empty_batch() -> None:
    drafter = Drafter(4)
    batch = drafter.speculate([], [], 4)
    assert isinstance(batch, DraftBatch)
    assert len(batch) == 0 and batch.offsets.tolist() == [0] and len(batch.tokens) == 0


@given(corpora(), draft_configs(), st.data())
def test_incremental_drafting_equals_full_context(corpus: Corpus, config: DraftConfig,
                                                  data: st.DataObject) -> None:
    """speculate with deltas (and add) gives the tree of draft_context on the whole context."""
    datastore = corpus.datastore() if data.draw(st.booleans()) else None
    drafter = Drafter(corpus.vocab_size, config, datastore)
    context = list(corpus.context)
    drafter.start("r", context)
    steps = data.draw(st.lists(
        st.tuples(token_lists(corpus.vocab_size, 5), st.integers(0, MAX_BUDGET), st.booleans()),
        min_size=1, max_size=5,
    ))
    for delta, budget, via_add in steps:
        if via_add:
            drafter.add("r", delta)
            batch = drafter.speculate(["r"], [[]], budget)
        else:
            batch = drafter.speculate(["r"], [delta], budget)
        context += delta
        assert drafter.num_tokens("r") == len(context)
        assert_same_tree(batch.tree(0), expected_tree(context, datastore, config, budget,
                                                      corpus.vocab_size))
    # The last step once more against the brute-force reference.
    subs = corpus.reference() if datastore is not None else None
    want = ref.draft(context, subs, config, steps[-1][1], True)
    got = batch.tree(0)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.scores.tobytes() == want.scores.tobytes()


@given(st.one_of(corpora(), natural_corpora()),
       st.lists(st.tuples(st.integers(0, 12), st.integers(0, MAX_BUDGET)), min_size=1, max_size=6))
def test_batch_rows_match_single_requests(corpus: Corpus, specs: list[tuple[int, int]]) -> None:
    """Each slice of a batch is the tree of its own request, with its own budget (no
    recent tier: with it the batch's requests draft from each other)."""
    config = DraftConfig(max_budget=MAX_BUDGET, recent_samples=0)
    datastore = corpus.datastore()
    drafter = Drafter(corpus.vocab_size, config, datastore)
    ids = [f"req-{i}" for i in range(len(specs))]
    contexts = []
    for i, (cut, _) in enumerate(specs):
        contexts.append([*corpus.context[: max(0, len(corpus.context) - cut)], i % 2])
        drafter.start(ids[i], contexts[-1][:-1])
    budgets = [b for _, b in specs]
    batch = drafter.speculate(ids, [c[-1:] for c in contexts], budgets)
    assert len(batch) == len(ids)
    assert batch.offsets[0] == 0 and (np.diff(batch.offsets) >= 0).all()
    assert batch.offsets[-1] == len(batch.tokens) == len(batch.parents) == len(batch.scores)
    for i, context in enumerate(contexts):
        tree = batch.tree(i)
        assert len(tree) <= budgets[i]
        assert_same_tree(tree, expected_tree(context, datastore, config, budgets[i],
                                             corpus.vocab_size))


def test_draft_batch_flat_form_equals_speculate() -> None:
    prompts = {"a": [0, 1, 2, 0, 1, 2, 0], "b": [3, 3, 1, 3], "c": []}
    deltas = {"a": [1], "b": [], "c": [2, 2]}
    store = Datastore.from_documents([[0, 1, 3, 2], [2, 2, 1, 0]], 4)
    one, two = Drafter(4, datastore=store), Drafter(4, datastore=store)
    for rid, prompt in prompts.items():
        one.start(rid, prompt)
        two.start(rid, prompt)
    ids = list(prompts)
    flat = np.array([t for r in ids for t in deltas[r]], dtype=np.int32)
    offsets = np.cumsum([0] + [len(deltas[r]) for r in ids]).astype(np.int64)
    got = one.draft_batch(ids, flat, offsets, np.array([5, 0, 7]))
    want = two.speculate(ids, [deltas[r] for r in ids], [5, 0, 7])
    for name in ("tokens", "parents", "scores", "offsets"):
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes()
    assert len(got.tree(1)) == 0


def test_a_request_twice_in_one_batch_is_refused_by_name_and_changes_nothing() -> None:
    drafter = Drafter(4)
    drafter.start("a", [0, 1, 2])
    drafter.start("b", [3])
    with pytest.raises(ValueError, match="request 'a' appears twice in one batch"):
        drafter.speculate(["a", "b", "a"], [[1], [2], [3]], 4)
    assert drafter.num_tokens("a") == 3 and drafter.num_tokens("b") == 1


def test_set_datastore_swaps_the_source() -> None:
    config = DraftConfig(max_budget=8)
    drafter = Drafter(6, config)
    drafter.start("r", [5])
    assert len(drafter.speculate(["r"], [[]], 8).tree(0)) == 0
    store = Datastore.from_documents([[5, 1, 2, 3]], 6)
    drafter.set_datastore(store)
    assert drafter.datastore is store
    tree = drafter.speculate(["r"], [[]], 8).tree(0)
    assert tree.tokens.tolist() == [1, 2, 3]
    drafter.set_datastore(Datastore.from_documents([[5, 4]], 6))
    assert drafter.speculate(["r"], [[]], 8).tree(0).tokens.tolist() == [4]


def test_token_arrays_of_any_integer_dtype() -> None:
    drafter = Drafter(300)
    drafter.start("r", np.array([1, 299, 1], dtype=np.uint16))
    drafter.add("r", np.array([299], dtype=np.int64))
    batch = drafter.speculate(["r"], [np.array([1], dtype=np.uint8)], 4)
    assert drafter.num_tokens("r") == 5
    assert batch.tree(0).tokens.tolist() == [299, 1, 299, 1]


# --- long prompts -------------------------------------------------------------------------


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return None


def test_long_random_prompt() -> None:
    """128k random Llama-3 ids: start, draft, memory ~linear in length, stop frees it."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, LLAMA3_VOCAB, size=131072, dtype=np.int64)
    config = DraftConfig(max_budget=64)
    drafter = Drafter(LLAMA3_VOCAB, config)
    drafter.start("half", prompt[:65536])
    drafter.start("full", prompt)
    assert drafter.num_tokens("full") == 131072
    half, full = drafter.request_bytes("half"), drafter.request_bytes("full")
    # O(len * input_max_depth) nodes for text with (almost) no repeats.
    assert 1.5 < full / half < 3.0
    assert 131072 * config.input_max_depth * 8 < full < 131072 * 1024
    # Draft after an appended repeat of an earlier 3-gram: the trie must find it.
    batch = drafter.speculate(["full"], [prompt[1000:1003]], 64)
    tree = batch.tree(0)
    assert tree.tokens[0] == prompt[1003]
    want = expected_tree([*prompt.tolist(), *prompt[1000:1003].tolist()], None, config, 64,
                         LLAMA3_VOCAB)
    assert_same_tree(tree, want)
    drafter.stop("half")
    before = _rss_bytes()
    assert drafter.stop("full")
    after = _rss_bytes()
    assert drafter.num_requests == 0
    with pytest.raises(KeyError):
        drafter.request_bytes("full")
    if before is not None and after is not None:
        assert before - after > full // 2, "stop() did not give the request's memory back"


def test_long_repetitive_prompt() -> None:
    """A 128k prompt cycling through 50 ids: few trie nodes, long confident drafts."""
    prompt = np.tile(np.arange(1000, 1050), 131072 // 50 + 1)[:131072]
    config = DraftConfig(max_budget=64)
    drafter = Drafter(LLAMA3_VOCAB, config)
    drafter.start("rep", prompt)
    assert drafter.num_tokens("rep") == 131072
    # 50 * 16 trie nodes + the token history, and the recent tier's bound for each token
    assert drafter.request_bytes("rep") < (4 << 20) + 131072 * _core.RECENT_BYTES_PER_TOKEN
    tree = drafter.speculate(["rep"], [[]], 64).tree(0)
    # One chain continuing the cycle, as deep as the trie goes (a 1-token match
    # has paths of input_max_depth - 1 more tokens below it).
    nxt = int(prompt[-1]) - 1000 + 1
    length = config.input_max_depth - 1
    assert tree.tokens.tolist() == [1000 + (nxt + i) % 50 for i in range(length)]
    assert tree.parents.tolist() == list(range(-1, length - 1))
    # Probability 1 at every level; the 4-token match (discount 0.6 + 0.1 * 4 = 1)
    # carries the input weight down to depth input_max_depth - 4.
    sure = config.input_max_depth - config.input_max_prefix
    np.testing.assert_allclose(tree.scores[:sure], 0.6, rtol=1e-6)
    assert (np.diff(tree.scores[sure - 1 :]) < 0).all()
    assert_same_tree(tree, expected_tree(prompt.tolist(), None, config, 64, LLAMA3_VOCAB))
    assert drafter.stop("rep")


def test_sub_index_from_text_keeps_separators_and_checks_values() -> None:
    from drafter_service import SubIndex

    text = np.array([1, 2, -1, 1, 3], dtype=np.int32)
    index = SubIndex.from_text(text, vocab_size=4)
    assert index.tokens().tolist() == text.tolist()
    assert index.find_range([1]) == (1, 3)  # rows of "1 2 ..." and "1 3"
    begin, end = index.find_range([2, 1])
    assert begin == end  # "2 -1 1": no match across the separator
    with pytest.raises(ValueError, match="token 4 at position 1"):
        SubIndex.from_text(np.array([0, 4], dtype=np.int32), vocab_size=4)
    with pytest.raises(ValueError, match="1-D int32"):
        SubIndex.from_text(np.array([0, 1], dtype=np.int64), vocab_size=4)  # type: ignore[arg-type]
