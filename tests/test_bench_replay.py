"""Tests of ``drafter-bench replay``: step counting, PLD, the data reader and the CLI."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from math import ceil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drafter_bench.acceptance import accepted_length
from drafter_bench.bench_cli import REPORT_KEYS, main
from drafter_bench.live_replay import ReplayLiveStore
from drafter_bench.pld import PldIndex, propose
from drafter_bench.replay import ReplaySettings, replay, sibling_groups
from drafter_bench.token_records import DataError, Record, iter_records, read_records
from drafter_service.datastore.sub_indices import SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.node_score import default_node_score
from drafter_service.live.live_datastore import LivePolicy

VOCAB = 128256

# The load benchmark's own client deadline: a bound on failure only. A step of a loaded
# machine can take over the default second, and a step lost to it fails a test that is
# about what the benchmark reports, not about how fast this machine is.
PATIENT = ["--client-deadline-ms", "120000"]


def rec(prompt: list[int], output: list[int], rid: str = "r") -> Record:
    return Record(rid, np.array(prompt, dtype=np.int32), np.array(output, dtype=np.int32))


# --- step counting on hand-checked cases -------------------------------------------------


def test_help_is_whole_and_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    """The description is a whole sentence (it once stopped mid-list), with no reST markup,
    every subcommand and the example are shown."""
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and "::" not in out
    assert "one subcommand each;\n'drafter-bench COMMAND --help' lists" in out
    for command in ["replay", "load", "worker", "engine", "scale"]:
        assert f"\n    {command} " in out
    assert "drafter-bench replay --data dev.jsonl.gz --corpus corpus.jsonl.gz \\\n" in out


def test_accepted_length_follows_the_deepest_matching_path() -> None:
    # root -> 5, root -> 6 -> 8 -> 9, 6 -> 7
    tokens, parents = [5, 6, 7, 8, 9], [-1, -1, 1, 1, 3]
    assert accepted_length(tokens, parents, [6, 8, 9, 1], 0) == 3
    assert accepted_length(tokens, parents, [6, 8, 4], 0) == 2
    assert accepted_length(tokens, parents, [0, 6, 8], 1) == 2  # capped by the output end
    assert accepted_length(tokens, parents, [7], 0) == 0  # 7 is not a child of the root
    assert accepted_length([], [], [1], 0) == 0


# Prompt 10..14; output 20, then the prompt again, then 21.
#  step 1: last token 14 seen once (no continuation) -> no draft, commit 20
#  step 2: 20 is new -> commit 10
#  step 3: 10 was followed by 11 12 13 14 -> 4 accepted + bonus 21 -> done
ECHO = rec([10, 11, 12, 13, 14], [20, 10, 11, 12, 13, 14, 21])


@pytest.mark.parametrize("method", ["input", "both", "pld"])
def test_echo_of_the_prompt_is_accepted(method: str) -> None:
    result = replay([ECHO], ReplaySettings(method=method, budget=16))
    assert (result.steps, result.output_tokens, result.accepted_tokens) == (3, 7, 4)
    assert result.tau == pytest.approx(7 / 3)
    assert result.records == 1 and len(result.draft_ns) == 3


def test_datastore_only_drafts_from_the_corpus_and_not_the_input() -> None:
    base = [SubIndex.build([[6, 7, 8, 9, 1, 2], [3, 3, 3]], VOCAB)]
    record = rec([6, 7, 8, 9, 5, 6], [7, 8, 9, 1, 2])
    # Context ends in 6: the corpus continues 7 8 9 1 2 = the whole output in one step.
    for via in ("drafter", "context"):
        result = replay([record], ReplaySettings("datastore", 16, datastore_via=via), base)
        assert (result.steps, result.accepted_tokens) == (1, 5)
    # The input alone has seen 6 followed by 7 8 9 (then 5): 3 accepted + bonus 1, then 2.
    result = replay([record], ReplaySettings("input", 16), base)
    assert (result.steps, result.accepted_tokens) == (2, 3)
    # The datastore alone without a corpus: one token per step.
    assert replay([record], ReplaySettings("datastore", 16)).tau == 1.0


def test_budget_caps_the_accepted_length() -> None:
    record = rec(list(range(100, 120)), list(range(100, 120)))
    # Step 1 commits 100 (the last prompt token 119 has no continuation), then
    # each step accepts 2 + 1 bonus: 19 tokens in ceil(19 / 3) = 7 steps.
    result = replay([record], ReplaySettings("input", 2))
    assert (result.steps, result.output_tokens) == (8, 20)


# Prompt 1 2 1 2 1 3 9; output 1 3 8 1 3 8 1 3. A 1-node input tree always follows "1"
# with its likelier "2" and misses; an 8-node tree also holds "3" (and "3 8" once seen).
# Ceiling 8, budget 1, by hand:
#  p=0: 9 has no continuation -> commit 1
#  p=1: "1" -> 2 | 3 -> 9: 3 right, then 8 not under it -> 1 accepted, commit 3 8
#  p=3: "8" has no continuation -> commit 1
#  p=4: "1" -> 2 | 3 -> 9 | 8: 3 8 right, capped at 1 -> commit 3 8
#  p=6: "1 3 8" -> 1 -> 3: 2 right, capped at 1 -> commit 1 3, done
ALTERNATIVE = rec([1, 2, 1, 2, 1, 3, 9], [1, 3, 8, 1, 3, 8, 1, 3])


def test_ceiling_accepts_from_the_larger_tree_up_to_the_budget() -> None:
    plain = replay([ALTERNATIVE], ReplaySettings("input", 1))
    ceiling = replay([ALTERNATIVE], ReplaySettings("input", 1, ceiling=8))
    assert (plain.steps, plain.accepted_tokens) == (7, 2)
    assert (ceiling.steps, ceiling.accepted_tokens) == (5, 3)
    # A ceiling of the budget itself drafts the same trees: the same replay.
    records = random_records(4, 20)
    for method in ("input", "both"):
        same = replay(records, ReplaySettings(method, 6, ceiling=6))
        base = replay(records, ReplaySettings(method, 6))
        assert (same.steps, same.accepted_tokens) == (base.steps, base.accepted_tokens)
    with pytest.raises(ValueError, match="ceiling 4 is below budget 6"):
        replay(records, ReplaySettings("input", 6, ceiling=4))


def test_chains_verify_the_best_path_of_each_tree_and_stop_at_the_min_score() -> None:
    """``chain``: each step verifies only the best chain of its tree (at most K tokens,
    what vLLM verifies), so it accepts at most what the tree does and drafts at most K a
    step; a min score of 1 cuts every chain (no drafts, one token a step)."""
    records = [rec(list(range(100, 140)), list(range(100, 140)) * 2)]
    tree = replay(records, ReplaySettings("input", 16))
    chain = replay(records, ReplaySettings("input", 16, chain=4))
    assert chain.steps >= tree.steps and chain.accepted_tokens > 0
    assert chain.drafted_tokens <= 4 * chain.steps < tree.drafted_tokens
    assert chain.steps == ceil(80 / 5) + 1  # 4 + 1 a step once the prompt repeats
    none = replay(records, ReplaySettings("input", 16, chain=4, chain_min_score=1.0))
    assert (none.steps, none.drafted_tokens) == (80, 0)
    with pytest.raises(ValueError, match="chains are chosen by node scores: method 'pld'"):
        replay(records, ReplaySettings("pld", 16, chain=4))


def test_live_mode_ingests_finished_records() -> None:
    a = rec([1, 2, 3], [40, 41, 42, 43], "a")
    b = rec([9, 2, 3], [40, 41, 42, 43], "b")
    # a sees an empty datastore: 4 steps; b finds "2 3 -> 40 41 42 43": 1 step.
    result = replay([a, b], ReplaySettings("datastore", 16, live=True))
    assert (result.steps, result.live_rebuilds) == (5, 2)
    assert result.datastore_tokens == 2 * 7 + 1  # two documents and a separator
    # In lockstep, b runs beside a and cannot see it.
    assert replay([a, b], ReplaySettings("datastore", 16, live=True, batch=2)).steps == 8
    # Without --live nothing is learned.
    assert replay([a, b], ReplaySettings("datastore", 16)).steps == 8


def test_live_base_layouts_draft_from_the_base_and_the_live_records() -> None:
    base = [SubIndex.build([[5, 6, 70, 71, 72, 73]], VOCAB)]
    a = rec([1, 2, 3], [40, 41, 42, 43], "a")
    # b continues a's output (learned live) and then the base's "5 6 -> 70 .. 73".
    b = rec([9, 2, 3], [40, 41, 42, 43, 5, 6, 70, 71, 72, 73], "b")
    # One separator between the base and a when a folds into the base's sub-index.
    for layout, separators in (("seed", 2), ("pinned", 1)):
        settings = ReplaySettings("datastore", 16, live=True, live_base=layout)
        result = replay([a, b], settings, base)
        # a: the base knows nothing of it, 4 steps; b: 40..43 (live) + bonus 5, then
        # 6 70 71 72 73 (base) in one step.
        assert (result.steps, result.live_rebuilds) == (4 + 2, 2), layout
        assert result.datastore_tokens == 6 + 7 + 13 + separators  # base, a, b
    with pytest.raises(ValueError, match="live base layout 'merged'"):
        replay([a], ReplaySettings("datastore", 16, live=True, live_base="merged"), base)


@pytest.mark.parametrize(("layout", "sizes"), [("seed", [6 + 1 + 7]), ("pinned", [6, 7])])
def test_live_base_layouts_keep_the_base_in_or_beside_the_learned_sub_indices(
    layout: str, sizes: list[int]
) -> None:
    base = [SubIndex.build([[5, 6, 70, 71, 72, 73]], VOCAB)]
    store = ReplayLiveStore(base, VOCAB, LivePolicy(rebuild_min_tokens=1), layout)
    try:
        datastore = store.ingest([rec([1, 2, 3], [40, 41, 42, 43])])
        assert [s.num_tokens for s in datastore.sub_indices] == sizes
        pinned = [c.name for c in store.store.corpora]
        assert pinned == (["replay-base"] if layout == "pinned" else [])
    finally:
        store.close()


def random_records(seed: int, count: int) -> list[Record]:
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, 50, size=int(rng.integers(3, 9))) for _ in range(12)]
    out = []
    for i in range(count):
        parts = [phrases[j] for j in rng.integers(0, len(phrases), size=int(rng.integers(2, 30)))]
        text = np.concatenate(parts).astype(np.int32)
        cut = int(rng.integers(1, len(text)))
        out.append(Record(str(i), text[:cut], text[cut:]))
    return out


def test_tau_does_not_depend_on_batch_or_threads() -> None:
    """Without the recent tier (with it, requests replayed together draft from each other:
    tests/test_recent_tier.py), and with it at batch 1, where it is inert."""
    records = random_records(0, 30)
    base = [SubIndex.build([r.output_ids for r in random_records(1, 40)], VOCAB)]
    alone = DraftConfig(recent_samples=0)
    for method in ("pld", "input", "datastore", "both"):
        tier = replay(records, ReplaySettings(method, 8), base)
        runs = [
            replay(records, ReplaySettings(method, 8, batch=b, threads=t, config=alone), base)
            for b, t in ((1, 1), (4, 1), (7, 3))
        ]
        outcomes = {(r.steps, r.accepted_tokens, r.output_tokens) for r in [*runs, tier]}
        assert len(outcomes) == 1, method
        assert runs[0].draft_ns and not runs[0].batch_ns and runs[1].batch_ns
    via = [replay(records, ReplaySettings("datastore", 8, datastore_via=v), base) for v in
           ("drafter", "context")]  # fmt: skip
    assert via[0].steps == via[1].steps


# --- PLD ---------------------------------------------------------------------------------


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Longest n in [min_n, max_n] whose suffix occurs earlier; first occurrence wins."""
    total = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        for j in range(total - n):  # starts before the suffix's own start
            if tokens[j : j + n] == tokens[total - n :]:
                return tokens[j + n : j + n + k]
    return []


