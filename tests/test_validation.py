"""Validation at the Python boundary: the right exception, the bad value in the message,
and a drafter that still works (unchanged state) after every rejected call."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from drafter_service import Datastore, DraftConfig, Drafter, SubIndex
from drafter_service.drafting.drafter import SCORE_FEATURES
from drafter_service.native import _core

VOCAB = 10
MAX_BUDGET = 12
DOCUMENTS = [[1, 2, 3, 4, 1, 2, 5], [2, 3, 1, 2, 3, 6]]
PROMPT = [1, 2, 3, 1, 2]


class Harness:
    """A drafter with one request 'a', and the context it must hold."""

    def __init__(self) -> None:
        self.config = DraftConfig(max_budget=MAX_BUDGET)
        self.datastore = Datastore.from_documents(DOCUMENTS, VOCAB)
        self.drafter = Drafter(VOCAB, self.config, self.datastore)
        self.drafter.start("a", PROMPT)
        self.context = list(PROMPT)

    def assert_still_works(self) -> None:
        """State is as before the bad call: a good call drafts the expected tree."""
        assert self.drafter.num_requests == 1 and "a" in self.drafter
        assert self.drafter._native.num_requests == 1
        assert self.drafter.num_tokens("a") == len(self.context)
        batch = self.drafter.speculate(["a"], [[1]], 8)
        self.context.append(1)
        tokens, parents, scores = _core.draft_context(
            np.array(self.context, dtype=np.int32), self.datastore.native,
            self.config.to_native(), 8, True, VOCAB,
        )
        assert len(tokens) > 0
        assert batch.tokens.tolist() == tokens.tolist()
        assert batch.parents.tolist() == parents.tolist()
        assert batch.scores.tobytes() == scores.tobytes()


def i32(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


Call = Callable[[Drafter], Any]

BAD_CALLS: list[tuple[str, Call, type[Exception], str]] = [
    # wrong dtype
    ("start float", lambda d: d.start("b", np.array([1.0, 2.0])), ValueError, "float64"),
    ("start object", lambda d: d.start("b", np.array([1, None], dtype=object)), ValueError,
     "object"),
    ("start floats list", lambda d: d.start("b", [1.5]), ValueError, "float64"),
    ("start strings", lambda d: d.start("b", ["1"]), ValueError, "<U1"),
    ("start bools", lambda d: d.start("b", [True]), ValueError, "bool"),
    ("add float", lambda d: d.add("a", np.array([1.0])), ValueError, "float64"),
    ("speculate float list", lambda d: d.speculate(["a"], [[2, 1.5]], 4), ValueError,
     "float64"),
    ("speculate bool list", lambda d: d.speculate(["a"], [[True]], 4), ValueError, "bool"),
    ("speculate str list", lambda d: d.speculate(["a"], [["1"]], 4), ValueError, "<U1"),
    ("speculate float", lambda d: d.speculate(["a"], [np.array([1.0])], 4), ValueError,
     "float64"),
    ("draft_batch float tokens", lambda d: d.draft_batch(["a"], np.array([1.0]), i64(0, 1), 4),
     ValueError, "float64"),
    ("float offsets", lambda d: d.draft_batch(["a"], i32(1), np.array([0.0, 1.0]), 4),
     ValueError, "float64"),
    ("float budgets", lambda d: d.speculate(["a"], [[1]], np.array([4.0])), ValueError,
     "float64"),
    # 2-D arrays
    ("start 2-D", lambda d: d.start("b", np.ones((2, 2), dtype=np.int32)), ValueError,
     "(2, 2)"),
    ("speculate 2-D", lambda d: d.speculate(["a"], [np.ones((1, 3), dtype=np.int64)], 4),
     ValueError, "(1, 3)"),
    ("2-D offsets", lambda d: d.draft_batch(["a"], i32(1), np.array([[0, 1]]), 4), ValueError,
     "(1, 2)"),
    ("2-D budgets", lambda d: d.speculate(["a"], [[1]], np.array([[4]])), ValueError, "(1, 1)"),
    # ids out of range
    ("start negative id", lambda d: d.start("b", [1, -3]), ValueError, "-3"),
    ("add negative id", lambda d: d.add("a", [2, 2, -1]), ValueError, "-1"),
    ("speculate negative id", lambda d: d.speculate(["a"], [[-5]], 4), ValueError, "-5"),
    ("start id = vocab", lambda d: d.start("b", [VOCAB]), ValueError, str(VOCAB)),
    ("add id > vocab", lambda d: d.add("a", np.array([3, 2**40])), ValueError, str(2**40)),
    ("speculate id > vocab", lambda d: d.speculate(["a"], [[1, 12]], 4), ValueError, "12"),
    ("draft_batch id > vocab", lambda d: d.draft_batch(["a"], i32(11), i64(0, 1), 4),
     ValueError, "11"),
    # budgets
    ("budget < 0", lambda d: d.speculate(["a"], [[1]], -1), ValueError, "-1"),
    ("budget > max", lambda d: d.speculate(["a"], [[1]], MAX_BUDGET + 1), ValueError,
     str(MAX_BUDGET + 1)),
    ("budget list > max", lambda d: d.speculate(["a"], [[1]], [MAX_BUDGET + 1]), ValueError,
     str(MAX_BUDGET + 1)),
    ("budget huge", lambda d: d.speculate(["a"], [[1]], 2**40), ValueError, str(2**40)),
    ("budget array huge", lambda d: d.speculate(["a"], [[1]], np.array([2**40])), ValueError,
     str(2**40)),
    ("budgets length", lambda d: d.speculate(["a"], [[1]], [1, 2]), ValueError,
     "budgets 1 (got 2)"),
    # request ids
    ("unknown request", lambda d: d.speculate(["zz"], [[1]], 4), KeyError, "'zz'"),
    ("unknown in batch", lambda d: d.speculate(["a", "zz"], [[1], [2]], [4, 4]), KeyError,
     "'zz'"),
    ("add unknown", lambda d: d.add("zz", [1]), KeyError, "'zz'"),
    ("num_tokens unknown", lambda d: d.num_tokens("zz"), KeyError, "'zz'"),
    ("request_bytes unknown", lambda d: d.request_bytes("zz"), KeyError, "'zz'"),
    ("duplicate in batch", lambda d: d.speculate(["a", "a"], [[1], [2]], 4), ValueError, "'a'"),
    ("start twice", lambda d: d.start("a", [1]), ValueError, "'a'"),
    ("empty request id", lambda d: d.start("", [1]), ValueError, "''"),
    ("non-str request id", lambda d: d.start(7, [1]), ValueError, "7"),  # type: ignore[arg-type]
    ("token lists count", lambda d: d.speculate(["a"], [[1], [2]], 4), ValueError,
     "2 token lists for 1"),
    # offsets
    ("offsets too short", lambda d: d.draft_batch(["a"], i32(1), i64(0), 4), ValueError,
     "offsets needs 2 entries (got 1)"),
    ("offsets too long", lambda d: d.draft_batch(["a"], i32(1), i64(0, 1, 1), 4), ValueError,
     "offsets needs 2 entries (got 3)"),
    ("offsets end short", lambda d: d.draft_batch(["a"], i32(1, 2), i64(0, 1), 4), ValueError,
     "got 0 and 1"),
    ("offsets end long", lambda d: d.draft_batch(["a"], i32(1), i64(0, 3), 4), ValueError,
     "got 0 and 3"),
    ("offsets start", lambda d: d.draft_batch(["a"], i32(1), i64(1, 1), 4), ValueError,
     "got 1 and 1"),
    ("offsets out of int64",
     lambda d: d.draft_batch(["a"], i32(1), np.array([0, 2**64 - 1], dtype=np.uint64), 4),
     ValueError, str(2**64 - 1)),
]


@pytest.mark.parametrize(("call", "exc", "pattern"), [c[1:] for c in BAD_CALLS],
                         ids=[c[0] for c in BAD_CALLS])
def test_bad_call_is_rejected_without_side_effects(call: Call, exc: type[Exception],
                                                   pattern: str) -> None:
    h = Harness()
    with pytest.raises(exc) as info:
        call(h.drafter)
    assert pattern in str(info.value)
    assert "b" not in h.drafter
    h.assert_still_works()
    # Again, now that the request has drafted once.
    with pytest.raises(exc):
        call(h.drafter)
    h.assert_still_works()


def test_decreasing_offsets_in_a_batch() -> None:
    h = Harness()
    h.drafter.start("b", [4])
    with pytest.raises(ValueError, match=re.escape("offsets[2] = 1 < 2")):
        h.drafter.draft_batch(["a", "b"], i32(1), i64(0, 2, 1), 4)
    # Neither request took the tokens of the rejected batch.
    assert h.drafter.num_tokens("b") == 1
    assert h.drafter.stop("b")
    h.assert_still_works()


def test_rejected_batch_changes_no_request() -> None:
    """A bad budget for the second request must not append the first one's tokens."""
    h = Harness()
    h.drafter.start("b", [4])
    with pytest.raises(ValueError, match=str(MAX_BUDGET + 5)):
        h.drafter.speculate(["a", "b"], [[1], [2]], [4, MAX_BUDGET + 5])
    with pytest.raises(ValueError, match="-7"):
        h.drafter.speculate(["a", "b"], [[1], [-7]], 4)
    assert h.drafter.num_tokens("b") == 1
    assert h.drafter.stop("b")
    h.assert_still_works()


