"""Shared fixtures and the deterministic hypothesis profile of the test suite."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from dev_data import HOW, HUMANEVAL, SKIP_PREFIX, need, stand_ins
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

LLAMA3_VOCAB = 128256


@pytest.fixture(scope="session")
def humaneval_records() -> list[dict[str, Any]]:
    """The first 200 records of the HumanEval dev set (prompt_ids, output_ids)."""
    records = []
    with gzip.open(need(HUMANEVAL), "rt", encoding="utf-8") as f:
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


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """A section of its own for the tests that did not run, or ran on a stand-in, because
    the development data was not found: a bare "s" in the progress line is easy to miss."""
    missing = [
        report for report in terminalreporter.stats.get("skipped", [])
        if isinstance(report.longrepr, tuple) and SKIP_PREFIX in str(report.longrepr[2])
    ]  # fmt: skip
    if not missing and not stand_ins:
        return
    terminalreporter.section("development data not found", sep="=", yellow=True, bold=True)
    for report in missing:
        reason = str(report.longrepr[2]).removeprefix("Skipped: ").split(";")[0]
        terminalreporter.line(f"SKIPPED {report.nodeid}: {reason}", yellow=True)
    for what in stand_ins:
        terminalreporter.line(f"STAND-IN {what}", yellow=True)
    terminalreporter.line(f"To run them on the real data: {HOW}.", bold=True)