def reversed_kmp(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The shape of vLLM's proposer: KMP over the reversed sequence, capped at max_n."""
    total = len(tokens)
    if total < min_n or k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * max_n
    longest = position = state = 0
    i = 1
    while i < total:
        if rev[state] == rev[i]:
            state += 1
            if state >= longest:
                longest, position = state, i
            if i < max_n:
                lps[i] = state
            if state == max_n:
                state = lps[max_n - 1]
            i += 1
        elif state:
            state = lps[state - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start : start + k]


@pytest.mark.parametrize(
    ("tokens", "k", "expected"),
    [
        ([1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3], 3, [9, 1, 2]),  # first occurrence, not the latest
        ([1, 2, 3, 4, 2, 3, 5, 3], 2, [4, 2]),  # only n = 1 matches: first 3 -> 4 2
        ([5, 5, 5], 4, [5]),  # overlapping occurrence; draft cut at the end
        ([1, 2, 3], 4, []),
        ([7], 4, []),
        ([], 4, []),
        ([1, 2, 1, 2], 0, []),
    ],
)
def test_pld_hand_cases(tokens: list[int], k: int, expected: list[int]) -> None:
    assert propose(tokens, k, 1, 4) == expected
    assert PldIndex(1, 4, tokens).propose(k) == expected


def test_pld_respects_min_n() -> None:
    tokens = [1, 2, 3, 4, 2, 3, 5, 3]
    assert propose(tokens, 2, 2, 4) == []
    assert propose([*tokens, 5], 2, 2, 4) == [3, 5]  # "3 5" occurred before


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=40),
    k=st.integers(0, 6),
    min_n=st.integers(1, 3),
    extra=st.integers(0, 3),
    chunks=st.lists(st.integers(1, 5), max_size=10),
)
def test_pld_matches_brute_force(
    tokens: list[int], k: int, min_n: int, extra: int, chunks: list[int]
) -> None:
    max_n = min_n + extra
    expected = brute_force(tokens, k, min_n, max_n)
    assert propose(tokens, k, min_n, max_n) == expected
    assert propose(np.array(tokens, dtype=np.int32), k, min_n, max_n) == expected
    assert reversed_kmp(tokens, k, min_n, max_n) == expected
    index, pos = PldIndex(min_n, max_n), 0
    for size in [*chunks, len(tokens)]:  # grown in pieces, queried on the way
        index.extend(tokens[pos : pos + size])
        pos = min(len(tokens), pos + size)
        assert index.propose(k) == brute_force(tokens[:pos], k, min_n, max_n)


