"""A real Prometheus scrapes a real `drafter serve` and a real reference worker
(`drafter-worker`, a tiny random Llama on CPU); every dashboard query and every alert
expression's inner queries then return data through the HTTP API, and the alert rules
evaluate without errors.

Alert expressions are evaluated operand by operand (thresholds dropped, see
observability.inner_queries) because their conditions are false on a healthy loop, and
with `offset 1h` removed: the baseline of SSSDAcceptanceCollapse looks an hour back,
further than this test runs. Needs /usr/bin/prometheus (`make tools`); about a minute.

One named exemption: the acceptance dashboard's queries over the engines' own series
(vllm:, sglang:; observability.ENGINE_METRICS) cannot return data, since no engine runs
here. They must still be accepted and evaluated by this Prometheus, and they read no
series of ours (test_dashboards_alerts.py checks that, and that every vLLM query is
overlaid with the same query over sssd: series, which must return data here).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from log_server import RedisServer
from observability import (
    ALERTS,
    DASHBOARDS,
    Query,
    alert_rules,
    dashboard_queries,
    engine_metric_names,
    inner_queries,
    substitute_variables,
)

PROMETHEUS = shutil.which("prometheus")
BIN = Path(sys.executable).parent
VOCAB_SIZE = 2048
RATE_INTERVAL = "30s"
STARTUP_TIMEOUT_S = 600.0  # bounds failure only: the worker alone imported torch for 70 s here
WORKER_SCRIPT = (
    "import sys; from verifier_client.reference_worker.worker_cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (make tools)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Stack:
    prometheus_url: str
    processes: dict[str, subprocess.Popen[bytes]]
    run_dir: Path

    def query(self, expr: str) -> dict[str, Any]:
        """An instant query; the API's ``data`` (resultType, result). A query Prometheus
        cannot parse or evaluate fails with its error message."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as err:  # 400 bad_data, 422 execution error
            pytest.fail(f"{expr}: HTTP {err.code} {err.read().decode(errors='replace')}")
        assert body["status"] == "success", f"{expr}: {body}"
        data: dict[str, Any] = body["data"]
        return data

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.prometheus_url}{path}", timeout=10) as response:
            return json.load(response)["data"]

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.run_dir.glob("*.log"))
        )


def write_prompts(path: Path) -> None:
    """Prompts built from a few repeated phrases: the input trie and the datastore both
    have something to match, so drafts get accepted even by a random model."""
    rng = random.Random(0)
    phrases = [[rng.randrange(10, VOCAB_SIZE) for _ in range(rng.randrange(4, 10))]
               for _ in range(30)]  # fmt: skip
    with path.open("w") as out:
        for _ in range(400):
            ids = [t for _ in range(rng.randrange(6, 16)) for t in rng.choice(phrases)]
            out.write(json.dumps({"prompt_ids": ids}) + "\n")


def worker_command() -> list[str]:
    script = BIN / "drafter-worker"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", WORKER_SCRIPT]  # the console script is not installed yet


