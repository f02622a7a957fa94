"""The deployment examples in deploy/: the SGLang PD manifests validate and agree with the
chart's beside-sglang-pd values, the Dockerfile keeps its compiler in the build stage and
builds the wheel from what its ignore file lets through, and local-run.sh parses.

Kubernetes objects are validated like the chart's (test_helm_chart.py): Kubernetes 1.33,
strict, with our own schema for the Prometheus Operator's PodMonitor.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from operator_schemas import OPERATOR_SCHEMAS

ROOT = Path(__file__).resolve().parents[1]
SGLANG = ROOT / "deploy" / "sglang-pd"
MANIFESTS = sorted(SGLANG.glob("*.yaml"))
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
CHART = ROOT / "helm" / "sssd-drafter"
EXAMPLE = CHART / "examples" / "beside-sglang-pd.yaml"
KUBE_VERSION = "1.33.0"
COMPILERS = ("g++", "gcc", "clang", "build-essential", "cmake", "ninja")


def objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def sglang_objects() -> list[dict[str, Any]]:
    return [obj for path in MANIFESTS for obj in objects(path)]


def deployment(component: str) -> dict[str, Any]:
    (found,) = [
        o for o in sglang_objects()
        if o["kind"] == "Deployment"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]  # fmt: skip
    return found


def env_of(obj: dict[str, Any]) -> dict[str, str]:
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container.get("env", [])}


def drafter_release() -> list[dict[str, Any]]:
    values = yaml.safe_load(EXAMPLE.read_text())
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name="drafter", namespace="llm")
    return [doc for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]  # fmt: skip


# --- SGLang PD manifests -------------------------------------------------------------


def test_sglang_manifests_exist() -> None:
    names = [p.name for p in MANIFESTS]
    assert names == ["decode-podmonitor.yaml", "decode.yaml", "prefill.yaml", "router.yaml"]
    assert (SGLANG / "README.md").is_file()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_sglang_manifests_validate(path: Path) -> None:
    for obj in objects(path):
        if obj["kind"] in OPERATOR_SCHEMAS:
            jsonschema.validate(obj, OPERATOR_SCHEMAS[obj["kind"]])
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        assert obj["metadata"]["namespace"] == "llm"


def test_decode_pods_reach_the_drafter_through_its_headless_service() -> None:
    release = drafter_release()
    (headless,) = [o for o in release if o["kind"] == "Service"
                   and o["spec"].get("clusterIP") == "None"]  # fmt: skip
    port = headless["spec"]["ports"][0]["port"]
    env = env_of(deployment("sglang-decode"))
    expected = f"dns:///{headless['metadata']['name']}.llm.svc.cluster.local:{port}"
    assert env["SSSD_DRAFTER_TARGET"] == expected


def test_only_decode_pods_pass_the_drafter_network_policy() -> None:
    (policy,) = [o for o in drafter_release() if o["kind"] == "NetworkPolicy"]
    (grpc_rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "grpc"]
    selector = grpc_rule["from"][0]["podSelector"]["matchLabels"]
    for component, admitted in (("sglang-decode", True), ("sglang-prefill", False),
                                ("sglang-router", False)):  # fmt: skip
        labels = deployment(component)["spec"]["template"]["metadata"]["labels"]
        assert (selector.items() <= labels.items()) is admitted, component


def test_deadline_matches_the_alert_threshold() -> None:
    thresholds = yaml.safe_load(EXAMPLE.read_text())["prometheusRule"]["thresholds"]
    deadline_ms = float(env_of(deployment("sglang-decode"))["SSSD_DRAFTER_DEADLINE_MS"])
    assert deadline_ms / 1000 == thresholds["drafterDeadlineSeconds"]


def test_pod_monitor_scrapes_the_decode_pods_metrics_port() -> None:
    (monitor,) = [o for o in sglang_objects() if o["kind"] == "PodMonitor"]
    decode = deployment("sglang-decode")["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= decode["metadata"]["labels"].items()
    port_names = {p["name"] for p in decode["spec"]["containers"][0]["ports"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in port_names
    metrics_port = int(env_of(deployment("sglang-decode"))["SSSD_METRICS_PORT"])
    ports = {p["name"]: p["containerPort"] for p in decode["spec"]["containers"][0]["ports"]}
    assert ports[monitor["spec"]["podMetricsEndpoints"][0]["port"]] == metrics_port


def test_only_decode_pods_speculate() -> None:
    def args(component: str) -> list[str]:
        (container,) = deployment(component)["spec"]["template"]["spec"]["containers"]
        command: list[str] = container["command"]
        return command

    assert "--disaggregation-mode=decode" in args("sglang-decode")
    assert "--disaggregation-mode=prefill" in args("sglang-prefill")
    assert any(a.startswith("--speculative-algorithm") for a in args("sglang-decode"))
    assert not any(a.startswith("--speculative") for a in args("sglang-prefill"))


def test_readme_says_sglang_has_no_client_yet() -> None:
    text = (SGLANG / "README.md").read_text()
    assert "SGLang does not ship a client for this drafter" in text


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
                   "deploy/prometheus/alerts.yaml", "trap cleanup EXIT"):  # fmt: skip
        assert needle in text, needle