# --- data reader -------------------------------------------------------------------------


def write_jsonl(path: Path, lines: list[str]) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def test_reader_reads_plain_and_gzip(tmp_path: Path) -> None:
    line = json.dumps({"id": "x", "prompt_ids": [1, 2], "output_ids": [3]})
    for name in ("a.jsonl", "a.jsonl.gz"):
        path = write_jsonl(tmp_path / name, [line, "", line])
        records = read_records(path)
        assert [r.id for r in records] == ["x", "x"]
        assert records[0].prompt_ids.tolist() == [1, 2] and records[0].output_ids.dtype == np.int32
        assert len(read_records(path, limit=1)) == 1


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"prompt_ids": [1]}'], "a.jsonl:1: missing field 'output_ids'"),
        (['{"prompt_ids": [1], "output_ids": [2]}', "{oops"], "a.jsonl:2: bad JSON on line 2"),
        (['{"prompt_ids": [1], "output_ids": "2"}'], "field 'output_ids' must be a list"),
        (['{"prompt_ids": [1.5], "output_ids": [2]}'], "non-integer value 1.5"),
        (['{"prompt_ids": [1], "output_ids": [128256]}'], "token id 128256 at index 0"),
        (["[1, 2]"], "line 1 is not a JSON object"),
    ],
)
def test_reader_names_the_problem(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", lines)
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace(".", r"\.")):
        read_records(path)


