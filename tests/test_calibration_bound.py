"""drafter_bench.calibration_bound (issue 15, item 3): the ceiling of online calibration, run
end to end on a small synthetic data directory laid out like ../shared/data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from drafter_bench import calibration_bound
from drafter_bench.replay import ReplaySettings, replay
from drafter_bench.token_records import iter_documents, read_records
from drafter_service.datastore.sub_indices import SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.node_score import default_node_score

pytest.importorskip("sklearn")


def _write(path: Path, records: int, seed: int) -> None:
    """Answers that walk through a few shared phrases, so n-grams repeat."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, 50, size=int(rng.integers(3, 8))).tolist() for _ in range(10)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for _ in range(records):
            output: list[int] = []
            while len(output) < 40:
                output += phrases[int(rng.integers(0, len(phrases)))]
                if rng.random() < 0.3:
                    output.append(int(rng.integers(0, 50)))
            prompt = rng.integers(0, 50, size=12).tolist()
            f.write(json.dumps({"prompt_ids": prompt, "output_ids": output}) + "\n")


@pytest.mark.system
def test_rows_replay_the_second_half_with_each_score(tmp_path: Path) -> None:
    _write(tmp_path / calibration_bound.CORPUS, 60, seed=1)
    _write(tmp_path / "dev" / "tiny.jsonl.gz", 20, seed=2)
    out = tmp_path / "rows.jsonl"
    assert calibration_bound.main(["--data-dir", str(tmp_path), "--out", str(out),
                                   "--sets", "tiny"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["mode"], r["budget"]) for r in rows] == [
        ("corpus", 16), ("corpus", 32), ("live", 16), ("live", 32)
    ]
    for r in rows:
        assert r["fit_records"] == 10 and r["eval_records"] == 10 and r["fit_nodes"] > 0
        assert all(r[k] >= 1.0 for k in ("hand", "shipped", "calibrated", "refit"))
        assert r["calibration_a"] != 0.0
        assert r["command"].startswith("python -m drafter_bench.calibration_bound")
    # The shipped and hand-set columns are the plain replays of the second half.
    records = read_records(tmp_path / "dev" / "tiny.jsonl.gz", vocab_size=calibration_bound.VOCAB)
    base = [SubIndex.build(list(iter_documents(tmp_path / calibration_bound.CORPUS)),
                           calibration_bound.VOCAB)]  # fmt: skip
    for score, column in (((), "hand"), (default_node_score().as_config(), "shipped")):
        settings = ReplaySettings(method="both", budget=16, config=DraftConfig(node_score=score))
        assert rows[0][column] == round(replay(records[10:], settings, base).tau, 4)
        live = replay(records, ReplaySettings(method="both", budget=16, live=True,
                                              config=DraftConfig(node_score=score)))  # fmt: skip
        tail = live.finished[10:]
        assert rows[2][column] == round(sum(n for n, _ in tail) / sum(s for _, s in tail), 4)
