"""The learned node score: its JSON form, training (datastore-builder train-score), and
which score each datastore of the service drafts with."""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from datastore_builder.builder_cli import main as builder_main
from datastore_builder.recent_training import fit_recent
from datastore_builder.score_training import read_training_records, tie_live_to_base, train
from datastore_builder.training_data import labelled_nodes
from drafter_service.drafting.drafter import SCORE_FEATURES
from drafter_service.drafting.node_score import (
    METADATA_KEY,
    NodeScore,
    NodeScoreError,
    default_node_score,
    resolve_node_score,
)
from drafter_service.service.open_catalog import open_catalog
from drafter_service.service.setting_values import DEFAULT_DATASTORE
from drafter_service.service.settings import ServeConfig
from drafter_service.snapshot.store import load_snapshot, read_manifest

VOCAB = 64


def _score(bias: float = 0.5) -> NodeScore:
    return NodeScore(bias, tuple(0.01 * i for i in range(len(SCORE_FEATURES))), "test")


def test_json_round_trip_and_config_order() -> None:
    score = _score()
    again = NodeScore.from_json(json.loads(json.dumps(score.to_json())))
    assert again == score
    assert again.as_config() == (0.5, *score.weights)
    assert list(score.to_json()["weights"]) == list(SCORE_FEATURES)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o: o.update(format_version=2), "format_version 2 is not supported"),
        (lambda o: o["weights"].pop("depth"), "missing ['depth']"),
        (lambda o: o["weights"].update(colour=1.0), "unknown ['colour']"),
        (lambda o: o["weights"].update(depth="x"), "depth = 'x' is not a number"),
        (lambda o: o.update(bias=math.inf), "bias = inf is not finite"),
        (lambda o: o.update(weights=[1.0]), "'weights' must be an object"),
    ],
)
def test_a_bad_score_is_refused_by_name(change: object, message: str) -> None:
    obj = _score().to_json()
    change(obj)  # type: ignore[operator]
    with pytest.raises(NodeScoreError, match=f"in.json: .*{_escape(message)}"):
        NodeScore.from_json(obj, where="in.json")


def _escape(text: str) -> str:
    return text.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")


def test_the_shipped_default_and_how_a_datastore_picks_its_score(tmp_path: Path) -> None:
    shipped = default_node_score()
    assert len(shipped.weights) == len(SCORE_FEATURES) and shipped.trained_on
    assert resolve_node_score("hand", None, "x") == ()
    assert resolve_node_score("default", None, "x") == shipped.as_config()
    carried = _score(-1.0)
    metadata: dict[str, object] = {METADATA_KEY: carried.to_json()}
    assert resolve_node_score("default", metadata, "x") == carried.as_config()
    path = tmp_path / "score.json"
    path.write_text(json.dumps(_score(2.0).to_json()))
    assert resolve_node_score(str(path), metadata, "x")[0] == 2.0  # a file beats the snapshot
    with pytest.raises(NodeScoreError, match=r"snap-7: metadata\.node_score: expected an object"):
        resolve_node_score("default", {METADATA_KEY: 3}, "snap-7")


def test_labels_follow_the_recorded_continuation() -> None:
    # Root children 5 and 6; 7 under 5, 8 under 6; the truth is 5 7 9.
    parents = np.array([-1, -1, 0, 1], dtype=np.int32)
    tokens = np.array([5, 6, 7, 8], dtype=np.int32)
    labelled, labels = labelled_nodes(parents, tokens, [5, 7, 9])
    assert labelled.tolist() == [True, True, True, False]  # 8's parent 6 is wrong
    assert labels.tolist() == [1, 0, 1]
    labelled, labels = labelled_nodes(parents, tokens, [5])  # the output ends after 5
    assert labelled.tolist() == [True, True, True, False] and labels.tolist() == [1, 0, 0]


