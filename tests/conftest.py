"""Shared fixtures and the deterministic hypothesis profile of the test suite."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "deterministic",
    derandomize=True,
    database=None,  # no replay of saved failures: every run tests the same examples
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("deterministic")

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
HUMANEVAL = DATA_DIR / "dev" / "code_humaneval_llama31_8b.jsonl.gz"
LLAMA3_VOCAB = 128256


@pytest.fixture(scope="session")
def humaneval_records() -> list[dict[str, Any]]:
    """The first 200 records of the HumanEval dev set (prompt_ids, output_ids)."""
    if not HUMANEVAL.is_file():
        pytest.skip(f"dev data not found at {HUMANEVAL} (needs ../shared/data beside the repo)")
    records = []
    with gzip.open(HUMANEVAL, "rt", encoding="utf-8") as f:
        for line in f:
            records.append(json.loads(line))
            if len(records) == 200:
                break
    return records


@pytest.fixture(scope="session")
def loop_thread() -> Any:
    """One asyncio loop in a thread for every in-process gRPC server of the session."""
    from service_support import LoopThread

    loop = LoopThread()
    yield loop
    loop.close()

# The engine plug-in tests run in the engines' own virtualenvs (make test-vllm,
# make test-sglang), which hold vLLM / SGLang; the main suite does not collect them.
collect_ignore = ["engines"]
