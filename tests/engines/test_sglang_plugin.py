"""The SGLang plug-in against SGLang 0.5.23's own registry, plug-in loader, server-argument
hooks and C++ n-gram corpus, and a real ``drafter serve``.

Runs in SGLang's virtualenv (``.venv-sglang``, the CI-sized install: no CUDA
stack), where SGLang must import: a missing SGLang fails these tests. On a CPU
machine ``ngram_worker`` does not import (it needs ``sgl_kernel``), so the
worker is not exercised here; everything it hands to the corpus and takes
back is. ``Req`` cannot be imported either (``schedule_batch`` pulls in
transformers and torchvision): :class:`FakeReq` carries the five attributes
NGRAMWorker and the plug-in read.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from deploy_commands import command_line, engine_parse, flag_value
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import prepare_server_args
from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from verifier_client import BudgetRule, Tree
from verifier_client.engines import DrafterSettings, EngineDrafter
from verifier_client.engines import sglang as plugin
from verifier_client.engines.batch import CONFIG_ENV, tokenizer_fingerprint
from verifier_client.engines.sglang_corpus import DraftCorpus, _context, corpus_layout

REPO = Path(__file__).resolve().parents[2]
DRAFTER = Path(os.environ.get("SSSD_DRAFTER_BIN", REPO / ".venv" / "bin" / "drafter"))
D = 8  # --speculative-num-draft-tokens in these tests
DEPTH = 12  # --speculative-ngram-max-trie-depth: the tails the corpus sees


@dataclass
class FinishReason:
    kind: str  # the API's finish_reason type: "stop", "length", "abort"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind}


@dataclass
class FakeReq:
    """What NGRAMWorker and the plug-in read of SGLang's ``Req``."""

    rid: str
    origin_input_ids_unpadded: list[int]
    output_ids: list[int] = field(default_factory=list)
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    finished_reason: FinishReason | None = None

    def finished(self) -> bool:
        return self.finished_reason is not None

    def context(self) -> list[int]:
        return [*self.origin_input_ids_unpadded, *self.output_ids]


def tails(reqs: Sequence[FakeReq]) -> tuple[list[str], list[list[int]], list[int]]:
    """``batch_get``'s arguments for a batch, as NGRAMWorker builds them (no overlap)."""
    return (
        [r.rid for r in reqs],
        [r.context()[-DEPTH:] for r in reqs],
        [len(r.context()) for r in reqs],
    )


def parents_of(mask: np.ndarray) -> list[int]:
    """Column of each node's parent from an ancestors-or-self mask (-1: the root)."""
    d = mask.shape[0]
    return [-1] + [max(j for j in range(i) if mask[i, j]) for i in range(1, d)]


def ancestors_or_self(parents: Sequence[int]) -> np.ndarray:
    """The mask a tree's parent columns imply, computed the slow, obvious way."""
    d = len(parents)
    mask = np.zeros((d, d), np.int64)
    for i in range(d):
        j = i
        while j >= 0:
            mask[i, j] = 1
            j = parents[j]
    return mask


@pytest.fixture(scope="module")
def registered() -> CustomSpecAlgo:
    plugin.register()
    return SpeculativeAlgorithm.from_string("SSSD")


@pytest.fixture(scope="module")
def ngram_corpus() -> NgramCorpus:
    """SGLang's C++ corpus (compiled on first use), fed two sequences."""
    corpus = NgramCorpus(max_trie_depth=DEPTH, draft_token_num=D, capacity=100_000)
    corpus.batch_put([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 44, 55, 66, 77, 88, 99, 100]])
    corpus.synchronize()
    return corpus


