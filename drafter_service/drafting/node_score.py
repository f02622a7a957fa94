"""The learned node score: P(draft node accepted | its parent accepted), a logistic
regression over what fusion knows of each candidate (``DraftConfig.node_score``).

``datastore-builder train-score`` fits it and stores it in a snapshot's manifest metadata
(:data:`METADATA_KEY`); see :func:`resolve_node_score` for which one the service drafts with.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, cast

from drafter_service.drafting.drafter import SCORE_FEATURES

FORMAT_VERSION = 1
"""Version of the JSON form; readers refuse any other."""

METADATA_KEY = "node_score"
"""Key of a snapshot manifest's metadata that holds a node score's JSON form."""

_DEFAULT_RESOURCE = "default_node_score.json"


class NodeScoreError(ValueError):
    """A node score's JSON form is malformed; the message names the bad value."""


@dataclass(frozen=True, slots=True)
class NodeScore:
    """logit P(node accepted | parent accepted) = ``bias`` + sum of ``weights[f]`` times
    feature ``f`` (:data:`~drafter_service.drafting.drafter.SCORE_FEATURES`, raw values,
    no standardization)."""

    bias: float
    weights: tuple[float, ...]
    """One per :data:`SCORE_FEATURES` column, in that order."""
    trained_on: str = ""
    """Free text: what it was fitted on (shown by tools, never interpreted)."""

    def __post_init__(self) -> None:
        if len(self.weights) != len(SCORE_FEATURES):
            raise NodeScoreError(
                f"node score: {len(self.weights)} weights, expected {len(SCORE_FEATURES)}"
            )
        for name, value in (("bias", self.bias), *zip(SCORE_FEATURES, self.weights, strict=True)):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise NodeScoreError(f"node score: {name} = {value!r} is not a number")
            if not math.isfinite(value):
                raise NodeScoreError(f"node score: {name} = {value!r} is not finite")

    def as_config(self) -> tuple[float, ...]:
        """The ``DraftConfig.node_score`` value: the bias, then the weights."""
        return (float(self.bias), *map(float, self.weights))

    def to_json(self) -> dict[str, Any]:
        """The versioned JSON form (weights by feature name)."""
        return {
            "format_version": FORMAT_VERSION,
            "bias": self.bias,
            "weights": dict(zip(SCORE_FEATURES, self.weights, strict=True)),
            "trained_on": self.trained_on,
        }

    @classmethod
    def from_json(cls, obj: object, where: str = "node score") -> NodeScore:
        """Parses :meth:`to_json`'s form; :class:`NodeScoreError` names what is wrong and
        ``where`` it was read from."""
        if not isinstance(obj, dict):
            raise NodeScoreError(f"{where}: expected an object, got {type(obj).__name__}")
        version = obj.get("format_version")
        if version != FORMAT_VERSION:
            raise NodeScoreError(
                f"{where}: format_version {version!r} is not supported "
                f"(this reader knows {FORMAT_VERSION})"
            )
        weights = obj.get("weights")
        if not isinstance(weights, dict):
            raise NodeScoreError(f"{where}: 'weights' must be an object of feature -> number")
        unknown = sorted(set(weights) - set(SCORE_FEATURES))
        # A score trained before the recent tier existed leaves it out: weight 0.
        weights = {**dict.fromkeys(RECENT_FEATURES, 0.0), **weights}
        missing = [f for f in SCORE_FEATURES if f not in weights]
        if unknown or missing:
            raise NodeScoreError(
                f"{where}: weights must name exactly the features {list(SCORE_FEATURES)}; "
                f"unknown {unknown}, missing {missing}"
            )
        trained_on = obj.get("trained_on", "")
        if not isinstance(trained_on, str):
            raise NodeScoreError(f"{where}: 'trained_on' must be a string")
        bias = cast(float, obj.get("bias"))  # any value: __post_init__ names a bad one
        try:
            return cls(bias, tuple(weights[f] for f in SCORE_FEATURES), trained_on)
        except NodeScoreError as exc:
            raise NodeScoreError(f"{where}: {exc}") from None


RECENT_FEATURES = tuple(f for f in SCORE_FEATURES if f.startswith("recent_"))
"""The recent tier's columns: a node score without them (trained before the tier existed)
reads as weighing them 0."""


def default_node_score() -> NodeScore:
    """The node score shipped with this package (trained with ``datastore-builder
    train-score`` on a held-out split of a public Llama-3-family corpus; the features
    are counts, lengths and n-gram flags, so it does not depend on the tokenizer)."""
    text = resources.files(__package__).joinpath(_DEFAULT_RESOURCE).read_text("utf-8")
    return NodeScore.from_json(json.loads(text), where=f"{__package__}/{_DEFAULT_RESOURCE}")


NODE_SCORE_CHOICES = ("default", "hand")
"""``--node-score`` words; anything else is a node score JSON file."""


def read_node_score(path: str | Path) -> NodeScore:
    """A node score JSON file (``datastore-builder train-score --score-out``)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise NodeScoreError(f"node score file {path}: {exc}") from None
    return NodeScore.from_json(obj, where=str(path))


def resolve_node_score(
    choice: str, metadata: dict[str, object] | None, where: str
) -> tuple[float, ...]:
    """The ``DraftConfig.node_score`` for ``--node-score choice``: ``hand`` is the
    hand-set score; ``default`` the score a snapshot's manifest ``metadata`` carries
    (``where`` names the snapshot in errors), else :func:`default_node_score`; anything
    else a node score file."""
    if choice == "hand":
        return ()
    if choice != "default":
        return read_node_score(choice).as_config()
    if metadata is None or METADATA_KEY not in metadata:
        return default_node_score().as_config()
    where = f"{where}: metadata.{METADATA_KEY}"
    return NodeScore.from_json(metadata[METADATA_KEY], where=where).as_config()