def test_vocab_mismatch_between_datastore_and_drafter() -> None:
    other = Datastore.from_documents([[1, 2]], VOCAB + 1)
    with pytest.raises(ValueError, match=f"{VOCAB + 1}.*{VOCAB}"):
        Drafter(VOCAB, datastore=other)
    h = Harness()
    with pytest.raises(ValueError, match=f"{VOCAB + 1}.*{VOCAB}"):
        h.drafter.set_datastore(other)
    assert h.drafter.datastore is h.datastore  # the old one stays in use
    h.assert_still_works()
    with pytest.raises(ValueError, match="sub-index 0 has vocab_size 5"):
        Datastore([SubIndex.build([[1]], 5)], 6)
    with pytest.raises(ValueError, match="disagree on vocab_size"):
        _core.Datastore([SubIndex.build([[1]], 5).native, SubIndex.build([[1]], 6).native])


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"vocab_size": 0}, ValueError, "vocab_size 0"),
        ({"vocab_size": 2**30 + 1}, ValueError, str(2**30 + 1)),
        ({"vocab_size": True}, TypeError, "True"),
        ({"vocab_size": 10.0}, TypeError, "10.0"),
        ({"vocab_size": 10, "num_threads": 0}, ValueError, "num_threads 0"),
        ({"vocab_size": 10, "num_threads": 5000}, ValueError, "5000"),
        ({"vocab_size": 10, "num_threads": "2"}, TypeError, "'2'"),
    ],
)
def test_bad_drafter_arguments(kwargs: dict[str, Any], exc: type[Exception],
                               pattern: str) -> None:
    with pytest.raises(exc, match=re.escape(pattern)):
        Drafter(**kwargs)