@pytest.fixture(scope="module")
def drafter_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model directory whose tokenizer.json the drafter serves (only its bytes count)."""
    model_dir = tmp_path_factory.mktemp("model")
    (model_dir / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0, "b": 1}}}')
    return model_dir


@pytest.fixture(scope="module")
def drafter_address(
    tmp_path_factory: pytest.TempPathFactory, drafter_tokenizer: Path
) -> Iterator[str]:
    """A real ``drafter serve`` on loopback (from the main virtualenv), serving
    ``drafter_tokenizer``'s tokenizer.json with 1000 token ids."""
    if not DRAFTER.exists():
        raise RuntimeError(f"{DRAFTER} not found: run `make setup` (or set SSSD_DRAFTER_BIN)")
    data_dir = tmp_path_factory.mktemp("drafter-data")
    tokenizer = drafter_tokenizer / "tokenizer.json"
    proc = subprocess.Popen(
        [str(DRAFTER), "serve", "--port", "0", "--data-dir", str(data_dir), "--vocab-size",
         "1000", "--tokenizer", str(tokenizer), "--admin-port", "-1", "--metrics-port", "-1",
         "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("drafter listening on "):
        proc.kill()
        raise RuntimeError(f"drafter serve did not start: {line!r}")
    yield line.removeprefix("drafter listening on ").strip()
    proc.kill()
    proc.wait(10)


def engine_drafter(address: str) -> EngineDrafter:
    # A generous deadline: the drafter shares this machine's two cores with the test.
    settings = DrafterSettings(address=address, deadline_ms=2000, budget="16")
    return EngineDrafter(settings, budget=plugin.capped_budget(settings.budget_rule(), D - 1))


def server_args(*flags: str) -> Any:
    """SGLang's ServerArgs for ``flags``, through its own speculative-decoding hook."""
    args = prepare_server_args(
        ["--model-path", "dummy", "--device", "cpu", "--page-size", "1",
         "--speculative-algorithm", "SSSD", *flags]
    )  # fmt: skip
    handle_speculative_decoding(args)
    return resolving_view(args)


# --- registration and loading


def test_importing_the_plugin_imports_no_sglang() -> None:
    code = (
        "import sys, verifier_client.engines.sglang\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang'))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_sssd_is_registered_and_answers_as_ngram(registered: CustomSpecAlgo) -> None:
    plugin.register()  # idempotent: SGLang may load plug-ins more than once per process
    assert SpeculativeAlgorithm.from_string("sssd") is registered
    assert isinstance(registered, CustomSpecAlgo) and registered.name == "SSSD"
    assert registered.supports_overlap is True
    assert registered.validate_server_args is plugin.validate_server_args
    assert registered.is_ngram() and registered.is_speculative() and not registered.is_eagle()
    assert not registered.has_draft_kv() and not registered.supports_mixed_chunk()
    # Everything the scheduler may call on a builtin algorithm exists on ours too
    # (CustomSpecAlgo alone lacks create_future_map, carries_draft_hidden_states, ...).
    wanted = {
        name for name, value in vars(SpeculativeAlgorithm).items()
        if callable(value) and not name.startswith("_") and name not in ("register", "from_string")
    }  # fmt: skip
    assert sorted(n for n in wanted if not callable(getattr(registered, n, None))) == []


def test_the_entry_point_group_loads_the_plugin(tmp_path: Path) -> None:
    """SGLang's own loader, in a fresh process, finds our entry point and registers SSSD."""
    dist = tmp_path / "sssd_plugin_probe-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sssd-plugin-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nsssd_drafter = verifier_client.engines.sglang:register\n"
    )
    code = (
        "from sglang.srt.plugins import load_plugins; load_plugins()\n"
        "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as A\n"
        "print(type(A.from_string('SSSD')).__name__)"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "SGLANG_PLUGINS": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "SssdAlgorithm", out.stderr


# --- server arguments, through SGLang's speculative-decoding hook


def test_flags_accepted_with_ngram_defaults(
    registered: CustomSpecAlgo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSSD_DRAFTER_CONFIG", json.dumps({"address": "drafter:50051"}))
    cfg = server_args("--speculative-num-draft-tokens", str(D))
    assert cfg.speculative_algorithm == "SSSD"
    assert cfg.speculative_num_draft_tokens == D
    assert cfg.speculative_eagle_topk == 10  # trees: NGRAM's max BFS breadth
    assert cfg.disable_overlap_schedule is True  # SGLang has no spec overlap on CPU
    assert cfg.enable_mixed_chunk is False
    assert cfg.speculative_ngram_max_trie_depth == 18  # SGLang's default already covers D
    default = server_args()
    assert default.speculative_num_draft_tokens == plugin.DEFAULT_NUM_DRAFT_TOKENS
    wide = server_args("--speculative-num-draft-tokens", "32")
    assert wide.speculative_ngram_max_trie_depth == 32  # tails must hold a step's accepts


@pytest.mark.parametrize(
    ("config", "flags", "message"),
    [
        ('{"deadline_ms": -1}', (), r"deadline_ms must be a number > 0, got -1"),
        ('{"adress": "x:1"}', (), r"unknown setting\(s\) \['adress'\]"),
        ('{"budget": "h900"}', (), r"unknown GPU profile 'h900'"),
        ("address=x", (), r"SSSD_DRAFTER_CONFIG is not a JSON object"),
        ("", ("--speculative-num-draft-tokens", "1"), r"num-draft-tokens .* got 1"),
        ("", ("--speculative-ngram-external-corpus-path", "/x.jsonl"), r"'/x\.jsonl' is not"),
        ("", ("--attn-dp-size", "2"), r"--attn-dp-size 1, got 2"),
        ("", ("--page-size", "16"), r"--page-size 16 needs --attention-backend flashinfer"),
    ],
)
def test_bad_settings_stop_the_launch_by_name(
    registered: CustomSpecAlgo,
    monkeypatch: pytest.MonkeyPatch,
    config: str,
    flags: tuple[str, ...],
    message: str,
) -> None:
    monkeypatch.setenv("SSSD_DRAFTER_CONFIG", config)
    with pytest.raises(ValueError, match=message):
        server_args(*flags)


def test_worker_factory_gives_an_ngram_worker(registered: CustomSpecAlgo) -> None:
    """On a GPU install the factory's class is NGRAMWorker's; on this CPU install the
    worker module itself cannot load (no sgl_kernel), and the error says so."""
    args = prepare_server_args(["--model-path", "dummy", "--speculative-algorithm", "SSSD"])
    try:
        from sglang.srt.speculative.ngram_worker import NGRAMWorker
    except ImportError as err:
        with pytest.raises(ImportError) as raised:
            registered.create_worker(args)
        assert str(raised.value) == str(err) and "sgl_kernel" in str(err)
    else:
        assert issubclass(registered.create_worker(args), NGRAMWorker)


# --- the corpus layout


def test_layout_matches_sglangs_cpp_corpus(ngram_corpus: NgramCorpus) -> None:
    """For the same inputs, our adapter answers exactly what SGLang's corpus answers
    when it is handed the corpus's own trees (padding rebuilt by us)."""
    req_ids = ["q0", "q1", "q2", "q3"]
    queries = [[1, 2, 3], [3, 44], [3, 6, 999], [7, 8]]
    lens = [len(q) for q in queries]
    ref_tokens, ref_mask = ngram_corpus.batch_get(req_ids, queries, lens)
    trees: list[Tree | None] = []
    for row in range(len(queries)):
        tokens = ref_tokens[row * D : (row + 1) * D]
        parents = parents_of(ref_mask[row * D * D : (row + 1) * D * D].reshape(D, D))
        n = D - 1
        while n and tokens[n] == 0 and parents[n] == 0:  # padding: token 0 under the root
            n -= 1
        trees.append(Tree.of(tokens[1 : n + 1].tolist(), [p - 1 for p in parents[1 : n + 1]],
                             [1.0] * n))  # fmt: skip
    assert [len(t) for t in trees if t is not None] == [7, 6, 0, 2]  # full, padded, none

    class Answering:  # the drafter, answering with the C++ corpus's trees
        def draft(self, ids: Sequence[str], lengths: Any, prompts: Any, slice_: Any,
                  stores: Any = None) -> Any:  # fmt: skip
            assert list(ids) == req_ids and [slice_(i, 0, n) for i, n in enumerate(lengths)]
            return trees

    corpus = DraftCorpus(Answering(), D)  # type: ignore[arg-type]
    tokens, mask = corpus.batch_get(req_ids, queries, lens)
    assert (tokens.dtype, tokens.shape, mask.dtype, mask.shape) == (
        ref_tokens.dtype, ref_tokens.shape, ref_mask.dtype, ref_mask.shape)  # fmt: skip
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_array_equal(mask, ref_mask)


def test_mask_rows_are_ancestors_or_self_and_sglang_reads_our_paths(
    ngram_corpus: NgramCorpus,
) -> None:
    trees = [
        Tree.of([5, 6, 7, 8, 9], [-1, -1, 0, 0, 2], [1.0] * 5),
        None,
        Tree.of(list(range(20, 40)), [-1, *range(19)], [1.0] * 20),  # a chain, cut at D - 1
    ]
    tokens, mask = corpus_layout(trees, [1, 2, 3], D)
    for row, tree in enumerate(trees):
        rows = tokens[row * D : (row + 1) * D].tolist()
        block = mask[row * D * D : (row + 1) * D * D].reshape(D, D)
        n = min(len(tree), D - 1) if tree is not None else 0
        parents = [-1] + [p + 1 for p in (tree.parents.tolist()[:n] if tree else [])]
        parents += [0] * (D - 1 - n)  # padding hangs off the root
        assert rows[0] == [1, 2, 3][row]
        np.testing.assert_array_equal(block, ancestors_or_self(parents))
        # SGLang's own reader of the layout: every leaf's root-to-leaf token path.
        paths = ngram_corpus.leaf_paths_from_mask(rows, block.tolist())
        assert paths == [[rows[c] for c in _path(parents, leaf)] for leaf in _leaves(parents)]


def _path(parents: Sequence[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _leaves(parents: Sequence[int]) -> list[int]:
    return [i for i in range(len(parents)) if i not in parents]


def test_malformed_tree_is_a_step_without_drafts() -> None:
    class Broken:
        def draft(self, *args: Any, **kwargs: Any) -> Any:
            return [Tree.of([5, 6], [-1, 1], [1.0, 1.0])]  # node 1 is its own parent

    corpus = DraftCorpus(Broken(), D)  # type: ignore[arg-type]
    tokens, _ = corpus.batch_get(["a"], [[1, 2, 3]], [3])
    assert tokens.tolist() == [3] + [0] * (D - 1) and corpus.layout_errors == 1
    with pytest.raises(ValueError, match=r"trees\[0\] node 1: token 6, parent 1"):
        corpus_layout([Tree.of([5, 6], [-1, 1], [1.0, 1.0])], [3], D)


# --- with a real drafter


def test_a_real_drafter_step_by_step(drafter_address: str, ngram_corpus: NgramCorpus) -> None:
    """Two requests through the real service: whole contexts first, then only the
    tokens each step accepted; trees fit D, and the answer has the corpus's format."""
    # After "10 11 12" the prompt went on with 13 once and with 50 once: a tree.
    prompt = [*range(10, 30), 10, 11, 12, 50, 51, 52, 53, 7, 10, 11, 12]
    reqs = [FakeReq("a", prompt), FakeReq("b", [1, 2, 3])]
    drafter = engine_drafter(drafter_address)
    corpus = DraftCorpus(drafter, D)
    try:
        corpus.bind(reqs)
        tokens, mask = corpus.batch_get(*tails(reqs))
        ref_tokens, ref_mask = ngram_corpus.batch_get(*tails(reqs))
        assert (tokens.dtype, tokens.shape, mask.dtype, mask.shape) == (
            ref_tokens.dtype, ref_tokens.shape, ref_mask.dtype, ref_mask.shape)  # fmt: skip
        assert drafter.stats.tokens_sent == len(prompt) + 3  # both contexts, whole
        tree = drafter.last_result.drafts[drafter.namespace + "a"]  # type: ignore[union-attr]
        assert 0 < len(tree) <= D - 1  # the budget is capped at what D holds
        assert {13, 50} <= {t for t, p in zip(tree.tokens, tree.parents, strict=True) if p == -1}
        row = tokens[:D].tolist()
        assert row[0] == 12 and row[1 : 1 + len(tree)] == tree.tokens.tolist()
        parents = [-1, *(p + 1 for p in tree.parents.tolist()), *[0] * (D - 1 - len(tree))]
        np.testing.assert_array_equal(mask[: D * D].reshape(D, D), ancestors_or_self(parents))

        reqs[0].output_ids += [13, 14, 15]  # the step accepted two drafts and a bonus token
        corpus.bind(reqs)
        corpus.batch_get(*tails(reqs))
        assert drafter.stats.tokens_sent == len(prompt) + 3 + 3  # deltas only
        assert drafter.live_requests == 2
        reqs[1].finished_reason = FinishReason("length")
        corpus.release("b")
        assert drafter.live_requests == 1 and drafter.client.flush(10)
        assert drafter.stats.background_sent == 1 and drafter.errors == 0
    finally:
        corpus.close()


def test_a_drafter_serving_another_tokenizer_stops_the_launch(
    drafter_address: str, drafter_tokenizer: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The first rank's corpus checks the drafter's tokenizer against the one under the
    worker's resolved --tokenizer-path, as vLLM's proposer does: another tokenizer.json
    stops the launch; the same one, or none to compare (a hub name), drafts."""
    settings = {"address": drafter_address, "deadline_ms": 2000, "connect_timeout_s": 10}
    monkeypatch.setenv(CONFIG_ENV, json.dumps(settings))
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0, "a": 1}}}')
    theirs = tokenizer_fingerprint(drafter_tokenizer)
    with pytest.raises(ValueError, match=f"tokenizer mismatch: client .*, drafter {theirs}"):
        plugin._corpus(D, 0, str(other))
    for path in (str(drafter_tokenizer), "org/hub-model", None):
        corpus = plugin._corpus(D, 0, path)
        try:
            reqs = [FakeReq("a", [1, 2, 3])]
            corpus.bind(reqs)
            corpus.batch_get(*tails(reqs))
            assert corpus.drafter is not None and corpus.drafter.stats.drafted_steps == 1
        finally:
            corpus.close()
    assert plugin._corpus(D, 1, str(other)).drafter is None  # other ranks never call it


# --- request lifecycle


class Recording:
    """Stands in for EngineDrafter where only the calls matter."""

    def __init__(self) -> None:
        self.released: list[tuple[str, bool]] = []
        self.stores: list[bool] | None = None
        self.contexts: list[list[int]] = []
        self.final_contexts: dict[str, list[int]] = {}

    def draft(self, ids: Sequence[str], lengths: Sequence[int], prompts: Any, slice_: Any,
              stores: Sequence[bool] | None = None) -> Any:  # fmt: skip
        self.ids = list(ids)
        self.contexts = [slice_(i, 0, n) for i, n in enumerate(lengths)]
        self.stores = list(stores) if stores is not None else None
        return [None] * len(ids)

    def release(
        self, request_id: str, store: bool = True, context: Sequence[int] | None = None
    ) -> None:
        self.released.append((request_id, store))
        self.final_contexts[request_id] = list(context or [])


def test_finished_requests_end_on_the_drafter_with_their_store_choice() -> None:
    recording = Recording()
    corpus = DraftCorpus(recording, D)  # type: ignore[arg-type]
    opted_out = SamplingParams(custom_params={plugin.STORE_KEY: False})
    reqs = [
        FakeReq("done", [1, 2]),
        FakeReq("quiet", [3, 4], sampling_params=opted_out),
        FakeReq("aborted", [5, 6]),
        FakeReq("lagging", [7, 8]),
        FakeReq("retracted", [9]),
    ]
    corpus.bind(reqs)
    corpus.batch_get(*tails(reqs))
    assert recording.contexts == [r.context() for r in reqs]
    # The opt-out goes with the first draft too (the drafter never shares its tokens).
    assert recording.stores == [True, False, True, True, True]
    for req, kind in zip(reqs[:3], ["stop", "stop", "abort"], strict=True):
        req.output_ids.append(77)  # the last step's token, which no batch_get carried
        req.finished_reason = FinishReason(kind)
        corpus.release(req.rid)  # SGLang's note_request_finished
        assert recording.final_contexts[req.rid] == req.context()
    # Aborted requests are stored too (as with vLLM, where the worker cannot tell them
    # apart); only the opt-out keeps a generation out.
    assert recording.released == [("done", True), ("quiet", False), ("aborted", True)]
    corpus.bind(reqs)  # overlap scheduling runs finished requests one step more
    corpus.batch_get(*tails(reqs))
    assert recording.ids == ["lagging", "retracted"]  # not drafted, not re-added

    # "lagging" and "retracted" leave the batch unfinished: nothing ends yet.
    corpus.bind([])
    corpus.erase_match_state(["done", "lagging", "retracted"])
    assert len(recording.released) == 3
    reqs[3].finished_reason = FinishReason("length")  # overlap: finished a step later
    corpus.bind([reqs[4]])  # the retracted request is back
    corpus.erase_match_state([])
    assert recording.released[3:] == [("lagging", True)]
    corpus.reset()  # SGLang flushed its caches
    assert recording.released[4:] == [("retracted", False)]


def test_other_tensor_parallel_ranks_answer_the_root_alone() -> None:
    corpus = DraftCorpus(None, D)
    reqs = [FakeReq("a", [1, 2, 3])]
    corpus.bind(reqs)
    tokens, mask = corpus.batch_get(*tails(reqs))
    root_only = corpus_layout([None], [3], D)
    np.testing.assert_array_equal(tokens, root_only[0])
    np.testing.assert_array_equal(mask, root_only[1])
    corpus.release("a")
    corpus.erase_match_state(["a"])


def test_context_comes_from_prompt_output_and_tail() -> None:
    """Under overlap scheduling the tail ends with accepted tokens not yet in output_ids."""
    req = FakeReq("a", [1, 2, 3, 4], output_ids=[5, 6])
    context = [1, 2, 3, 4, 5, 6, 7, 8]  # 7, 8: accepted last step, in the tail only
    tail = context[-3:]
    for start in range(len(context)):
        for stop in range(start, len(context) + 1):
            assert _context(req, tail, len(context), start, stop) == context[start:stop]
    short = FakeReq("b", [1, 2, 3, 4])  # 5 and 6 are nowhere
    with pytest.raises(ValueError, match=r"b: context tokens 4\.\.5 are in neither"):
        _context(short, tail, len(context), 0, 8)


def _broadcast_rank(rank: int, port: int, out: Any) -> None:
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    group = SimpleNamespace(ranks=[0, 1], cpu_group=torch.distributed.new_group(backend="gloo"))
    trees = [Tree.of([5, 6], [-1, 0], [1.0, 1.0]) if rank == 0 else None, None]
    tokens, mask = corpus_layout(trees, [1, 2], D)
    got = plugin.broadcast_layout(group, tokens, mask)
    out.put((rank, got[0].tolist(), got[1].tolist()))
    torch.distributed.destroy_process_group()


def test_every_tensor_parallel_rank_verifies_the_first_ranks_tree() -> None:
    """Two real gloo ranks: rank 1 drafted nothing and ends with rank 0's layout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = torch.multiprocessing.get_context("spawn")
    out = context.Queue()
    procs = [context.Process(target=_broadcast_rank, args=(r, port, out)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    # Bounds on failure only: each spawned rank imports torch and SGLang first, which took
    # over a minute on a loaded 2-core machine.
    gathered = [out.get(timeout=600) for _ in procs]
    results = {rank: (tokens, mask) for rank, tokens, mask in gathered}
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    expected = corpus_layout([Tree.of([5, 6], [-1, 0], [1.0, 1.0]), None], [1, 2], D)
    for rank in (0, 1):
        assert results[rank] == (expected[0].tolist(), expected[1].tolist())


def test_external_corpus_calls_are_refused_by_name() -> None:
    corpus = DraftCorpus(None, D)
    with pytest.raises(ValueError, match="corpus 'wiki': SSSD drafts from the drafting service"):
        corpus.load_external_corpus_named("wiki", [[1, 2]], 10)
    assert corpus.list_external_corpora() == {}


def test_budget_is_capped_at_what_the_verify_width_holds() -> None:
    assert plugin.capped_budget(BudgetRule.parse("16"), D - 1) == BudgetRule.fixed(D - 1)
    assert plugin.capped_budget(BudgetRule.parse("4"), D - 1) == BudgetRule.fixed(4)
    rule = plugin.capped_budget(BudgetRule.parse("h100"), D - 1)
    assert [rule.draft_budget(b) for b in (1, 64, 256)] == [7, 3, 0]


def test_sglang_accepts_the_prefill_and_decode_command_lines_of_the_deployment_example(
    registered: CustomSpecAlgo,
) -> None:
    """deploy/sglang-pd's container command lines through SGLang's own launch parsing and
    the registered algorithm's checks: the decode pods speculate with SSSD, the prefill
    pods do not."""
    decode = engine_parse("sglang", "sglang-decode")
    prefill = engine_parse("sglang", "sglang-prefill")
    assert decode["speculative_algorithm"] == "SSSD" and decode["enable_metrics"] is True
    assert decode["disaggregation_mode"] == "decode"
    argv = command_line("sglang-decode")
    assert decode["speculative_num_draft_tokens"] == int(
        flag_value(argv, "--speculative-num-draft-tokens")
    )
    assert prefill["speculative_algorithm"] is None
    assert prefill["disaggregation_mode"] == "prefill"
