"""What the dashboards and alert rules query, for the tests that check them. Their one copy
is the Helm chart's files/ (which deploy/local-run.sh loads too).

Pure helpers: the PromQL of every dashboard panel and template variable, of every alert
rule, the metric names an expression reads, the metric contract of docs/metrics.md, the
engines' own series the acceptance dashboard shows beside ours, and Grafana's variables
substituted so that Prometheus can evaluate a panel's query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART_FILES = ROOT / "helm" / "sssd-drafter" / "files"
DASHBOARDS = sorted((CHART_FILES / "dashboards").glob("*.json"))
ALERTS = CHART_FILES / "alerts.yaml"
ALERTS_TEST = CHART_FILES / "alerts_test.yaml"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# Suffixes Prometheus adds to a histogram's series; the contract names the histogram.
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
     "bool", "offset", "inf", "nan"}
)  # fmt: skip
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


@dataclass(frozen=True, slots=True)
class EngineMetric:
    """A series an engine exports itself, and where the engine's source defines it."""

    engine: str  # "vllm" or "sglang": its virtualenv is .venv-<engine>
    source: str  # the defining file, relative to site-packages (the version we test)
    defined_as: str  # the name passed to prometheus_client (counters lack "_total")


_VLLM_SPEC = "vllm/v1/spec_decode/metrics.py"
_SGLANG_COLLECTOR = "sglang/srt/observability/metrics_collector.py"


def _defined_in(
    engine: str, source: str, names: tuple[str, ...], exported_suffix: str = ""
) -> dict[str, EngineMetric]:
    """The series ``source`` defines under ``names``, keyed by the name Prometheus scrapes:
    prometheus_client appends "_total" to a counter's name, so counters pass that suffix."""
    return {name + exported_suffix: EngineMetric(engine, source, name) for name in names}


# The engines' own series: not ours, so not in docs/metrics.md's contract, but the
# acceptance dashboard shows them beside the plug-ins' sssd: series so that a user sees the
# two agree. No engine runs in the Prometheus integration test, so queries over these
# return no data there; it checks only that Prometheus evaluates them (ENGINE_PREFIXES).
ENGINE_METRICS: dict[str, EngineMetric] = {
    **_defined_in("vllm", _VLLM_SPEC, (
        "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos",
    ), exported_suffix="_total"),
    **_defined_in("sglang", _SGLANG_COLLECTOR, (
        "sglang:spec_accept_length", "sglang:spec_accept_rate",
    )),
}  # fmt: skip
ENGINE_PREFIXES = ("vllm:", "sglang:")


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression and where it comes from (for failure messages)."""

    where: str
    expr: str


def load_dashboard(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(path: Path) -> list[Query]:
    """The PromQL of every panel target and query variable of one dashboard."""
    board = load_dashboard(path)
    queries = []
    for panel in panels(board):
        for target in panel.get("targets", []):
            where = f"{path.name}: panel {panel['id']} {panel['title']!r} target {target['refId']}"
            queries.append(Query(where, target["expr"]))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            queries.append(Query(f"{path.name}: variable ${variable['name']}", text))
    return queries


def alert_rules() -> list[dict[str, Any]]:
    """The rules of the alert file (ALERTS), each with its group's name."""
    document = yaml.safe_load(ALERTS.read_text())
    rules = []
    for group in document["groups"]:
        for rule in group["rules"]:
            rules.append({**rule, "group": group["name"]})
    return rules


def contract_names() -> set[str]:
    """Metric names in the first column of docs/metrics.md's tables."""
    names = set()
    for line in METRICS_DOC.read_text().splitlines():
        match = re.match(r"\|\s*`([A-Za-z_:][A-Za-z0-9_:]*)`\s*\|", line)
        if match:
            names.add(match.group(1))
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads, histogram suffixes stripped.

    Strings, label matchers, grouping clauses and range/offset durations are removed
    first; what remains is function names (followed by a parenthesis), keywords,
    numbers and metric names.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    # label_values(metric{...}, label): the label is not a metric.
    text = re.sub(r"label_values\(([^,()]+(?:\{[^}]*\})?)\s*,\s*\w+\s*\)", r"\1", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    grouping = r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
    text = re.sub(grouping, " ", text)
    text = re.sub(r"\boffset\s+\S+", " ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or name.lower() in _KEYWORDS:
            continue
        if re.fullmatch(r"\d.*", name):
            continue
        names.add(name)
    return names


def contract_name(series_name: str, contract: set[str]) -> str:
    """The contract's name for a series name (``x_bucket`` -> ``x`` if ``x`` is listed)."""
    if series_name in contract:
        return series_name
    for suffix in _HISTOGRAM_SUFFIXES:
        if series_name.endswith(suffix) and series_name[: -len(suffix)] in contract:
            return series_name[: -len(suffix)]
    return series_name


def engine_metric_names(expr: str) -> set[str]:
    """The engines' own series an expression reads (names with an engine's prefix)."""
    return {name for name in metric_names(expr) if name.startswith(ENGINE_PREFIXES)}


def substitute_variables(expr: str, rate_interval: str = "30s", range_: str = "5m") -> str:
    """A panel query as Prometheus can evaluate it: Grafana's variables replaced, every
    template variable matching anything (the dashboards' "All" value, ``.*``)."""
    text = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    text = text.replace("$__range", range_)
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", ".*", text)


def inner_queries(expr: str) -> list[str]:
    """The operands of an alert expression's top-level comparisons and set operators,
    numbers dropped: ``a > 0.05`` gives ``[a]``; ``a < 0.7 * b and c > 0.1`` gives
    ``[a, 0.7 * b, c]``. Vector matching clauses (``on (...)``) go with their operator."""
    operators = re.compile(r"(>=|<=|==|!=|>|<|\band\b|\bor\b|\bunless\b)(\s+bool\b)?")
    parts, depth, start, i = [], 0, 0, 0
    while i < len(expr):
        char = expr[i]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0:
            match = operators.match(expr, i)
            if match and (match.group(1)[0] in "<>=!" or _word_boundary(expr, i)):
                parts.append(expr[start:i])
                i = match.end()
                modifier = re.match(r"\s*(on|ignoring)\s*\([^)]*\)", expr[i:])
                if modifier:
                    i += modifier.end()
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip() and not _is_number(p.strip())]


def _word_boundary(text: str, index: int) -> bool:
    return index == 0 or not (text[index - 1].isalnum() or text[index - 1] in "_:")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
