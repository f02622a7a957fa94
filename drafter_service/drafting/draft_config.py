"""Drafting parameters (SSSD §3.1) as a typed, validated value object."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields

from drafter_service.native import _core


@dataclass(frozen=True, slots=True)
class DraftConfig:
    """How candidate trees are built. Defaults follow the SSSD paper where it
    gives a value (P = 4, 100 samples, 0.6 input weight), except
    ``datastore_smoothing`` (the paper's estimator is k = 0) and the datastore tree's
    width: the paper reads 16-token continuations until the tree holds 50 nodes; here
    they are 8 tokens and the threshold is 100, so prefix shortening goes on until
    about 13 distinct continuations are in (docs/benchmarks.md, "Wider retrieval").

    Probabilities are occurrence ratios count(prefix + path) / count(prefix).
    A draft node's score is the product of its path's probabilities, scaled by
    the source weight and multiplied by a per-level discount below the first
    level (input: ``base + per_match * match_len``; datastore: a constant).
    """

    input_max_prefix: int = 4
    """P: the last 1..P tokens of the context are matched in the input trie."""
    input_max_depth: int = 16
    """Longest path stored in a request's input trie (memory is O(len * depth))."""
    datastore_max_prefix: int = 4
    """Longest context suffix looked up in the datastore (tried first)."""
    datastore_min_prefix: int = 1
    """Shortest context suffix looked up when longer ones find too little."""
    datastore_samples: int = 100
    """Continuations sampled per prefix length, split over sub-indices by match count."""
    datastore_max_continuation: int = 8
    """Tokens read after each sampled match (capped by the budget)."""
    datastore_min_tree_nodes: int = 100
    """Prefix shortening stops once the datastore tree has this many nodes."""
    input_weight: float = 0.6
    """Scale of input-trie probabilities (they are over-confident)."""
    input_child_discount_base: float = 0.6
    """Per-level discount of input paths: base + per_match * match_len."""
    input_child_discount_per_match: float = 0.1
    """See ``input_child_discount_base``."""
    datastore_weight: float = 1.0
    """Scale of datastore probabilities."""
    datastore_child_discount: float = 1.0
    """Per-level discount of datastore paths."""
    max_budget: int = 256
    """Largest draft budget a call may ask for."""
    recent_samples: int = 16
    """The recent tier: continuations taken per draft from the other requests the drafter
    holds (siblings in flight), drafted from as a source of its own weighted like the
    datastore (docs/algorithm.md, "The recent tier"). 0: no recent tier."""
    recent_min_match: int = 2
    """K: the context's last K tokens must occur in another request for it to be a match
    (the recent tier's index key)."""
    recent_max_match: int = 32
    """How far back a recent match is measured (longer ones are taken first)."""
    recent_candidates: int = 64
    """Recent matches weighed per draft, newest first, before the longest
    ``recent_samples`` are kept."""
    recent_held_tokens: int = 262_144
    """With the recent tier: the tokens of stored generations not folded into the live
    datastore's sub-indices yet that it drafts from meanwhile, at most (the oldest are
    released first past that; 0: none). About 100 bytes each."""
    input_smoothing: float = 0.0
    """Shrinks input-trie probabilities to count(child) / (count(node) + k)."""
    datastore_smoothing: float = 2.0
    """Shrinks datastore probabilities to count(child) / (count(node) + k). Deep
    datastore nodes rest on one or two samples and would otherwise score 1; k = 2
    raised greedy-replay acceptance on every dev set (k = 0 is the paper)."""
    node_score: tuple[float, ...] = ()
    """A learned node score (:mod:`drafter_service.drafting.node_score`): a bias and one
    weight per :data:`~drafter_service.drafting.drafter.SCORE_FEATURES` column, the
    logistic regression of P(node accepted | parent accepted); a node's score is the
    product of these probabilities along its path. Empty: the hand-set SSSD score."""

    def __post_init__(self) -> None:
        if not isinstance(self.node_score, tuple) or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) for w in self.node_score
        ):
            raise TypeError(f"DraftConfig.node_score must be a tuple of numbers, "
                            f"got {self.node_score!r}"[:200])  # fmt: skip
        for f in fields(self):
            if f.name == "node_score":
                continue
            value = getattr(self, f.name)
            expected = int if f.type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"DraftConfig.{f.name} must be a number, got {value!r}")
            if expected is int and not isinstance(value, int):
                raise TypeError(f"DraftConfig.{f.name} must be an int, got {value!r}")
            if expected is int and not -(2**31) <= value < 2**31:
                raise ValueError(f"DraftConfig.{f.name} = {value} is outside the int32 range")
        self.to_native().validate()

    def to_native(self) -> _core.DraftConfig:
        native = _core.DraftConfig()
        for name, value in asdict(self).items():
            setattr(native, name, list(value) if name == "node_score" else value)
        return native


def config_field_value(key: str, text: str) -> int | float:
    """The value of the :class:`DraftConfig` field ``key`` written as ``text`` (the
    ``KEY=VALUE`` options of the CLIs); :class:`ValueError` names the bad key or value.
    ``node_score`` is not set this way (it is a datastore's, or ``--node-score``)."""
    kinds = {f.name: f.type for f in fields(DraftConfig) if f.name != "node_score"}
    if key not in kinds:
        raise ValueError(f"{key!r} is not a DraftConfig field ({', '.join(sorted(kinds))})")
    kind = int if kinds[key] in ("int", int) else float
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{key} = {text!r} is not a {kind.__name__}") from None


def config_pair_argument(text: str) -> tuple[str, int | float]:
    """``KEY=VALUE`` as the field name and its value (:func:`config_field_value`), as an
    argparse ``type=``: the error names the bad key or value (a plain ValueError would be
    reported without its message)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, config_field_value(key, value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