def _write_records(path: Path, n_prompts: int = 24, answers: int = 3) -> None:
    """Token records: every prompt answered ``answers`` times, each answer a noisy walk
    through a few fixed phrases (so n-grams repeat within and across records)."""
    rng = np.random.default_rng(7)
    phrases = [rng.integers(0, VOCAB, size=int(rng.integers(3, 9))).tolist() for _ in range(12)]
    with gzip.open(path, "wt") as f:
        for p in range(n_prompts):
            prompt = rng.integers(0, VOCAB, size=20).tolist()
            for _ in range(answers):
                output: list[int] = []
                while len(output) < 60:
                    output += phrases[(p + int(rng.integers(0, 4))) % len(phrases)]
                    if rng.random() < 0.3:
                        output.append(int(rng.integers(0, VOCAB)))
                f.write(json.dumps({"prompt_ids": prompt, "output_ids": output}) + "\n")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A corpus, its snapshot, and the snapshot train-score made from both."""
    root = tmp_path_factory.mktemp("score")
    records = root / "records.jsonl.gz"
    _write_records(records)
    base, scored = root / "base", root / "scored"
    assert builder_main(["build", "--quiet", "--input", str(records), "--records", "token-ids",
                         "--vocab-size", str(VOCAB), "--output", str(base)]) == 0  # fmt: skip
    code = builder_main([
        "train-score", "--records", str(records), "--snapshot", str(base), "--output",
        str(scored), "--score-out", str(root / "score.json"), "--holdout", "12",
        "--candidate-budget", "32", "--quiet",
    ])  # fmt: skip
    assert code == 0
    return records, base, scored


def test_train_score_ships_the_score_with_a_new_snapshot(
    trained: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, base, scored = trained
    info = read_manifest(scored)
    score = NodeScore.from_json(info.metadata[METADATA_KEY])
    assert NodeScore.from_json(json.loads((base.parent / "score.json").read_text())) == score
    assert METADATA_KEY not in read_manifest(base).metadata  # the input is untouched
    # The data is the input's, hardlinked rather than copied.
    for entry in info.sub_indices:
        for suffix in (".tokens.i32", ".sa.i32"):
            a, b = base / f"{entry.name}{suffix}", scored / f"{entry.name}{suffix}"
            assert os.stat(a).st_ino == os.stat(b).st_ino
    datastore, _ = load_snapshot(scored)
    assert datastore.num_tokens == load_snapshot(base)[0].num_tokens
    # Trained on one datastore, the live source borrows the base's weights.
    weights = dict(zip(SCORE_FEATURES, score.weights, strict=True))
    for name in ("present", "log_cond", "log_count", "log_parent"):
        assert weights[f"live_{name}"] == weights[f"base_{name}"]
    assert weights["base_present"] != 0.0 and "12 held-out records" in score.trained_on


def test_train_score_reports_a_fit_better_than_the_base_rate(
    tmp_path: Path, trained: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    records = trained[0]
    out = tmp_path / "s.json"
    assert builder_main(["train-score", "--records", str(records), "--vocab-size", str(VOCAB),
                         "--score-out", str(out), "--holdout", "12", "--quiet"]) == 0  # fmt: skip
    line = capsys.readouterr().out.splitlines()[0]
    loss, base = (float(x.rstrip(")"))
                  for x in line.split("log-loss ")[1].split(" (always the base rate: "))
    assert loss < base
    NodeScore.from_json(json.loads(out.read_text()))


def test_training_drafts_again_with_a_live_source_whose_weights_are_the_bases(
    trained: tuple[Path, Path, Path],
) -> None:
    records = read_training_records(trained[0], VOCAB)
    score, report = train(records, VOCAB, holdout=12, candidate_budget=32)
    # The live pass added rows (the records before each one as a live source), and its
    # fit has one weight per base/live pair.
    assert 0 < report.live_nodes < report.nodes
    weights = dict(zip(SCORE_FEATURES, score.weights, strict=True))
    for name in ("present", "log_cond", "log_count", "log_parent"):
        assert weights[f"live_{name}"] == weights[f"base_{name}"] != 0.0
    # Tying adds each live column into its base column.
    x = np.arange(3 * len(SCORE_FEATURES), dtype=np.float64).reshape(3, -1)
    tied = tie_live_to_base(x)
    for i, name in enumerate(SCORE_FEATURES):
        if name.startswith("live_"):
            j = SCORE_FEATURES.index("base_" + name[len("live_"):])
            assert (tied[:, i] == 0).all() and (tied[:, j] == x[:, j] + x[:, i]).all()
        elif not name.startswith("base_"):
            assert (tied[:, i] == x[:, i]).all()


def test_training_fits_the_recent_tiers_weights_with_requests_in_flight_alone(
    trained: tuple[Path, Path, Path],
) -> None:
    """The third pass: each held-out record drafted beside its siblings (the other answers
    to its prompt) and unrelated records in flight, the tier on. It fits the tier's weights
    only, on the nodes the tier proposed, better than weights of 0 on the held-out fifth;
    every other weight is the first two passes' fit."""
    records = read_training_records(trained[0], VOCAB)
    score, report = train(records, VOCAB, holdout=12, candidate_budget=32)
    recent = report.recent
    assert recent.nodes > 0 and recent.validation_logloss < recent.before_logloss
    weights = dict(zip(SCORE_FEATURES, score.weights, strict=True))
    assert weights["recent_present"] != 0.0 and weights["recent_log_cond"] != 0.0
    # The other weights: what the first two passes alone give (weighing the tier 0).
    alone, _ = train(records, VOCAB, holdout=12, candidate_budget=32, recent_pass=False)
    assert score.bias == alone.bias
    for name, got, first in zip(SCORE_FEATURES, score.weights, alone.weights, strict=True):
        assert got == first if not name.startswith("recent_") else first == 0.0, name