# Out-of-range values for every DraftConfig field; a new field must be added here
# (entries for fields this build does not have are left out).
CONFIG_FIELDS = {f.name for f in dataclasses.fields(DraftConfig)}
OUT_OF_RANGE: dict[str, list[Any]] = {
    "input_max_prefix": [0, -1, 65],
    "input_max_depth": [3, 257],  # below input_max_prefix (4)
    "datastore_max_prefix": [0, 257, 2**31],
    "datastore_min_prefix": [0, -5],
    "datastore_samples": [0, 100001, 2**40],
    "datastore_max_continuation": [0, 1025],
    "datastore_min_tree_nodes": [-1, -(2**31) - 1],
    "input_weight": [-0.1, 1e7, float("nan"), float("inf")],
    "input_child_discount_base": [-1.0, float("nan")],
    "input_child_discount_per_match": [-1e-9, 2e6],
    "datastore_weight": [-0.5, float("-inf")],
    "datastore_child_discount": [-2.0, 1e6 + 1],
    "max_budget": [-1, 4097, 2**63],
    "input_smoothing": [-1.0, float("nan")],
    "datastore_smoothing": [-1.0, float("nan")],
    "recent_samples": [-1, 4097],
    "recent_min_match": [0, 65],
    "recent_max_match": [1, 1025],  # below recent_min_match (2)
    "recent_candidates": [0, 100001],
    "recent_held_tokens": [-1, 2**30 + 1],
    "node_score": [
        (1.0, 2.0),  # neither empty nor a bias and a weight per feature
        (float("nan"),) * (len(SCORE_FEATURES) + 1),
        (0.0,) * len(SCORE_FEATURES) + (float("inf"),),
    ],
}


def test_every_config_field_has_out_of_range_cases() -> None:
    missing = CONFIG_FIELDS - set(OUT_OF_RANGE)
    assert not missing, f"add out-of-range values for {sorted(missing)}"


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, v) for name, values in OUT_OF_RANGE.items() if name in CONFIG_FIELDS for v in values],
)
def test_bad_config_value_names_the_field(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=name):
        DraftConfig(**{name: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_budget", 4.0), ("input_weight", "0.5"), ("input_max_prefix", True),
     ("datastore_weight", None)],
)
def test_config_wrong_type_names_the_field(name: str, value: Any) -> None:
    with pytest.raises(TypeError, match=name):
        DraftConfig(**{name: value})


def test_config_limits_are_accepted() -> None:
    DraftConfig(input_max_prefix=64, input_max_depth=256, datastore_max_prefix=256,
                datastore_min_prefix=256, datastore_samples=100000,
                datastore_max_continuation=1024, datastore_min_tree_nodes=0, input_weight=1e6,
                input_child_discount_base=0.0, input_child_discount_per_match=1e6,
                datastore_weight=0.0, datastore_child_discount=1e6, max_budget=4096)
    DraftConfig(input_max_prefix=1, input_max_depth=1, max_budget=0)


def test_native_entry_points_validate() -> None:
    config = DraftConfig(max_budget=5).to_native()
    ctx = i32(1, 2, 1)
    with pytest.raises(ValueError, match="budget 6"):
        _core.draft_context(ctx, None, config, 6, True, VOCAB)
    with pytest.raises(ValueError, match="budget -1"):
        _core.draft_context(ctx, None, config, -1, True, VOCAB)
    with pytest.raises(ValueError, match="token id 10 at index 1"):
        _core.draft_context(i32(1, 10), None, config, 3, True, VOCAB)
    config.input_max_prefix = 0
    with pytest.raises(ValueError, match="input_max_prefix"):
        _core.draft_context(ctx, None, config, 3, True, VOCAB)
    with pytest.raises(ValueError, match="input_max_prefix"):
        _core.Drafter(config, VOCAB, 1)
