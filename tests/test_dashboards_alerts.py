"""The Grafana dashboards and Prometheus alert rules (their one copy, the Helm chart's
files/): valid, on the metric contract (docs/metrics.md), and the alerts fire exactly when
their unit tests say.

The one exception to the contract: the acceptance dashboard shows the engines' own
acceptance series (observability.ENGINE_METRICS) beside the plug-ins' sssd: ones. They
are listed by name with the engine source that defines them (checked where the engines'
virtualenvs exist), read only in queries of their own, and every vLLM query is
overlaid with the same query over our series.

Needs promtool (the Debian prometheus package, `make tools`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from observability import (
    ALERTS,
    ALERTS_TEST,
    CHART_FILES,
    DASHBOARDS,
    ENGINE_METRICS,
    ENGINE_PREFIXES,
    ROOT,
    alert_rules,
    contract_name,
    contract_names,
    dashboard_queries,
    engine_metric_names,
    inner_queries,
    load_dashboard,
    metric_names,
    panels,
    substitute_variables,
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make tools)")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_there_are_two_dashboards_and_seven_alerts() -> None:
    assert [p.name for p in DASHBOARDS] == ["sssd-acceptance.json", "sssd-drafter.json"]
    assert [r["alert"] for r in alert_rules()] == [
        "SSSDAcceptanceCollapse", "SSSDAcceptanceLow", "SSSDDrafterFallbackRateHigh",
        "SSSDDrafterP99OverDeadline", "SSSDDrafterIngestDrops", "SSSDDrafterSnapshotTooOld",
        "SSSDDrafterSharedLogEntriesLost",
    ]  # fmt: skip


# --- the metric contract -----------------------------------------------------------


def test_metric_name_extraction() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, job) (rate(sssd_drafter_batch_duration_seconds_bucket"
        '{job=~"$job",method="Draft"}[$__rate_interval]))) > 0.003 and on (job) '
        "sssd:draft_budget offset 1h / ignoring(position) group_left up"
    )
    assert metric_names(expr) == {
        "sssd_drafter_batch_duration_seconds_bucket", "sssd:draft_budget", "up",
    }  # fmt: skip
    assert metric_names('label_values(sssd_drafter_info{job=~"$job"}, instance)') == {
        "sssd_drafter_info"
    }
    contract = {"sssd_drafter_batch_duration_seconds"}
    name = contract_name("sssd_drafter_batch_duration_seconds_bucket", contract)
    assert name == "sssd_drafter_batch_duration_seconds"
    assert contract_name("sssd_drafter_unknown_count", contract) == "sssd_drafter_unknown_count"


def test_contract_lists_both_exporters() -> None:
    names = contract_names()
    assert "sssd_drafter_batch_duration_seconds" in names
    assert "sssd:spec_decode_num_drafts_total" in names
    assert len(names) >= 25


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_queries_use_only_contract_and_listed_engine_metrics(path: Path) -> None:
    contract = contract_names()
    queries = dashboard_queries(path)
    assert len(queries) >= 10
    for query in queries:
        names = metric_names(query.expr)
        assert names, f"{query.where}: no metric found in {query.expr!r}"
        unknown = sorted(n for n in names if contract_name(n, contract) not in contract
                         and n not in ENGINE_METRICS)  # fmt: skip
        assert not unknown, f"{query.where}: {unknown} not in docs/metrics.md or ENGINE_METRICS"


def test_engine_queries_read_only_engine_series() -> None:
    """A query over an engine's series reads nothing of ours: the integration test, where
    no engine runs, exempts these queries from returning data, and must not exempt any
    series of ours with them."""
    engine_queries = 0
    for path in DASHBOARDS:
        for query in dashboard_queries(path):
            engine = engine_metric_names(query.expr)
            if engine:
                engine_queries += 1
                assert engine == metric_names(query.expr), query.where
                assert len({n.split(":")[0] for n in engine}) == 1, f"{query.where}: two engines"
    assert engine_queries >= 4


def test_every_vllm_query_is_overlaid_with_the_plugins() -> None:
    """Each vLLM query shares its panel with the same query over the plug-in's sssd:
    series (the plug-in mirrors vLLM's names and counting), so the two lines compare
    like with like."""
    board = load_dashboard(CHART_FILES / "dashboards" / "sssd-acceptance.json")
    overlaid = 0
    for panel in panels(board):
        exprs = [t["expr"] for t in panel.get("targets", [])]
        for expr in exprs:
            if "vllm:" in expr:
                assert expr.replace("vllm:", "sssd:") in exprs, f"{panel['title']}: {expr}"
                overlaid += 1
    assert overlaid >= 4


def test_every_listed_engine_metric_is_on_a_dashboard() -> None:
    used = {n for path in DASHBOARDS for q in dashboard_queries(path)
            for n in engine_metric_names(q.expr)}  # fmt: skip
    assert sorted(set(ENGINE_METRICS) - used) == []
    assert all(name.startswith(ENGINE_PREFIXES) for name in ENGINE_METRICS)


@pytest.mark.system  # reads the engines' virtualenvs, which make test sets up first
@pytest.mark.parametrize("engine", sorted({m.engine for m in ENGINE_METRICS.values()}))
def test_engine_metrics_are_named_as_the_engines_define_them(engine: str) -> None:
    """Each listed series is defined, under that name, in the engine version the plug-ins
    are tested against (its virtualenv from make setup-vllm / make setup-sglang)."""
    packages = sorted((ROOT / f".venv-{engine}").glob("lib/python3*/site-packages"))
    if not packages:
        pytest.skip(f".venv-{engine} not installed (make setup-{engine})")
    for name, metric in ENGINE_METRICS.items():
        if metric.engine != engine:
            continue
        source = (packages[0] / metric.source).read_text()
        assert f'"{metric.defined_as}"' in source, f"{name}: not defined in {metric.source}"
        # prometheus_client adds "_total" to a counter's name; a gauge keeps its name.
        assert name.removesuffix("_total") == metric.defined_as, name


def test_alert_expressions_use_only_contract_metrics() -> None:
    contract = contract_names()
    for rule in alert_rules():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: no metric found"
        unknown = sorted(n for n in names if contract_name(n, contract) not in contract)
        assert not unknown, f"{rule['alert']}: {unknown} are not in docs/metrics.md"


def test_every_contract_metric_is_on_a_dashboard() -> None:
    used = {
        contract_name(name, contract_names())
        for path in DASHBOARDS
        for query in dashboard_queries(path)
        for name in metric_names(query.expr)
    }
    assert sorted(contract_names() - used) == []


# --- dashboards ----------------------------------------------------------------------


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    board = load_dashboard(path)
    assert board["schemaVersion"] >= 39
    assert board["id"] is None, "an exported dashboard carries no database id"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["id"]
        assert panel["title"] and panel["description"], panel["id"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["id"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["id"]
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_panels_do_not_overlap(path: Path) -> None:
    taken: dict[tuple[int, int], int] = {}
    for panel in panels(load_dashboard(path)):
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["id"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"panels {taken[(x, y)]} and {panel['id']} overlap"
                taken[(x, y)] = panel["id"]


def test_dashboard_uids_are_unique() -> None:
    uids = [load_dashboard(p)["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids))


@needs_promtool
def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Every panel query, variables substituted, is valid PromQL: promtool parses each as
    the expression of a recording rule."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": substitute_variables(query.expr)}
        for i, query in enumerate(q for path in DASHBOARDS for q in dashboard_queries(path))
        if not query.expr.startswith("label_values(")
    ]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]})
    )
    result = promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_variable_substitution() -> None:
    expr = 'rate(x{job=~"$job",ds=~"${datastore}"}[$__rate_interval]) + increase(y[$__range])'
    assert substitute_variables(expr) == 'rate(x{job=~".*",ds=~".*"}[30s]) + increase(y[5m])'


# --- alert rules ---------------------------------------------------------------------


@needs_promtool
def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", ALERTS.name, cwd=ALERTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", ALERTS_TEST.name, cwd=ALERTS_TEST.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _rule_tests() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS_TEST.read_text())
    return [case for test in document["tests"] for case in test["alert_rule_test"]]


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = _rule_tests()
    for rule in alert_rules():
        name = rule["alert"]
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no case where it stays quiet"


@needs_promtool
@pytest.mark.parametrize("alert", [r["alert"] for r in alert_rules()])
@pytest.mark.parametrize("mutation", ["never_fires", "always_fires"])
def test_unit_tests_catch_a_broken_alert(alert: str, mutation: str, tmp_path: Path) -> None:
    """The unit tests are not vacuous: an alert that never fires (or always fires) fails
    them."""
    document = yaml.safe_load(ALERTS.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                inner = rule["expr"].strip()
                rule["expr"] = (
                    f"({inner}) and on() (vector(1) < 0)"
                    if mutation == "never_fires"
                    else f"({inner}) or vector(1)"
                )
    (tmp_path / ALERTS.name).write_text(yaml.safe_dump(document, sort_keys=False))
    # Only this alert's cases: the others cannot see it, and each case costs promtool time.
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    groups = []
    for group in tests["tests"]:
        cases = [c for c in group.get("alert_rule_test", []) if c["alertname"] == alert]
        if cases:
            groups.append({**group, "alert_rule_test": cases, "promql_expr_test": []})
    assert groups, f"{alert}: no unit test"
    tests["tests"] = groups
    (tmp_path / ALERTS_TEST.name).write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)
    assert result.returncode != 0, f"{alert} {mutation}: the unit tests still pass"
    assert re.search(rf"alertname: {alert}\b", result.stdout + result.stderr)


def test_inner_queries_split_at_top_level_operators() -> None:
    expr = "(a + b) < 0.7 * (c > 1) and on (job) sum by (job) (rate(d[5m])) > 0.1"
    assert inner_queries(expr) == ["(a + b)", "0.7 * (c > 1)", "sum by (job) (rate(d[5m]))"]
    assert inner_queries("max(x) > 3600") == ["max(x)"]


def test_alerts_have_severity_summary_and_for() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert re.fullmatch(r"\d+m", rule["for"]), rule["alert"]
