"""``drafter-bench gpu`` and what it rests on: teacher-forced decoding in the reference worker
(the recording decides acceptance, the model does the work), chain verification, and the
whole benchmark on CPU with the tiny model against a real ``drafter serve``."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from worker_support import VOCAB, OracleDrafter, model64, prompts

from drafter_bench.architecture_models import ARCHITECTURES, architecture_model
from drafter_bench.gpu_plots import plot, read_rows
from verifier_client.reference_worker.decode_loop import DecodeWorker, GenerationRequest


def repeating_records(path: Path, count: int, seed: int) -> Path:
    """Dev records whose output repeats a 12-token phrase that the prompt starts: the
    drafter's input trie drafts them once the output has begun."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(count):
            phrase = [rng.randrange(VOCAB) for _ in range(12)]
            f.write(json.dumps({"id": f"d{i}", "prompt_ids": phrase[:8],
                                "output_ids": (phrase * 10)[:96]}) + "\n")  # fmt: skip
    return path


def recordings(count: int, length: int, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(count)]


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chain", [None, 2])
def test_teacher_forced_decoding_outputs_the_recording_and_accepts_its_drafts(
    chain: int | None, device: str
) -> None:
    """With ``teacher_ids`` the output is the recording, whatever the model (random
    weights) or the drafts (hits, partial hits, misses, none); drafts that follow the
    recording are accepted, so fewer steps than tokens. ``chain``: only the best chain
    of each tree is verified, with the same outputs. On every device present."""
    model = model64("llama").to(device)
    plist, outputs = prompts(6), recordings(6, 24)
    truths = {f"r{i}": [*p, *o] for i, (p, o) in enumerate(zip(plist, outputs, strict=True))}
    drafter = OracleDrafter(truths, seed=4)
    worker = DecodeWorker(model, drafter, max_batch=4, chain=chain)
    requests = [GenerationRequest(f"r{i}", p, 20, teacher_ids=o)
                for i, (p, o) in enumerate(zip(plist, outputs, strict=True))]  # fmt: skip
    generations = worker.run(requests)
    assert [g.output_ids for g in generations] == [o[:20] for o in outputs]
    assert worker.stats.accepted_tokens > 0
    assert worker.stats.request_steps < 6 * 20
    assert drafter.finished == {rid: t[: len(t) - 4] for rid, t in truths.items()}


def test_teacher_ids_shorter_than_max_new_tokens_are_refused() -> None:
    worker = DecodeWorker(model64("llama"), None)
    with pytest.raises(ValueError, match="teacher_ids of 'r' hold 3 tokens"):
        worker.submit(GenerationRequest("r", [1, 2], 5, teacher_ids=[1, 2, 3]))


def test_an_architecture_model_is_built_on_its_device_in_its_dtype() -> None:
    """The real-architecture builder (Llama-3.1-8B's shapes on a GPU) at a small size."""
    ARCHITECTURES["test-small"] = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=64)  # fmt: skip
    try:
        model = architecture_model("test-small", device="cpu", dtype=torch.float64)
    finally:
        del ARCHITECTURES["test-small"]
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.config.num_key_value_heads == 2 and not model.training
    assert torch.get_default_dtype() == torch.float32  # restored
    with pytest.raises(ValueError, match="unknown architecture 'nope'"):
        architecture_model("nope", device="cpu")
    assert ARCHITECTURES["llama-3.1-8b"]["intermediate_size"] == 14336