def test_reader_reports_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot open"):
        list(iter_records(tmp_path / "missing.jsonl"))
    broken = tmp_path / "b.jsonl.gz"
    broken.write_bytes(b"\x1f\x8b" + bytes(range(256)) * 4)  # gzip magic, then junk
    with pytest.raises(DataError, match="cannot read"):
        read_records(broken)


# --- CLI end to end ----------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    def lines(records: list[Record]) -> list[str]:
        return [
            json.dumps(
                {
                    "id": r.id,
                    "prompt_ids": r.prompt_ids.tolist(),
                    "output_ids": r.output_ids.tolist(),
                }
            )
            for r in records
        ]

    data = write_jsonl(tmp_path / "dev_set.jsonl.gz", lines(random_records(2, 12)))
    corpus = write_jsonl(tmp_path / "corpus.jsonl", lines(random_records(3, 20)))
    return data, corpus


def test_cli_chains_sized_by_a_rule_at_the_replays_batch(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--chain K --chain-rule SPEC``: chains of at most what the rule lets ``--batch``
    requests verify for free (ridge 64: 1 token at batch 32, none at 64), as the vLLM
    plug-in's ``chain_rule``; rows say which length ran and how much was drafted."""
    data, corpus = files
    argv = ["replay", "--data", str(data), "--corpus", str(corpus), "--budget", "16",
            "--sources", "both", "--no-pld", "--json", "--chain", "8"]  # fmt: skip
    rows = []
    for extra in ([], ["--chain-rule", "64/1", "--batch", "32"],
                  ["--chain-rule", "64/1", "--batch", "64"]):  # fmt: skip
        assert main([*argv, *extra]) == 0
        rows.append(json.loads(capsys.readouterr().out))
    assert [(r["chain"], r["chain_rule"]) for r in rows] == [(8, None), (1, "64/1"), (0, "64/1")]
    assert rows[0]["drafted_per_step"] > 1 >= rows[1]["drafted_per_step"] > 0
    assert rows[2]["drafted_per_step"] == 0 and rows[2]["tau"] == 1.0
    assert main([*argv[:-2], "--chain-rule", "h100"]) == 2
    assert "--chain-rule needs --chain" in capsys.readouterr().err


def test_cli_prints_one_json_report_per_configuration(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data, corpus = files
    argv = ["replay", "--data", str(data), "--corpus", str(corpus), "--budget", "4",
            "--budget", "16", "--sources", "input", "--sources", "datastore",
            "--sources", "both", "--json", "--config", "datastore_samples=20",
            "--config", "recent_samples=0"]  # fmt: skip  # batched, the same τ: no recent tier
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["budget"], r["method"]) for r in rows] == [
        (b, m) for b in (4, 16) for m in ("pld", "input", "datastore", "both")
    ]
    for row in rows:
        assert set(REPORT_KEYS) <= set(row)
        assert row["data"] == "dev_set" and row["mode"] == "corpus" and row["records"] == 12
        assert row["tau"] == pytest.approx(row["output_tokens"] / row["steps"], abs=1e-4)
        assert row["draft_us_p50"] > 0 and row["batch_ms_p50"] is None
        assert (row["build_s"] is not None) == (row["method"] in ("datastore", "both"))

    assert main([*argv, "--batch", "3", "--threads", "2"]) == 0
    batched = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["tau"] for r in batched] == [r["tau"] for r in rows]
    assert all(r["batch_ms_p99"] > 0 and r["draft_us_p50"] is None for r in batched)


