"""The deployment examples in deploy/: the SGLang PD and vLLM manifests validate, run the
SSSD plug-ins with settings the plug-ins accept and agree with the chart's beside-*
examples, the Dockerfile keeps its compiler in the build stage and builds the wheel from
what its ignore file lets through, and local-run.sh parses.

Kubernetes objects are validated like the chart's (test_helm_chart.py): Kubernetes 1.33,
strict, with our own schema for the Prometheus Operator's PodMonitor. The engine suites
(tests/engines/, in the engines' virtualenvs) parse the containers' command lines with the
engines' own parsers: the flags are real, and SGLang's launch checks with our plug-in
registered pass.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from engines.deploy_commands import (
    EXAMPLE_DIRS,
    MANIFESTS,
    ROOT,
    command_line,
    container,
    deployment,
    env_of,
    example_objects,
    flag_value,
    objects,
)
from operator_schemas import OPERATOR_SCHEMAS

from verifier_client.engines import DrafterSettings
from verifier_client.engines import vllm as vllm_plugin

SGLANG, VLLM = EXAMPLE_DIRS
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
CHART = ROOT / "helm" / "sssd-drafter"
# The chart's values for the drafting tier beside each engine's decode pods.
CHART_EXAMPLES = {
    "sglang-decode": CHART / "examples" / "beside-sglang-pd.yaml",
    "vllm-decode": CHART / "examples" / "beside-vllm.yaml",
}
KUBE_VERSION = "1.33.0"
COMPILERS = ("g++", "gcc", "clang", "build-essential", "cmake", "ninja")
RETIRED_WORDING = ("shim", "no client", "not a working integration", "does not ship a client")


def drafter_settings(component: str) -> DrafterSettings:
    """The plug-in's settings as the decode container gives them to the engine."""
    if component == "vllm-decode":
        extra = json.loads(flag_value(command_line(component), "--additional-config"))
        assert set(extra) == {vllm_plugin.ADDITIONAL_CONFIG_KEY}, extra
        return DrafterSettings.from_mapping(
            extra[vllm_plugin.ADDITIONAL_CONFIG_KEY], where="--additional-config"
        )
    config = json.loads(env_of(component)["SSSD_DRAFTER_CONFIG"])
    return DrafterSettings.from_mapping(config, where="SSSD_DRAFTER_CONFIG")


@cache
def _release(example: Path) -> tuple[str, ...]:
    values = yaml.safe_load(example.read_text())
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name="drafter", namespace="llm")
    return tuple(text for path, text in manifests.items() if not path.endswith("NOTES.txt"))


def drafter_release(component: str) -> list[dict[str, Any]]:
    """The chart rendered with the example for ``component``'s decode pods."""
    texts = _release(CHART_EXAMPLES[component])
    return [doc for text in texts for doc in yaml.safe_load_all(text) if doc]


# --- every example manifest --------------------------------------------------------------


def test_example_manifests_exist() -> None:
    assert [p.name for p in sorted(SGLANG.glob("*.yaml"))] == [
        "decode-podmonitor.yaml", "decode.yaml", "prefill.yaml", "router.yaml",
    ]  # fmt: skip
    assert [p.name for p in sorted(VLLM.glob("*.yaml"))] == [
        "decode-podmonitor.yaml", "decode.yaml", "service.yaml",
    ]  # fmt: skip
    for directory in EXAMPLE_DIRS:
        assert (directory / "README.md").is_file()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_manifests_validate(path: Path) -> None:
    for obj in objects(path):
        if obj["kind"] in OPERATOR_SCHEMAS:
            jsonschema.validate(obj, OPERATOR_SCHEMAS[obj["kind"]])
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        assert obj["metadata"]["namespace"] == "llm"


@pytest.mark.parametrize("directory", EXAMPLE_DIRS, ids=lambda d: d.name)
def test_examples_describe_the_plugins_as_they_are(directory: Path) -> None:
    """The plug-ins exist: no text in the examples says the integration is missing, and
    each decode image says which client extra to install."""
    for path in sorted(directory.iterdir()):
        text = path.read_text().lower()
        for wording in RETIRED_WORDING:
            assert wording not in text, f"{path.name}: {wording!r}"
    engine = "sglang" if directory == SGLANG else "vllm"
    assert f"pip install './clients/python[{engine}]'" in (directory / "decode.yaml").read_text()
    image = f"RUN pip install --no-cache-dir '/tmp/sssd-verifier-client[{engine}]'"
    assert image in (directory / "README.md").read_text()


# --- the plug-ins' settings -----------------------------------------------------------------


def test_sglang_decode_runs_the_sssd_algorithm_configured_by_one_json_variable() -> None:
    argv = command_line("sglang-decode")
    assert flag_value(argv, "--speculative-algorithm") == "SSSD"
    assert int(flag_value(argv, "--speculative-num-draft-tokens")) >= 2
    assert "--enable-metrics" in argv  # SGLang's own acceptance, beside the plug-in's
    assert sorted(name for name in env_of("sglang-decode") if name.startswith("SSSD_")) == [
        "SSSD_DRAFTER_CONFIG"
    ]
    settings = drafter_settings("sglang-decode")
    assert settings.metrics_port is not None


def test_vllm_decode_runs_our_proposer() -> None:
    argv = command_line("vllm-decode")
    assert argv[:2] == ["vllm", "serve"]
    speculative = json.loads(flag_value(argv, "--speculative-config"))
    assert speculative["method"] == "custom_class"
    assert isinstance(speculative["num_speculative_tokens"], int)
    assert speculative["num_speculative_tokens"] >= 1
    module, _, name = speculative["model"].rpartition(".")
    assert getattr(importlib.import_module(module), name) is vllm_plugin.SssdProposer
    settings = drafter_settings("vllm-decode")
    assert settings.metrics_port is not None
    assert not [e for e in container("vllm-decode").get("env", [])
                if e["name"].startswith("SSSD_")]  # fmt: skip