@pytest.mark.system  # torch and a drafter in processes of their own: 30 s
def test_drafter_bench_gpu_runs_on_cpu_with_the_tiny_model(tmp_path: Path) -> None:
    """The whole benchmark against a real ``drafter serve``: every kind of row, teacher-
    forced, for each batch size; tokens are decoded in every decode row, and the drafts
    pay where the recording repeats itself (the drafter's input trie)."""
    data = repeating_records(tmp_path / "dev.jsonl", 3, seed=0)
    out = tmp_path / "gpu.jsonl"
    cmd = [sys.executable, "-m", "drafter_bench.bench_cli", "gpu", "--data", str(data),
           "--batch", "1,2", "--chains", "4", "--nodes", "1,4", "--steps", "3", "--warmup", "1",
           "--max-new-tokens", "64", "--vocab-size", str(VOCAB), "--device", "cpu",
           # a loaded machine must not turn the drafts off: this test is about the rows
           "--deadline-ms", "60000", "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [json.loads(line) for line in done.stdout.splitlines()]
    assert all(r["teacher_forced"] and r["model"] == "tiny" for r in rows)
    decode = [r for r in rows if r["kind"] == "decode"]
    assert [(r["batch"], r["mode"], r["chain"]) for r in decode] == [
        (b, m, c) for b in (1, 2) for m, c in (("none", None), ("tree", None), ("chain", 4))
    ]
    assert all(r["steps"] == 3 and r["tokens"] >= 3 * r["batch"] for r in decode)
    assert all(r["tau"] == 1.0 for r in decode if r["mode"] == "none")
    assert max(r["tau"] for r in decode if r["mode"] == "tree") > 1.5
    assert all(r["draft_ms_p50"] is not None for r in decode if r["mode"] != "none")
    assert all(0 < r["forward_ms_p50"] <= r["step_ms_p99"] and r["verify_ms_mean"] > 0
               for r in decode)  # fmt: skip
    assert [r["batch"] for r in rows if r["kind"] == "never_slower"] == [1, 2]
    costs = [(r["batch"], r["nodes"]) for r in rows if r["kind"] == "verify_cost"]
    assert costs == [(1, 1), (1, 4), (2, 1), (2, 4)]
    ridges = [r for r in rows if r["kind"] == "ridge"]
    assert [r["batch"] for r in ridges] == [1, 2]
    assert all(r["rule_tree_tokens"] == 17 for r in ridges)  # the CPU default: budget 16
    pngs = plot(read_rows(out), tmp_path / "plots")
    assert [p.name for p in pngs] == ["gpu_tokens_per_s.png", "gpu_verify_cost.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


@pytest.mark.system  # the whole device script, its stages in processes: 40 s
def test_the_device_script_runs_every_stage_on_cpu(tmp_path: Path) -> None:
    """``benchmarks/device/run.sh`` with ``DEVICE_SMOKE=1``: each stage in its order (the
    verification tests, the corpus snapshot, drafter-bench gpu, drafter-bench load), tiny,
    on the CPU, in this environment; its results land in OUT as the device run's would."""
    data = repeating_records(tmp_path / "dev.jsonl", 4, seed=1)
    out = tmp_path / "out"
    script = Path(__file__).parent.parent / "benchmarks" / "device" / "run.sh"
    env = {**os.environ, "DEVICE_SMOKE": "1", "OUT": str(out), "DEV_FILES": str(data),
           "CORPUS": str(data), "PYTHON": sys.executable}  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=1200)  # fmt: skip
    stages = (out / "stages.txt").read_text().splitlines()
    assert [line.split()[0] for line in stages] == ["cuda-tests", "snapshot", "gpu", "load"]
    assert done.returncode == 0 and all(" passed in " in line for line in stages), (
        done.stdout + "".join((out / f).read_text() for f in ("gpu.log", "load.log")))
    assert sorted(p.name for p in out.iterdir()) == [
        "cuda-tests.log", "env.txt", "gpu.jsonl", "gpu.log", "load.jsonl", "load.log",
        "stages.txt",
    ]  # fmt: skip
    gpu = [json.loads(line) for line in (out / "gpu.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in gpu} == {"decode", "never_slower", "verify_cost", "ridge"}
    (load,) = [json.loads(line) for line in (out / "load.jsonl").read_text().splitlines()]
    assert load["threads"] == 1 and load["batch"] == 2 and load["server_cpus"] == "0"
    assert load["server_cpu_us_per_request_step"] > 0