def start(name: str, command: list[str], run_dir: Path) -> subprocess.Popen[bytes]:
    log = (run_dir / f"{name}.log").open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("prometheus-integration")
    grpc_port, metrics_port, worker_port, prom_port = (free_port() for _ in range(4))
    processes: dict[str, subprocess.Popen[bytes]] = {}
    stack = Stack(f"http://127.0.0.1:{prom_port}", processes, run_dir)
    redis = RedisServer(run_dir / "redis")  # the shared ingest log (its series too)
    try:
        processes["drafter"] = start("drafter", [
            str(BIN / "drafter"), "serve", "--host", "127.0.0.1", "--port", str(grpc_port),
            "--metrics-port", str(metrics_port), "--admin-port", "-1",
            "--data-dir", str(run_dir / "drafter-data"), "--vocab-size", str(VOCAB_SIZE),
            "--draft-threads", "1", "--rebuild-min-tokens", "1", "--rebuild-interval-s", "1",
            "--snapshot-interval-s", "5", "--shared-log", redis.url,
        ], run_dir)  # fmt: skip
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {"job_name": "sssd-drafter",
                 "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
                {"job_name": "sssd-worker",
                 "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
            ],
        }  # fmt: skip
        (run_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        assert PROMETHEUS is not None
        processes["prometheus"] = start("prometheus", [
            PROMETHEUS, f"--config.file={run_dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={run_dir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ], run_dir)  # fmt: skip
        write_prompts(run_dir / "prompts.jsonl")
        wait_for_line(run_dir / "drafter.log", "drafter listening on", processes["drafter"])
        processes["worker"] = start("worker", [
            *worker_command(), "--tiny", "llama", "--vocab-size", str(VOCAB_SIZE),
            "--prompts", str(run_dir / "prompts.jsonl"), "--batch", "8",
            "--max-new-tokens", "128", "--device", "cpu",
            "--drafter", f"127.0.0.1:{grpc_port}", "--deadline-ms", "50",
            "--metrics-port", str(worker_port), "--rounds", "0",  # decodes until stopped
        ], run_dir)  # fmt: skip
        wait_for_data(stack)
        yield stack
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        redis.stop()


def wait_for_line(path: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while text not in path.read_text(errors="replace"):
        assert process.poll() is None, f"{path.name}: exited\n{path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{path.name}: no {text!r}"
        time.sleep(0.2)


# Data every query needs: both targets up, drafts verified and accepted, a rebuild and a
# snapshot done, ingestion seen, and enough samples for rates over RATE_INTERVAL.
READY_WHEN = (
    'count(up{job=~"sssd-drafter|sssd-worker"} == 1) == 2',
    # "sssd.": the name with its colon, or as a broken exporter mangles it (see
    # test_worker_metric_names_survive_the_scrape, which then says so).
    f'sum(increase({{__name__=~"sssd.spec_decode_num_accepted_tokens_total"}}[{RATE_INTERVAL}]))'
    " > 0",
    f"increase(sssd_drafter_requests_total[{RATE_INTERVAL}]) > 0",
    "sssd_drafter_rebuilds_total > 0",
    f"increase(sssd_drafter_ingested_tokens_total[{RATE_INTERVAL}]) > 0",
    f"count_over_time(sssd_drafter_info[{RATE_INTERVAL}]) >= 15",
)


def wait_for_data(stack: Stack) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    pending = list(READY_WHEN)
    while pending:
        for name, process in stack.processes.items():
            assert process.poll() is None, f"{name} exited\n{stack.logs()}"
        try:
            pending = [q for q in pending if not stack.query(q)["result"]]
        except OSError:
            pass  # Prometheus not listening yet
        assert time.monotonic() < deadline, f"no data for {pending}\n{stack.logs()}"
        time.sleep(1.0)


def all_queries() -> list[Query]:
    queries = [
        Query(q.where, substitute_variables(q.expr, RATE_INTERVAL))
        for path in DASHBOARDS
        for q in dashboard_queries(path)
        if not q.expr.startswith("label_values(")
    ]
    for rule in alert_rules():
        for i, operand in enumerate(inner_queries(rule["expr"])):
            without_offset = re.sub(r"\s+offset\s+\w+", "", operand)
            queries.append(Query(f"{rule['alert']} operand {i}", without_offset))
    return queries


def label_value_queries() -> list[Query]:
    """The variables' label_values(metric, label) as the series they read."""
    queries = []
    for path in DASHBOARDS:
        for q in dashboard_queries(path):
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q.expr)
            if match:
                queries.append(Query(q.where, substitute_variables(match.group(1))))
    return queries


def test_worker_metric_names_survive_the_scrape(stack: Stack) -> None:
    """The decode worker's names keep their ``sssd:`` prefix in Prometheus. Prometheus
    asks for OpenMetrics, and prometheus-client (0.26 at least) then writes ``sssd:x`` as
    ``sssd_x`` in sample lines (prometheus/client_python#1177): an exporter with colon
    names must answer in the classic text format."""
    names = {r["metric"]["__name__"] for r in stack.query('{job="sssd-worker"}')["result"]}
    mangled = sorted(n for n in names if n.startswith("sssd_"))
    assert not mangled, f"the worker's sssd: names arrive as {mangled}"
    assert "sssd:spec_decode_num_drafts_total" in names


def engine_queries() -> list[Query]:
    """The exemption: dashboard queries over the engines' own series (no engine runs here)."""
    return [q for q in all_queries() if engine_metric_names(q.expr)]


def test_every_dashboard_query_and_alert_operand_returns_data(stack: Stack) -> None:
    exempt = set(engine_queries())
    queries = [q for q in all_queries() + label_value_queries() if q not in exempt]
    assert len(queries) > 50
    empty = [f"{q.where}: {q.expr}" for q in queries if not stack.query(q.expr)["result"]]
    assert not empty, "no data for:\n" + "\n".join(empty) + "\n" + stack.logs()
    assert stack.processes["worker"].poll() is None, "the worker finished before the queries"


def test_engine_series_queries_evaluate_without_data(stack: Stack) -> None:
    """Prometheus parses and evaluates every query over an engine's series; without an
    engine they are empty (were one ever scraped here, they would belong in the test
    above instead)."""
    queries = engine_queries()
    assert len(queries) >= 4
    for query in queries:
        data = stack.query(query.expr)
        assert data["resultType"] == "vector", query.where
        assert data["result"] == [], f"{query.where}: an engine's series is scraped here"


# Queries whose values must be finite and positive on a working loop (not just present):
# NaN would mean a division by a zero rate, i.e. the series is there but never moves.
MUST_BE_POSITIVE = (
    "1 + sum(rate(sssd:spec_decode_num_accepted_tokens_total[30s]))"
    " / sum(rate(sssd:spec_decode_num_drafts_total[30s]))",
    "sum(rate(sssd:spec_decode_num_draft_tokens_total[30s]))",
    "histogram_quantile(0.99, sum by (le) (rate(sssd:drafter_round_trip_seconds_bucket[30s])))",
    "histogram_quantile(0.99, sum by (le) (rate(sssd_drafter_batch_duration_seconds_bucket[30s])))",
    "sum(rate(sssd_drafter_requests_total[30s]))",
    "sum(sssd_drafter_datastore_tokens)",
    "sum(sssd_drafter_datastore_resident_bytes)",
    "max(sssd:draft_budget)",
)


@pytest.mark.parametrize("expr", MUST_BE_POSITIVE)
def test_core_numbers_are_positive(stack: Stack, expr: str) -> None:
    result = stack.query(expr)["result"]
    assert result, expr
    value = float(result[0]["value"][1])
    assert math.isfinite(value) and value > 0, f"{expr} = {value}"


def test_alert_rules_are_loaded_and_evaluate_cleanly(stack: Stack) -> None:
    groups = stack.api("/api/v1/rules?type=alert")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert sorted(rules) == sorted(r["alert"] for r in alert_rules())
    deadline = time.monotonic() + STARTUP_TIMEOUT_S  # bounds failure only
    while any(r.get("lastEvaluation", "").startswith("0001") for r in rules.values()):
        assert time.monotonic() < deadline, "rules never evaluated"
        time.sleep(1)
        groups = stack.api("/api/v1/rules?type=alert")["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
    for name, rule in rules.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"
    for rule in alert_rules():  # the full expressions, thresholds included, evaluate
        stack.query(rule["expr"])


def test_environment_is_not_leaking_settings() -> None:
    """The stack is configured by flags only: a DRAFTER_* variable in the test's
    environment would silently change what the drafter runs with."""
    assert not [k for k in os.environ if k.startswith("DRAFTER_")]