@pytest.mark.parametrize("component", CHART_EXAMPLES)
def test_decode_pods_reach_the_drafter_through_its_headless_service(component: str) -> None:
    release = drafter_release(component)
    (headless,) = [o for o in release if o["kind"] == "Service"
                   and o["spec"].get("clusterIP") == "None"]  # fmt: skip
    port = headless["spec"]["ports"][0]["port"]
    expected = f"dns:///{headless['metadata']['name']}.llm.svc.cluster.local:{port}"
    assert drafter_settings(component).address == expected


@pytest.mark.parametrize("component", CHART_EXAMPLES)
def test_only_decode_pods_pass_the_drafter_network_policy(component: str) -> None:
    (policy,) = [o for o in drafter_release(component) if o["kind"] == "NetworkPolicy"]
    (grpc_rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "grpc"]
    selector = grpc_rule["from"][0]["podSelector"]["matchLabels"]
    for other in ("sglang-decode", "sglang-prefill", "sglang-router", "vllm-decode"):
        labels = deployment(other)["spec"]["template"]["metadata"]["labels"]
        assert (selector.items() <= labels.items()) is (other == component), other


@pytest.mark.parametrize("component", CHART_EXAMPLES)
def test_deadline_matches_the_alert_threshold(component: str) -> None:
    values = yaml.safe_load(CHART_EXAMPLES[component].read_text())
    thresholds = values["prometheusRule"]["thresholds"]
    deadline_ms = drafter_settings(component).deadline_ms
    assert deadline_ms / 1000 == thresholds["drafterDeadlineSeconds"]


@pytest.mark.parametrize("component", CHART_EXAMPLES)
def test_pod_monitor_scrapes_the_engine_and_the_plugin(component: str) -> None:
    """One PodMonitor per engine, two endpoints: the engine's own /metrics (its acceptance
    series) and the plug-in's metrics port (the sssd: series)."""
    pod = deployment(component)["spec"]["template"]
    (monitor,) = [o for o in example_objects() if o["kind"] == "PodMonitor"
                  and o["spec"]["selector"]["matchLabels"].items()
                  <= pod["metadata"]["labels"].items()]  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in container(component)["ports"]}
    scraped = {e["port"]: e["path"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert scraped == {"http": "/metrics", "sssd-metrics": "/metrics"}
    assert ports["sssd-metrics"] == drafter_settings(component).metrics_port
    assert ports["http"] == int(flag_value(command_line(component), "--port"))


def test_only_decode_pods_speculate() -> None:
    assert "--disaggregation-mode=decode" in command_line("sglang-decode")
    assert "--disaggregation-mode=prefill" in command_line("sglang-prefill")
    assert not any(a.startswith("--speculative") for a in command_line("sglang-prefill"))


def test_vllm_service_selects_the_decode_pods() -> None:
    (service,) = [o for o in objects(VLLM / "service.yaml") if o["kind"] == "Service"]
    labels = deployment("vllm-decode")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


# --- Dockerfile ------------------------------------------------------------------------


def stages(text: str) -> list[list[str]]:
    """Instructions per stage (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    result: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            result.append([])
        if result:
            result[-1].append(line)
    return result


def test_dockerfile_is_multi_stage_with_the_compiler_in_the_build_stage_only() -> None:
    build, runtime = stages(DOCKERFILE.read_text())
    assert build[0].endswith(" AS build") and runtime[0].endswith(" AS runtime")
    assert any("g++" in line for line in build if line.startswith("RUN"))
    assert any("pip wheel" in line for line in build)
    # The wheel's own dependencies are the library's alone: `drafter serve` needs its extra.
    assert any("pip install" in line and ".whl)[service]" in line for line in build)
    for line in runtime:
        if line.startswith("RUN"):
            assert "apt-get install" not in line and "pip install" not in line, line
            assert not any(re.search(rf"(^|\s){re.escape(c)}(\s|$)", line) for c in COMPILERS)
    assert any(line.startswith("COPY --from=build /opt/drafter") for line in runtime)


def test_dockerfile_runs_as_a_non_root_user() -> None:
    runtime = stages(DOCKERFILE.read_text())[-1]
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert any(line.startswith("ENTRYPOINT") and '"drafter"' in line for line in runtime)
    assert not any(line.startswith("HEALTHCHECK") for line in runtime)


def test_dockerfile_copies_every_wheel_package_and_the_ignore_file_lets_them_through() -> None:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"][
        "wheel"
    ]["packages"]
    build = stages(DOCKERFILE.read_text())[0]
    copied = [part.rstrip("/") for line in build if line.startswith("COPY ")
              for part in line.split()[1:-1]]  # fmt: skip
    for package in packages:
        assert package in copied, f"{package} is in the wheel but not copied"
    allowed = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()
               if line.startswith("!")}  # fmt: skip
    assert "*" in DOCKERIGNORE.read_text().splitlines(), "the ignore file starts from nothing"
    for source in copied:
        assert source in allowed, f"{source} is copied but excluded by the ignore file"
        assert (ROOT / source).exists(), source


# --- local-run.sh -----------------------------------------------------------------------


def test_local_run_script_parses_and_is_executable() -> None:
    script = ROOT / "deploy" / "local-run.sh"
    assert script.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    text = script.read_text()
    for needle in ("drafter\" serve", "--metrics-port", "prometheus --config.file",
                   "helm/sssd-drafter/files/alerts.yaml", "trap cleanup EXIT"):  # fmt: skip
        assert needle in text, needle