def test_the_recent_fit_is_the_log_loss_minimum_with_the_rest_held() -> None:
    """Newton's method on the recent columns with the other weights as an offset: at its
    answer the (L2-regularized) gradient is 0, and weights of 0 lose more."""
    rng = np.random.default_rng(3)
    n = 4000
    x = np.zeros((n, len(SCORE_FEATURES)))
    x[:, SCORE_FEATURES.index("depth")] = rng.integers(1, 8, n)
    columns = [SCORE_FEATURES.index(f) for f in SCORE_FEATURES if f.startswith("recent_")]
    x[:, columns] = rng.normal(size=(n, len(columns)))
    truth = np.zeros(len(SCORE_FEATURES))
    truth[columns] = [1.0, -0.5, 0.25, 0.8, 0.0]
    base = NodeScore(-1.0, tuple(-0.2 if f == "depth" else 0.0 for f in SCORE_FEATURES), "t")
    z = x @ (np.asarray(base.weights) + truth) + base.bias
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.int8)
    fitted = fit_recent(base, x, y, l2=0.0)
    w = np.asarray(fitted.weights)
    assert w[SCORE_FEATURES.index("depth")] == -0.2  # held
    p = 1 / (1 + np.exp(-(x @ w + fitted.bias)))
    assert np.abs(x[:, columns].T @ (p - y)).max() < 1e-6 * n
    assert np.abs(w[columns] - truth[columns]).max() < 0.15  # near the truth it was drawn from


def test_train_score_learns_from_the_drafting_its_config_sets(
    tmp_path: Path, trained: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    records = trained[0]
    common = ["train-score", "--records", str(records), "--vocab-size", str(VOCAB),
              "--holdout", "12", "--candidate-budget", "32", "--quiet"]  # fmt: skip
    scores = {}
    for name, extra in (("default", []), ("narrow", ["--config", "datastore_max_prefix=1",
                                                     "--config", "datastore_samples=4"])):
        out = tmp_path / f"{name}.json"
        assert builder_main([*common, *extra, "--score-out", str(out)]) == 0
        scores[name] = NodeScore.from_json(json.loads(out.read_text()))
    # Other candidates, another fit; the score says what drafting it was fitted for.
    assert scores["narrow"].weights != scores["default"].weights
    assert scores["narrow"].trained_on.endswith("datastore_max_prefix=1, datastore_samples=4")
    assert "datastore_" not in scores["default"].trained_on
    cases = [
        (["--config", "smoothing=1"], "'smoothing' is not a DraftConfig field"),
        (["--config", "datastore_samples=many"], "datastore_samples = 'many' is not a int"),
        (["--config", "datastore_samples=0"], "datastore_samples"),
        (["--config", "max_budget=512"], "max_budget is not set here"),
    ]
    for extra, message in cases:
        with contextlib.suppress(SystemExit):
            assert builder_main([*common, *extra, "--score-out", str(tmp_path / "x.json")]) == 2
        assert message in capsys.readouterr().err, extra
    assert not (tmp_path / "x.json").exists()


def test_train_score_errors_name_the_problem(
    tmp_path: Path, trained: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    records, base, scored = trained
    cases = [
        (["--vocab-size", "64"], "nothing to write"),
        (["--snapshot", str(base)], "--snapshot and --output go together"),
        (["--snapshot", str(base), "--output", str(scored)], "already exists"),
        (["--score-out", str(tmp_path / "s.json")], "give --vocab-size"),
        (["--vocab-size", "8", "--score-out", str(tmp_path / "s.json")], "outside [0, 8)"),
        (["--vocab-size", "64", "--holdout", "999", "--score-out", str(tmp_path / "s.json")],
         "--holdout 999 must be in [1, 71]"),
    ]  # fmt: skip
    for extra, message in cases:
        assert builder_main(["train-score", "--records", str(records), *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra


def test_each_datastore_drafts_with_its_snapshots_score(
    tmp_path: Path, trained: tuple[Path, Path, Path]
) -> None:
    _, base, scored = trained
    carried = NodeScore.from_json(read_manifest(scored).metadata[METADATA_KEY]).as_config()

    def scores(**settings: object) -> dict[str, tuple[float, ...]]:
        config = ServeConfig(vocab_size=VOCAB, draft_threads=1, **settings)  # type: ignore[arg-type]
        catalog = open_catalog(config)
        try:
            return {name: slot.drafter.config.node_score for name, slot in catalog.slots.items()}
        finally:
            catalog.close()

    got = scores(data_dir=tmp_path / "a", snapshot=scored, datastores=(("plain", base),))
    assert got == {DEFAULT_DATASTORE: carried, "plain": default_node_score().as_config()}
    got = scores(data_dir=tmp_path / "b", datastores=(("tuned", scored),), node_score="hand")
    assert got == {DEFAULT_DATASTORE: (), "tuned": ()}
    with pytest.raises(ValueError, match=r"node score file .*nowhere\.json"):
        ServeConfig(node_score=str(tmp_path / "nowhere.json"))
