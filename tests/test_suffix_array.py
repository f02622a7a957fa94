"""Suffix arrays (SA-IS) and find_range against naive sorting and linear scans."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import reference as ref
from conftest import LLAMA3_VOCAB
from hypothesis import given
from hypothesis import strategies as st
from strategies import texts, token_lists, vocab_sizes

from drafter_service import SubIndex
from drafter_service.datastore.sub_indices import concat_documents
from drafter_service.native import _core


def native_sa(text: list[int], vocab_size: int) -> list[int]:
    return _core.build_suffix_array(np.array(text, dtype=np.int32), vocab_size).tolist()


@pytest.mark.parametrize(
    ("text", "vocab_size"),
    [
        ([], 1),
        ([0], 1),
        ([-1], 1),
        ([5], 6),
        ([3] * 50, 4),
        ([-1] * 17, 2),
        ([0, 1] * 20, 2),
        ([1, 0] * 20 + [1], 2),
        ([0, 0, 1] * 13, 2),
        ([2, 1, 0] * 9 + [2, 1], 3),
        ([0, -1] * 10, 1),
        ([-1, 0, 0, -1, 0, 0, -1], 1),
        ([1, 2, 1, 2, 1, -1, 1, 2, 1, 2, 1, -1, 1, 2], 3),
        ([7, 6, 5, 4, 3, 2, 1, 0, -1], 8),
        ([0, 1, 2, 3, 4, 5, 6, 7, -1], 8),
        ([2, 0, 1, 0, 2, 0, 1, 0, 2, 0, 1, 0, 2], 3),  # many equal LMS substrings: recursion
    ],
)
def test_suffix_array_fixed_cases(text: list[int], vocab_size: int) -> None:
    assert native_sa(text, vocab_size) == ref.naive_suffix_array(text)


@given(texts(max_size=60))
def test_suffix_array_equals_naive_sort(case: tuple[list[int], int]) -> None:
    text, vocab_size = case
    assert native_sa(text, vocab_size) == ref.naive_suffix_array(text)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.integers(1, 40), st.booleans())
def test_suffix_array_periodic_long(period: list[int], repeats: int, separated: bool) -> None:
    text = period * repeats
    if separated:
        text = [t if i % 7 else -1 for i, t in enumerate(text)]
    assert native_sa(text, 4) == ref.naive_suffix_array(text)


def test_suffix_array_large_vocab_sparse_ids() -> None:
    """Ids spread over a large vocabulary: buckets are mostly empty."""
    rng = np.random.default_rng(7)
    text = rng.choice([0, 17, 4095, 65000, 128255], size=3000).tolist()
    text[::97] = [-1] * len(text[::97])
    assert native_sa(text, LLAMA3_VOCAB) == ref.naive_suffix_array(text)


@pytest.mark.parametrize("bad", [-2, 4, 2**31 - 1, -(2**31)])
def test_suffix_array_rejects_out_of_range_token(bad: int) -> None:
    with pytest.raises(ValueError, match=str(bad)):
        _core.build_suffix_array(np.array([0, 1, bad], dtype=np.int32), 4)


@pytest.mark.parametrize("vocab_size", [0, -1, 2**30 + 1])
def test_suffix_array_rejects_bad_vocab_size(vocab_size: int) -> None:
    with pytest.raises(ValueError, match=str(vocab_size)):
        _core.build_suffix_array(np.array([0], dtype=np.int32), vocab_size)


@given(st.data())
def test_sub_index_build_matches_reference(data: st.DataObject) -> None:
    vocab = data.draw(vocab_sizes)
    docs = data.draw(st.lists(token_lists(vocab, 15), max_size=5))
    index = SubIndex.build(docs, vocab)
    expected = ref.RefSubIndex.from_documents(docs)
    assert index.tokens().tolist() == expected.text
    assert index.suffix_array().tolist() == expected.sa
    assert index.num_tokens == len(expected.text)
    assert index.vocab_size == vocab


def assert_same_range(got: tuple[int, int], want: tuple[int, int], prefix: list[int]) -> None:
    if want[0] == want[1]:
        assert got[0] == got[1], f"prefix {prefix}: expected no match, got rows {got}"
    else:
        assert got == want, f"prefix {prefix}"


@given(st.data())
def test_find_range_equals_linear_scan(data: st.DataObject) -> None:
    vocab = data.draw(vocab_sizes)
    docs = data.draw(st.lists(token_lists(vocab, 20), min_size=1, max_size=4))
    index = SubIndex.build(docs, vocab)
    expected = ref.RefSubIndex.from_documents(docs)
    nonempty = [d for d in docs if d]
    prefixes = data.draw(st.lists(token_lists(vocab, 6), min_size=1, max_size=8))
    for doc in nonempty[:3]:  # present prefixes, including whole documents and their tails
        lo = data.draw(st.integers(0, len(doc) - 1))
        hi = data.draw(st.integers(lo + 1, len(doc)))
        prefixes += [doc[lo:hi], doc[lo:], doc]
    for prefix in prefixes:
        assert_same_range(index.find_range(prefix), expected.find_range(prefix), prefix)


def test_find_range_edge_cases() -> None:
    index = SubIndex.build([[0, 1, 0, 1], [1, 0], []], 3)
    expected = ref.RefSubIndex.from_documents([[0, 1, 0, 1], [1, 0], []])
    for prefix in ([0], [1], [2], [0, 1], [1, 0], [0, 1, 0, 1], [0, 1, 0, 1, 0], [1, 0, 1, 0],
                   [0, 0], [2, 2, 2], list(range(3)) * 5):
        assert_same_range(index.find_range(prefix), expected.find_range(prefix), prefix)
    lo, hi = index.find_range([])
    assert lo == hi
    empty = SubIndex.build([], 3)
    assert empty.num_tokens == 0
    lo, hi = empty.find_range([1])
    assert lo == hi


def test_find_range_rejects_bad_prefix() -> None:
    index = SubIndex.build([[0, 1]], 3)
    with pytest.raises(ValueError, match="3"):
        index.find_range([0, 3])
    with pytest.raises(ValueError, match="-1"):
        index.find_range([-1])
    with pytest.raises(ValueError, match="float"):
        index.find_range(np.array([0.0]))


@given(st.data())
def test_from_arrays_wraps_without_copy(data: st.DataObject) -> None:
    vocab = data.draw(vocab_sizes)
    docs = data.draw(st.lists(token_lists(vocab, 12), min_size=1, max_size=3))
    tokens = concat_documents(docs, vocab)
    sa = np.array(ref.naive_suffix_array(tokens.tolist()), dtype=np.int32)
    wrapped = SubIndex.from_arrays(tokens, sa, vocab)
    if len(tokens):
        assert np.shares_memory(wrapped.tokens(), tokens)
        assert np.shares_memory(wrapped.suffix_array(), sa)
    built = SubIndex.build(docs, vocab)
    for prefix in data.draw(st.lists(token_lists(vocab, 4), max_size=6)):
        assert wrapped.find_range(prefix) == built.find_range(prefix)


def test_from_arrays_validates() -> None:
    tokens = np.array([0, 1, -1, 1], dtype=np.int32)
    sa = np.array(ref.naive_suffix_array(tokens.tolist()), dtype=np.int32)
    with pytest.raises(ValueError, match="int64"):
        SubIndex.from_arrays(tokens.astype(np.int64), sa, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2-D"):
        SubIndex.from_arrays(tokens.reshape(2, 2), sa, 2)
    with pytest.raises(ValueError, match="token 5 at position 1"):
        SubIndex.from_arrays(np.array([0, 5, -1, 1], dtype=np.int32), sa, 2)
    with pytest.raises(ValueError, match="entry 4 at row"):
        SubIndex.from_arrays(tokens, np.array([0, 1, 2, 4], dtype=np.int32), 2)
    with pytest.raises(ValueError, match="suffix_array has 3"):
        SubIndex.from_arrays(tokens, sa[:3].copy(), 2)


# --- real token data --------------------------------------------------------------------


@pytest.fixture(scope="module")
def humaneval_index(humaneval_records: list[dict[str, Any]]) -> ref.RefSubIndex:
    return ref.RefSubIndex.from_documents([r["output_ids"] for r in humaneval_records])


def test_suffix_array_on_real_outputs(
    humaneval_records: list[dict[str, Any]], humaneval_index: ref.RefSubIndex
) -> None:
    index = SubIndex.build([r["output_ids"] for r in humaneval_records], LLAMA3_VOCAB)
    assert index.tokens().tolist() == humaneval_index.text
    assert index.suffix_array().tolist() == humaneval_index.sa
    direct = _core.build_suffix_array(np.array(humaneval_index.text, dtype=np.int32), LLAMA3_VOCAB)
    assert direct.tolist() == humaneval_index.sa


def test_find_range_on_real_outputs(
    humaneval_records: list[dict[str, Any]], humaneval_index: ref.RefSubIndex
) -> None:
    index = SubIndex.build([r["output_ids"] for r in humaneval_records], LLAMA3_VOCAB)
    rng = np.random.default_rng(3)
    checked = 0
    for record in humaneval_records[:20]:
        for source in (record["prompt_ids"], record["output_ids"]):
            if len(source) < 8:
                continue
            start = int(rng.integers(0, len(source) - 8))
            for m in (1, 2, 4, 8):
                prefix = source[start : start + m]
                assert_same_range(index.find_range(prefix), humaneval_index.find_range(prefix),
                                  prefix)
                checked += 1
    assert checked > 50