def test_cli_node_score_choices(
    tmp_path: Path, files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--node-score: the shipped learned score (the default, what drafter serve drafts
    with), the hand-set fusion, or a file; the row says which, and a bad file is an error
    naming it."""
    data, corpus = files
    argv = ["replay", "--data", str(data), "--corpus", str(corpus), "--no-pld", "--json"]

    def run(*extra: str) -> dict[str, object]:
        assert main([*argv, *extra]) == 0
        row: dict[str, object] = json.loads(capsys.readouterr().out.splitlines()[-1])
        return row

    shipped = run()
    assert shipped["node_score"] == "default" and shipped["records"] == 12
    explicit = run("--node-score", "default")
    assert (explicit["tau"], explicit["steps"]) == (shipped["tau"], shipped["steps"])
    hand = run("--node-score", "hand")
    assert hand["node_score"] == "hand"
    assert (hand["tau"], hand["steps"]) != (shipped["tau"], shipped["steps"])
    path = tmp_path / "score.json"
    path.write_text(json.dumps(default_node_score().to_json()))
    from_file = run("--node-score", str(path))
    assert (from_file["tau"], from_file["steps"]) == (shipped["tau"], shipped["steps"])
    path.write_text('{"format_version": 1}')
    assert main([*argv, "--node-score", str(path)]) == 2
    assert f"{path}: 'weights' must be an object" in capsys.readouterr().err


def test_cli_live_table_and_errors(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data, _ = files
    assert main(["replay", "--data", str(data), "--live", "--no-pld", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "tau" in out.splitlines()[0] and "both" in out and "pld" not in out
    assert main(["replay", "--data", str(data), "--live", "--json"]) == 0
    both = [json.loads(line) for line in capsys.readouterr().out.splitlines()][-1]
    assert both["mode"] == "live" and both["live_rebuilds"] == 12
    assert main(["replay", "--data", str(data.parent / "nope.jsonl")]) == 2
    assert "cannot open" in capsys.readouterr().err


def test_cli_live_base_layouts(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data, corpus = files
    common = ["replay", "--data", str(data), "--corpus", str(corpus), "--live", "--no-pld",
              "--json", "--budget", "8"]  # fmt: skip
    rows = {}
    for layout in ("seed", "pinned"):
        assert main([*common, "--live-base", layout]) == 0
        rows[layout] = json.loads(capsys.readouterr().out)
    for layout, row in rows.items():
        assert row["mode"] == "corpus+live" and row["live_base"] == layout
        assert row["live_rebuilds"] == 12
    # The seed layout's one sub-index has one separator more (after the base).
    assert rows["seed"]["datastore_tokens"] == rows["pinned"]["datastore_tokens"] + 1
    assert main(["replay", "--data", str(data), "--live", "--json", "--no-pld"]) == 0
    assert json.loads(capsys.readouterr().out)["live_base"] is None
    assert main(["replay", "--data", str(data), "--live", "--live-base", "seed"]) == 2
    assert "--live-base seed needs --live and --corpus" in capsys.readouterr().err
    assert main(["replay", "--data", str(data), "--budget", "300"]) == 2
    assert "max_budget" in capsys.readouterr().err


def test_cli_ceiling_marks_its_rows_and_refuses_what_it_cannot_run(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data, corpus = files
    argv = ["replay", "--data", str(data), "--corpus", str(corpus), "--budget", "4",
            "--no-pld", "--json"]  # fmt: skip
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--ceiling", "4"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["ceiling"] == 4 and "ceiling" not in plain
    assert (same["tau"], same["steps"]) == (plain["tau"], plain["steps"])
    assert main([*argv, "--ceiling", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["ceiling"] == 64
    for extra, message in (
        (["--ceiling", "2"], "--ceiling 2 is below --budget 4"),
        (["--ceiling", "300"], "--ceiling 300 exceeds max_budget 256"),
    ):
        assert main([*argv, *extra]) == 2
        assert message in capsys.readouterr().err


def test_module_runs_as_a_script(files: tuple[Path, Path]) -> None:
    data, _ = files
    cmd = [sys.executable, "-m", "drafter_bench.bench_cli", "replay", "--data", str(data),
           "--sources", "input", "--no-pld", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    (row,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert row["method"] == "input" and row["mode"] == "none" and row["steps"] > 0


def test_snapshot_replays_like_the_corpus_it_holds(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from drafter_service import Datastore
    from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot

    data, corpus = files
    docs = [r.output_ids for r in read_records(corpus)]
    vocab = 128256
    write_snapshot(
        tmp_path / "snap",
        Datastore([SubIndex.build(docs, vocab)], vocab),
        TokenizerIdentity("test", vocab, ""),
    )
    common = ["replay", "--data", str(data), "--budget", "8", "--no-pld", "--json"]
    assert main([*common, "--corpus", str(corpus)]) == 0
    from_corpus = json.loads(capsys.readouterr().out)
    assert main([*common, "--snapshot", str(tmp_path / "snap"), "--curve", "4"]) == 0
    from_snapshot = json.loads(capsys.readouterr().out)
    assert from_snapshot["mode"] == "snapshot"
    assert from_snapshot["tau"] == from_corpus["tau"]
    assert [n for n, _ in from_snapshot["tau_curve"]] == [4, 8, 12]
    assert main([*common, "--snapshot", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    """`drafter-bench ARGV` in this process, for what is refused before anything starts:
    its exit status and standard error."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    return code, capsys.readouterr().err


def load_command(data: Path, corpus: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "drafter_bench.bench_cli", "load", "--data", str(data),
            "--corpus", str(corpus), *PATIENT, "--vocab-size", "1000", "--json", *args]  # fmt: skip


@pytest.mark.system
def test_load_benchmark_drives_a_real_service_through_the_client(files: tuple[Path, Path]) -> None:
    """`drafter-bench load` starts `drafter serve` with the corpus and replays the records
    through the real client: every step answered, deltas and finishes real, tau >= 1. With
    --verify-ms the decode loop sleeps between a step's answer and the next step, as a GPU's
    forward pass would, and the report says so."""
    data, corpus = files
    cmd = load_command(data, corpus, "--batch", "4", "--steps", "60", "--warmup", "5",
                       "--deadline-ms", "0.001", "--verify-ms", "5")  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert row["steps"] == 60 and row["batch"] == 4 and row["failed_steps"] == 0
    assert 0 < row["step_ms_p50"] <= row["step_ms_p99"] <= row["step_ms_p999"]
    assert row["step_ms_p999"] <= row["step_ms_max"] and row["steps_per_s"] > 0
    assert row["finished"] > 0 and row["tau"] > 1.0 and row["accepted_tokens"] > 0
    # A fresh service holds every request from its first step on: nothing to resync.
    assert row["resyncs"] == 0
    # fallbacks counts the steps slower than --deadline-ms: here 1 us, i.e. every one.
    assert row["deadline_ms"] == 0.001 and row["fallbacks"] == 60
    # 60 measured steps, each followed by a 5 ms sleep: at least 0.3 s of wall time.
    assert row["verify_ms"] == 5 and 0 < row["steps_per_s"] <= 200


@pytest.mark.system
def test_load_benchmark_passes_the_node_score_to_the_service(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`drafter-bench load --node-score` sets the started service's score, a missing file
    stops the service from starting, and a --target service is refused the flag."""
    data, corpus = files
    args = ["--batch", "2", "--steps", "40", "--warmup", "0"]
    proc = subprocess.run(load_command(data, corpus, *args, "--node-score", "hand"),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["node_score"] == "hand" and row["failed_steps"] == 0 and row["tau"] > 1.0
    no_file = load_command(data, corpus, *args, "--node-score", "/nonexistent/score.json")
    missing = subprocess.run(no_file, capture_output=True, text=True, timeout=600)
    assert missing.returncode != 0 and "did not start" in missing.stderr
    for flag in (["--node-score", "hand"], ["--server-cpus", "0"]):
        code, err = refused(
            capsys, load_command(data, corpus, "--target", "127.0.0.1:1", *flag)[3:]
        )
        assert code != 0, flag
        assert f"{flag[0]} sets up the service load starts; with --target" in err


@pytest.mark.system
def test_load_benchmark_passes_draft_config_to_the_service(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`drafter-bench load --draft-config KEY=VALUE` reaches the started service's
    `drafter serve --draft-config`: the row names the pairs, a pair serve refuses stops it
    from starting, a bad key is refused before anything starts, and so is --target."""
    data, corpus = files
    args = ["--batch", "2", "--steps", "40", "--warmup", "0"]
    paper = ["--draft-config", "datastore_min_tree_nodes=50",
             "--draft-config", "datastore_max_continuation=16"]  # fmt: skip
    proc = subprocess.run(load_command(data, corpus, *args, *paper),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["draft_config"] == ["datastore_min_tree_nodes=50", "datastore_max_continuation=16"]
    assert row["failed_steps"] == 0 and row["tau"] > 1.0
    too_big = load_command(data, corpus, *args, "--draft-config", "max_budget=64")
    refused_by_serve = subprocess.run(too_big, capture_output=True, text=True, timeout=600)
    assert refused_by_serve.returncode != 0 and "did not start" in refused_by_serve.stderr
    code, err = refused(capsys, load_command(data, corpus, "--draft-config", "smoothing=1")[3:])
    assert code == 2 and "'smoothing' is not a DraftConfig field" in err
    code, err = refused(capsys, load_command(data, corpus, "--target", "127.0.0.1:1", *paper)[3:])
    assert code != 0
    assert "--draft-config sets up the service load starts" in err


@pytest.mark.system
def test_load_benchmark_replays_sibling_groups_together(
    tmp_path: Path, files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`drafter-bench load --siblings N` replays groups of N answers to one prompt, one
    group after another, so they are in flight together; a file without such groups is
    refused naming the group size, before anything starts."""
    data, corpus = files
    rng = np.random.default_rng(5)
    rows = []
    for g in range(6):  # 6 prompts, 2 answers each, alike
        prompt = rng.integers(0, 1000, size=12).tolist()
        answer = rng.integers(0, 1000, size=40).tolist()
        for k in range(2):
            rows.append(json.dumps({"id": f"{g}-{k}", "prompt_ids": prompt,
                                    "output_ids": answer[: 30 + 5 * k]}))  # fmt: skip
    siblings = write_jsonl(tmp_path / "siblings.jsonl", rows)
    cmd = load_command(siblings, corpus, "--siblings", "2", "--batch", "4", "--steps", "40",
                       "--warmup", "0")  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["siblings"] == 2 and row["failed_steps"] == 0 and row["tau"] >= 1.0
    code, err = refused(capsys, load_command(data, corpus, "--siblings", "3")[3:])
    assert code != 0 and "no record with output tokens in groups of 3" in err


def test_sibling_groups_keep_the_first_answers_of_prompts_with_enough() -> None:
    records = [rec([1, 2] if i % 3 else [3], [i + 10], f"r{i}") for i in range(9)]
    groups = sibling_groups(records, 3)  # [3] has 3 answers (r0, r3, r6), [1, 2] six
    assert [r.id for r in groups] == ["r0", "r3", "r6", "r1", "r2", "r4"]
    assert [r.id for r in sibling_groups(records, 4)] == ["r1", "r2", "r4", "r5"]
    assert sibling_groups(records, 7) == []


def test_siblings_in_flight_draft_from_each_other_with_the_recent_tier() -> None:
    """Two answers to one prompt, the second starting 10 steps after the first: with the
    tier the second accepts what the first has written (8 tokens, the budget, at its first
    step); without it the input trie has nothing (the output never repeats): one token a
    step for both."""
    output = list(range(20, 60))
    records = [rec([1, 2, 3], output, "a"), rec([1, 2, 3], output, "b")]

    def steps(recent: int, stagger: int) -> list[int]:
        config = DraftConfig(recent_samples=recent, recent_min_match=2)
        settings = ReplaySettings("input", 8, batch=2, config=config, siblings=2, stagger=stagger)
        return sorted(s for _, s in replay(records, settings).finished)

    assert steps(0, 10) == [40, 40]
    fewer = steps(16, 10)
    assert fewer[0] <= 40 - 8 and fewer[1] <= 40
    with pytest.raises(ValueError, match="multiple of siblings"):
        replay(records, ReplaySettings("input", 8, batch=3, siblings=2))


def test_the_recent_tier_benchmark_compares_the_tier_off_and_on(tmp_path: Path) -> None:
    """`python -m drafter_bench.recent_tier`: each comparison's first row has the tier off
    and the others on (the tier is on by default, so "without" must say so), on a small
    data directory laid out as ../shared/data is."""
    from drafter_bench import recent_tier

    def lines(records: list[Record], prompt: bool = True) -> list[str]:
        return [json.dumps({"id": r.id, "prompt_ids": r.prompt_ids.tolist() if prompt else [],
                            "output_ids": r.output_ids.tolist()}) for r in records]  # fmt: skip

    (tmp_path / "corpus").mkdir()
    (tmp_path / "dev").mkdir()
    write_jsonl(tmp_path / recent_tier.CORPUS, lines(random_records(1, 20)))
    for i, name in enumerate(recent_tier.DEV_SETS):
        write_jsonl(tmp_path / "dev" / f"{name}.jsonl.gz", lines(random_records(10 + i, 6)))
    out = tmp_path / "rows.jsonl"
    argv = ["--data-dir", str(tmp_path), "--out", str(out), "--phase", "latency", "--phase",
            "unrelated", "--dev-batch", "2"]  # fmt: skip
    assert recent_tier.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    latency = [r["recent_samples"] for r in rows if r["kind"] == "latency"]
    unrelated = [r["recent_samples"] for r in rows if r["kind"] == "unrelated"]
    assert latency == [0, 16] * len(recent_tier.DEV_SETS)
    assert unrelated == [0, 16, 16] * len(recent_tier.DEV_SETS)
    assert all(r["draft_us_p50"] > 0 for r in rows if r["kind"] == "latency")
