"""The Helm chart in helm/sssd-drafter: it lints clean, renders for the default values and
every example, every rendered object validates against the Kubernetes OpenAPI schemas,
the values schema rejects typos, and the rendered objects agree with the drafter.

Rendering and linting use helm-python-sdk (Helm's own Go SDK); validation uses
kubernetes-validate's bundled schemas for Kubernetes 1.33 in strict mode (unknown fields
are errors). The Prometheus Operator kinds (ServiceMonitor, PrometheusRule) are not
Kubernetes built-ins: they are validated against the schemas in this file, which cover
the fields the chart uses.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import grpc
import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from client_servers import DrafterProcess
from grpc_health.v1 import health_pb2, health_pb2_grpc
from observability import ALERTS, ALERTS_TEST, DASHBOARDS
from operator_schemas import OPERATOR_SCHEMAS
from service_support import parsed_config

from drafter_service.admin.bearer_auth import PUBLIC_PATHS
from drafter_service.admin.routes import probes
from drafter_service.service.grpc_server import SERVICE_NAME
from drafter_service.service.setting_values import ENV_PREFIX
from drafter_service.service.settings import ServeConfig
from verifier_client.engines import DrafterSettings, EngineDrafter

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "sssd-drafter"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
KUBE_VERSION = "1.33.0"
RELEASE, NAMESPACE = "drafter", "llm"
EVERYTHING_ON: dict[str, Any] = {
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "grafanaDashboards": {"enabled": True},
    "autoscaling": {"enabled": True},
    "datastore": {"seed": {"enabled": True, "claimName": "snapshots", "path": "snap-1"}},
    # Autoscaled replicas learn as one through the shared log (the schema requires it).
    "sharedLog": {
        "redis": {"address": "redis-master.llm.svc.cluster.local:6379", "existingSecret": "redis"}
    },
}
# gRPC credentials: bearer tokens from an existing Secret, TLS from a kubernetes.io/tls one
# (server-side TLS only; the mtls-cert-manager example has mutual TLS and cert-manager).
AUTH_AND_TLS = {
    "auth": {"enabled": True, "existingSecret": "grpc-clients", "existingSecretKey": "lines"},
    "tls": {"enabled": True, "secretName": "drafter-tls"},
}
VALUE_SETS = {"default": {}, "everything-on": EVERYTHING_ON, "auth-and-tls": AUTH_AND_TLS} | {
    f"example-{p.stem}": yaml.safe_load(p.read_text()) for p in EXAMPLES
}


@cache
def _rendered(name: str) -> tuple[tuple[str, str], ...]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(VALUE_SETS[name], name=RELEASE, namespace=NAMESPACE)
    return tuple(sorted(manifests.items()))


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The rendered objects for ``values`` (NOTES.txt excluded)."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return _objects(manifests.items())


def rendered(name: str) -> list[dict[str, Any]]:
    return _objects(_rendered(name))


def _objects(manifests: Any) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for path, text in manifests:
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def one(objects: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{len(found)} {kind} objects named *{suffix}"
    return found[0]


def settings_map(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The ConfigMap of DRAFTER_* settings (not a dashboard's)."""
    return one(objects, "ConfigMap", f"{RELEASE}-sssd-drafter")


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    drafter: dict[str, Any] = pod["containers"][0]
    return drafter


# --- lint, render, validate ------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_is_clean(name: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    # Severity 1 is INFO: the only one expected is the missing icon (there is no project
    # logo to point at). Warnings (2) and errors (3) fail.
    findings = [(m["severity"], m["path"], m["error"]) for m in report["messages"]]
    assert [f for f in findings if f[0] >= 2] == []
    assert {f[2] for f in findings} <= {"icon is recommended"}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_object_validates(name: str) -> None:
    objects = rendered(name)
    assert len(objects) >= 6
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in OPERATOR_SCHEMAS:
            jsonschema.validate(obj, OPERATOR_SCHEMAS[obj["kind"]])
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {where} invalid at {path}: {exc.message}")


def test_validation_catches_a_bad_object() -> None:
    """The validator is not a no-op: an unknown field and a wrong type fail."""
    statefulset = one(rendered("default"), "StatefulSet")
    bad = yaml.safe_load(yaml.safe_dump(statefulset))
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grcp"] = {"port": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)
    bad = yaml.safe_load(yaml.safe_dump(statefulset))
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)
    monitor = one(rendered("everything-on"), "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["prot"] = "metrics"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, OPERATOR_SCHEMAS["ServiceMonitor"])
    certificate = one(rendered("example-mtls-cert-manager"), "Certificate")
    certificate["spec"]["dnsName"] = certificate["spec"].pop("dnsNames")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(certificate, OPERATOR_SCHEMAS["Certificate"])


def test_optional_objects_follow_their_switches() -> None:
    kinds = sorted(o["kind"] for o in rendered("default"))
    assert kinds == [
        "ConfigMap", "NetworkPolicy", "PodDisruptionBudget", "Secret", "Service", "Service",
        "ServiceAccount", "StatefulSet",
    ]  # fmt: skip
    kinds = sorted(o["kind"] for o in rendered("everything-on"))
    for kind in ("HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule"):
        assert kind in kinds
    assert "Certificate" not in kinds
    assert kinds.count("ConfigMap") == 1 + len(DASHBOARDS)
    assert "replicas" not in one(rendered("everything-on"), "StatefulSet")["spec"]


# --- values schema -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCout": 2}, "replicaCout"),
        ({"settings": {"max_budgt": 64}}, "max_budgt"),
        ({"datastore": {"expectedByte": 1}}, "expectedByte"),
        ({"replicaCount": "two"}, "/replicaCount"),
        ({"datastore": {"expectedBytes": "8Gi"}}, "/datastore/expectedBytes"),
        ({"settings": {"store": "everything"}}, "/settings/store"),
        ({"prometheusRule": {"thresholds": {"drafterDeadlineSeconds": "3ms"}}}, "drafterDeadline"),
        ({"datastore": {"seed": {"enabled": True}}}, "/datastore/seed/claimName"),
        ({"datastore": {"seed": {"enabled": True, "claimName": "c", "path": "a/../../etc"}}},
         "/datastore/seed/path"),
        ({"auth": {"enabled": True}}, "/auth/existingSecret"),
        ({"auth": {"enabled": True, "existingSecret": "Grpc_Tokens"}}, "/auth/existingSecret"),
        ({"auth": {"enabled": True, "existingSecret": "t", "existingSecretKey": "a/b"}},
         "/auth/existingSecretKey"),
        ({"auth": {"enabeld": True}}, "enabeld"),
        ({"tls": {"enabled": True}}, "/tls/secretName"),
        ({"tls": {"mutual": True}}, "/tls/mutual"),
        ({"tls": {"certManager": {"enabled": True, "issuerRef": {"name": "ca"}}}},
         "/tls/certManager/enabled"),
        ({"tls": {"enabled": True, "certManager": {"enabled": True}}},
         "/tls/certManager/issuerRef/name"),
        ({"tls": {"enabled": True, "secretName": "s", "certManager": {"duration": "90d"}}},
         "/tls/certManager/duration"),
        ({"tls": {"enabled": True, "secretName": "s",
                  "certManager": {"extraDnsNames": ["drafter.example.com:50051"]}}},
         "/tls/certManager/extraDnsNames/0"),
        ({"settings": {"tls_cert_file": "/etc/tls.crt"}}, "tls_cert_file"),
        ({"settings": {"shared_log": "redis://redis:6379/0"}}, "shared_log"),
        ({"sharedLog": {"redis": {"adress": "redis:6379"}}}, "adress"),
        ({"sharedLog": {"redis": {"address": "redis"}}}, "/sharedLog/redis/address"),
        ({"sharedLog": {"redis": {"address": "redis://redis:6379"}}}, "/sharedLog/redis/address"),
        ({"sharedLog": {"redis": {"address": "redis:65536"}}}, "/sharedLog/redis/address"),
        ({"sharedLog": {"redis": {"address": "redis:6379/0"}}}, "/sharedLog/redis/address"),
        ({"sharedLog": {"redis": {"address": "redis:6379", "db": -1}}}, "/sharedLog/redis/db"),
        ({"sharedLog": {"redis": {"address": "redis:6379", "existingSecret": "Redis_Pw"}}},
         "/sharedLog/redis/existingSecret"),
        ({"sharedLog": {"prefix": "two words"}}, "/sharedLog/prefix"),
        ({"sharedLog": {"retention": -1}}, "/sharedLog/retention"),
        ({"sharedLog": {"bootstrap": {"clusterDomain": "*.local"}}},
         "/sharedLog/bootstrap/clusterDomain"),
        ({"replicaCount": 3, "sharedLog": {"allowIsolatedReplicas": "yes"}},
         "/sharedLog/allowIsolatedReplicas"),
    ],
)  # fmt: skip
def test_values_schema_rejects(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    assert message in str(caught.value)


CHART_OWNED = {  # set by the chart from its own values (values.yaml says which)
    "host", "port", "data_dir", "snapshot", "admin_host", "admin_port", "admin_token_file",
    "metrics_host", "metrics_port", "corpora_dir", "draft_config", "grpc_tokens_file",
    "tls_cert_file", "tls_key_file", "tls_client_ca_file", "shared_log",
    "shared_log_password_file", "shared_log_prefix", "shared_log_retention", "bootstrap_peers",
}  # fmt: skip
NOT_IN_CHART = {"tokenizer", "datastores"}  # files in the pod the chart has no volume for


def test_values_schema_names_only_real_drafter_settings() -> None:
    schema = (CHART / "values.schema.json").read_text()
    settings = yaml.safe_load(schema)["properties"]["settings"]["properties"]
    serve_fields = set(ServeConfig.model_fields)
    assert set(settings) <= serve_fields, sorted(set(settings) - serve_fields)


def test_every_drafter_setting_can_be_given_to_the_chart() -> None:
    """A new ``drafter serve`` setting is in the values schema's ``settings`` (which admits
    no other key), owned by the chart, or named here as out of its reach."""
    schema = (CHART / "values.schema.json").read_text()
    settings = set(yaml.safe_load(schema)["properties"]["settings"]["properties"])
    missing = set(ServeConfig.model_fields) - settings - CHART_OWNED - NOT_IN_CHART
    assert not missing, sorted(missing)
    apart = {"settings": {"recent_scope": "client"},
             "auth": {"enabled": True, "existingSecret": "tokens"}}  # fmt: skip
    assert settings_map(render(apart))["data"]["DRAFTER_RECENT_SCOPE"] == "client"
    with pytest.raises(helm.HelmRenderError, match="needs clients told apart"):
        render({"settings": {"recent_scope": "client"}})  # no auth: the drafter would refuse


# --- what the objects say ---------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_configmap_is_a_valid_drafter_configuration(name: str) -> None:
    """Every DRAFTER_* variable is a `drafter serve` setting, and together they parse."""
    data = settings_map(rendered(name))["data"]
    serve_fields = set(ServeConfig.model_fields)
    for key in data:
        assert key.startswith("DRAFTER_") and key[8:].lower() in serve_fields, key
    config = parsed_config([], data)
    assert config.host == "0.0.0.0" and config.admin_host == "0.0.0.0"
    assert config.data_dir == Path("/data/live")


def test_large_numbers_are_not_rendered_in_exponent_form() -> None:
    data = settings_map(render({"settings": {"max_sub_index_tokens": 512_000_000}}))["data"]
    assert data["DRAFTER_MAX_SUB_INDEX_TOKENS"] == "512000000"


def test_the_chart_runs_background_threads_behind_drafting() -> None:
    """The pod is a cgroup of its own: the chart sets --background-nice 19 (drafter serve's
    own default, for machines it shares, is 0); a value can turn it off."""
    data = settings_map(render({}))["data"]
    assert parsed_config([], data).background_nice == 19
    off = settings_map(render({"settings": {"background_nice": 0}}))["data"]
    assert parsed_config([], off).background_nice == 0
    assert parsed_config([], {}).background_nice == 0


def test_the_node_score_choice_reaches_the_drafter() -> None:
    """Unset, the drafter picks the seed snapshot's learned score (or the shipped one);
    `hand` selects the hand-set fusion."""
    assert "DRAFTER_NODE_SCORE" not in settings_map(render({}))["data"]
    data = settings_map(render({"settings": {"node_score": "hand"}}))["data"]
    assert data["DRAFTER_NODE_SCORE"] == "hand"
    assert parsed_config([], data).node_score == "hand"


def test_ports_and_probes() -> None:
    objects = rendered("default")
    drafter = container(objects)
    ports = {p["name"]: p["containerPort"] for p in drafter["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9400, "admin": 8400}
    assert drafter["startupProbe"]["grpc"] == {"port": 50051}
    assert drafter["readinessProbe"]["grpc"] == {"port": 50051, "service": SERVICE_NAME}
    assert drafter["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    startup = drafter["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    data = settings_map(objects)["data"]
    assert data["DRAFTER_PORT"] == "50051" and data["DRAFTER_METRICS_PORT"] == "9400"
    assert data["DRAFTER_ADMIN_PORT"] == "8400"


def test_services() -> None:
    objects = rendered("default")
    headless = one(objects, "Service", "-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert [p["name"] for p in headless["spec"]["ports"]] == ["grpc"]
    statefulset = one(objects, "StatefulSet")
    assert statefulset["spec"]["serviceName"] == headless["metadata"]["name"]
    main = one(objects, "Service", "-sssd-drafter")
    assert {p["name"] for p in main["spec"]["ports"]} == {"grpc", "metrics", "admin"}
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    for service in (headless, main):
        assert service["spec"]["selector"].items() <= pod_labels.items()


def test_security_context_and_writable_paths() -> None:
    objects = rendered("default")
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    drafter = container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert drafter["securityContext"]["readOnlyRootFilesystem"] is True
    assert drafter["securityContext"]["allowPrivilegeEscalation"] is False
    assert drafter["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in drafter["volumeMounts"]}
    assert mounts["/data"] == "data" and mounts["/tmp"] == "tmp"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["tmp"]
    claims = one(objects, "StatefulSet")["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    token = settings_map(objects)["data"]["DRAFTER_ADMIN_TOKEN_FILE"]
    assert token.startswith(mounts_prefix(mounts, "admin-token"))


def pod_volumes(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    spec = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    return {v["name"]: v for v in spec["volumes"]}


def mounts_prefix(mounts: dict[str, str], volume: str) -> str:
    return next(path for path, name in mounts.items() if name == volume) + "/"


def test_persistence_off_uses_an_empty_dir() -> None:
    objects = render({"persistence": {"enabled": False}})
    statefulset = one(objects, "StatefulSet")
    assert "volumeClaimTemplates" not in statefulset["spec"]
    assert "emptyDir" in pod_volumes(objects)["data"]


def test_admin_secret() -> None:
    secret = one(render({"admin": {"token": "s3cret"}}), "Secret")
    assert secret["data"]["admin-token"] == "czNjcmV0"  # base64("s3cret")
    objects = render({"admin": {"existingSecret": "mine", "existingSecretKey": "tok"}})
    assert not [o for o in objects if o["kind"] == "Secret"]
    volumes = pod_volumes(objects)
    assert volumes["admin-token"]["secret"]["secretName"] == "mine"
    assert settings_map(objects)["data"]["DRAFTER_ADMIN_TOKEN_FILE"].endswith("/tok")


def test_seed_snapshot() -> None:
    objects = rendered("everything-on")
    assert settings_map(objects)["data"]["DRAFTER_SNAPSHOT"] == "/seed/snap-1"
    volumes = pod_volumes(objects)
    assert volumes["seed"]["persistentVolumeClaim"] == {"claimName": "snapshots", "readOnly": True}


# --- gRPC credentials: tokens, TLS, cert-manager -----------------------------------------

CREDENTIAL_FIELDS = ("grpc_tokens_file", "tls_cert_file", "tls_key_file", "tls_client_ca_file")
"""The `drafter serve` settings the chart sets from `auth` and `tls`."""
MTLS_EXAMPLE = "example-mtls-cert-manager"


def credential_files(objects: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each credential setting in the ConfigMap as (Secret, key) of the file it names,
    followed through the container's mounts and the pod's Secret volumes."""
    data = settings_map(objects)["data"]
    found: dict[str, tuple[str, str]] = {}
    for name in CREDENTIAL_FIELDS:
        path = data.get(ENV_PREFIX + name.upper())
        if path is not None:
            found[name] = secret_file(objects, path)
    return found


def secret_file(objects: list[dict[str, Any]], path: str) -> tuple[str, str]:
    """(Secret, key) of the file at ``path`` in the drafter container, followed through
    its read-only mount and the pod's Secret volume."""
    mounts = {m["mountPath"]: m for m in container(objects)["volumeMounts"]}
    directory, _, file_name = path.rpartition("/")
    mount = mounts[directory]
    assert mount.get("readOnly") is True, mount
    secret = pod_volumes(objects)[mount["name"]]["secret"]
    (key,) = [i["key"] for i in secret["items"] if i["path"] == file_name]
    return secret["secretName"], key


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("default", {}),
        ("everything-on", {}),
        ("auth-and-tls", {"grpc_tokens_file": ("grpc-clients", "lines"),
                          "tls_cert_file": ("drafter-tls", "tls.crt"),
                          "tls_key_file": ("drafter-tls", "tls.key")}),
        (MTLS_EXAMPLE, {"grpc_tokens_file": ("sssd-drafter-grpc-tokens", "tokens"),
                        "tls_cert_file": (f"{RELEASE}-sssd-drafter-tls", "tls.crt"),
                        "tls_key_file": (f"{RELEASE}-sssd-drafter-tls", "tls.key"),
                        "tls_client_ca_file": (f"{RELEASE}-sssd-drafter-tls", "ca.crt")}),
    ],
)  # fmt: skip
def test_credentials_are_mounted_and_named_exactly_when_enabled(
    name: str, expected: dict[str, tuple[str, str]]
) -> None:
    """The ConfigMap names a credential file exactly when its switch is on, the name is
    the variable `drafter serve` reads for that setting, and the file is the right key
    of the right Secret, mounted read-only; no credential volume is left unused."""
    objects = rendered(name)
    assert set(CREDENTIAL_FIELDS) <= set(ServeConfig.model_fields)
    assert credential_files(objects) == expected
    data = settings_map(objects)["data"]
    config = parsed_config([], data)
    for field_name in CREDENTIAL_FIELDS:
        path = data.get(ENV_PREFIX + field_name.upper())
        assert getattr(config, field_name) == (Path(path) if path else None), field_name
    volumes = set(pod_volumes(objects))
    assert ("grpc-tokens" in volumes) is ("grpc_tokens_file" in expected)
    assert ("tls" in volumes) is ("tls_cert_file" in expected)


def test_probes_ask_the_admin_port_when_grpc_speaks_tls() -> None:
    """The kubelet's gRPC probe has no TLS: with TLS on, startup and readiness are GET
    /readyz on the admin port (open without the admin token), with the same timings."""
    assert {"/healthz", "/readyz"} <= {getattr(route, "path", "") for route in probes.routes}
    assert {"/healthz", "/readyz"} <= PUBLIC_PATHS
    plain, tls = container(rendered("default")), container(rendered("auth-and-tls"))
    for probe in ("startupProbe", "readinessProbe"):
        assert "grpc" in plain[probe] and "httpGet" not in plain[probe]
        assert tls[probe]["httpGet"] == {"path": "/readyz", "port": "admin"}
        assert "grpc" not in tls[probe]
        without_check = {k: v for k, v in tls[probe].items() if k != "httpGet"}
        assert without_check == {k: v for k, v in plain[probe].items() if k != "grpc"}
    assert tls["livenessProbe"] == plain["livenessProbe"]
    tokens_only = container(render({"auth": AUTH_AND_TLS["auth"]}))
    assert tokens_only["readinessProbe"]["grpc"] == {"port": 50051, "service": SERVICE_NAME}


def test_services_and_network_policy_do_not_change_with_credentials() -> None:
    plain, secured = rendered("default"), rendered("auth-and-tls")
    for kind, suffix in (("NetworkPolicy", ""), ("Service", "-headless"),
                         ("Service", "-sssd-drafter")):  # fmt: skip
        assert one(secured, kind, suffix) == one(plain, kind, suffix), f"{kind} *{suffix}"


def dns_name_covers(pattern: str, host: str) -> bool:
    """TLS name matching (RFC 6125): a wildcard stands for exactly one leftmost label."""
    if pattern.startswith("*."):
        return "." in host and host.split(".", 1)[1] == pattern[2:]
    return host == pattern


def test_certificate_renders_only_with_cert_manager() -> None:
    for name in VALUE_SETS:
        kinds = [o["kind"] for o in rendered(name)]
        assert kinds.count("Certificate") == (name == MTLS_EXAMPLE), name


def test_certificate_covers_every_name_a_client_dials() -> None:
    """The Certificate writes the Secret the pods mount, and its DNS names cover the
    headless Service (the decode workers' target), each pod behind it, and the main
    Service, in their short and cluster-domain forms."""
    objects = rendered(MTLS_EXAMPLE)
    spec = one(objects, "Certificate")["spec"]
    assert spec["secretName"] == pod_volumes(objects)["tls"]["secret"]["secretName"]
    assert spec["issuerRef"] == {"name": "sssd-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert "server auth" in spec["usages"]
    statefulset = one(objects, "StatefulSet")
    headless = one(objects, "Service", "-headless")["metadata"]["name"]
    main = one(objects, "Service", "-sssd-drafter")["metadata"]["name"]
    pods = [f"{statefulset['metadata']['name']}-{i}.{headless}"
            for i in range(statefulset["spec"]["replicas"])]  # fmt: skip
    for host in [headless, main, *pods]:
        for dialled in (f"{host}.{NAMESPACE}.svc.cluster.local", f"{host}.{NAMESPACE}.svc"):
            if host in pods and dialled.endswith(".svc"):
                continue  # pods have cluster-domain names only
            assert any(dns_name_covers(p, dialled) for p in spec["dnsNames"]), dialled
    assert not any(dns_name_covers(p, f"other.{NAMESPACE}.svc.cluster.local")
                   for p in spec["dnsNames"])  # fmt: skip
    values = yaml.safe_load((CHART / "examples" / "mtls-cert-manager.yaml").read_text())
    values["tls"]["certManager"] |= {"clusterDomain": "k8s.internal",
                                     "extraDnsNames": ["drafter.llm"]}  # fmt: skip
    names = one(render(values), "Certificate")["spec"]["dnsNames"]
    assert f"{headless}.{NAMESPACE}.svc.k8s.internal" in names and names[-1] == "drafter.llm"


def test_tls_secret_mounts_the_client_ca_only_for_mutual_tls() -> None:
    items = pod_volumes(rendered("auth-and-tls"))["tls"]["secret"]["items"]
    assert [i["key"] for i in items] == ["tls.crt", "tls.key"]
    items = pod_volumes(rendered(MTLS_EXAMPLE))["tls"]["secret"]["items"]
    assert [i["key"] for i in items] == ["tls.crt", "tls.key", "ca.crt"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _issue(directory: Path, ca: Path | None, subject: str, extension: str) -> None:
    """A key and certificate as cert-manager writes them (tls.key, tls.crt, ca.crt);
    self-signed (a CA) without ``ca``."""
    directory.mkdir(parents=True)
    key, cert = directory / "tls.key", directory / "tls.crt"
    if ca is None:
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", subject,
                 "-keyout", str(key), "-out", str(cert))  # fmt: skip
        return
    (directory / "ext").write_text(extension + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key),
             "-out", str(directory / "csr"))  # fmt: skip
    _openssl("x509", "-req", "-in", str(directory / "csr"), "-CA", str(ca / "tls.crt"),
             "-CAkey", str(ca / "tls.key"), "-CAcreateserial", "-days", "2",
             "-extfile", str(directory / "ext"), "-out", str(cert))  # fmt: skip
    (directory / "ca.crt").write_bytes((ca / "tls.crt").read_bytes())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_mtls_example_configures_a_drafter_that_its_probes_and_clients_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`drafter serve` with the mtls example's credential variables, the files laid out as
    the pod mounts them: GET /readyz (the probe) answers 200 without a token once loaded,
    the kubelet's plaintext gRPC probe could not, and the plug-in with a client
    certificate from the same CA and its token drafts."""
    pod_root = tmp_path / "pod"
    secrets = {"drafter-ca": tmp_path / "ca", "client": tmp_path / "client"}
    _issue(secrets["drafter-ca"], None, "/CN=sssd-ca", "")
    _issue(tmp_path / "server", secrets["drafter-ca"], "/CN=drafter",
           "subjectAltName=IP:127.0.0.1")  # fmt: skip
    _issue(secrets["client"], secrets["drafter-ca"], "/CN=vllm-decode",
           "extendedKeyUsage=clientAuth")  # fmt: skip
    token = "vllm-decode-token-0123456789"
    contents = {"tokens": f"vllm-decode {token}\n".encode()} | {
        key: (tmp_path / "server" / key).read_bytes() for key in ("tls.crt", "tls.key", "ca.crt")
    }
    objects = rendered(MTLS_EXAMPLE)
    data = settings_map(objects)["data"]
    for name, (_, key) in credential_files(objects).items():
        in_pod = pod_root / data[ENV_PREFIX + name.upper()].lstrip("/")
        in_pod.parent.mkdir(parents=True, exist_ok=True)
        in_pod.write_bytes(contents[key])
        monkeypatch.setenv(ENV_PREFIX + name.upper(), str(in_pod))
    admin_port = _free_port()
    server = DrafterProcess(tmp_path / "data", "--admin-port", str(admin_port))
    try:
        readyz = f"http://127.0.0.1:{admin_port}/readyz"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(readyz, timeout=2) as answer:
                    assert answer.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "/readyz never answered 200"
                time.sleep(0.2)
        with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2
            )
        (secrets["client"] / "token").write_text(token + "\n")
        client = {name: str(secrets["client"] / name)
                  for name in ("token", "ca.crt", "tls.crt", "tls.key")}  # fmt: skip
        settings = DrafterSettings(
            address=server.target, deadline_ms=60_000, budget="4", token_file=client["token"],
            tls_ca_file=client["ca.crt"], tls_cert_file=client["tls.crt"],
            tls_key_file=client["tls.key"],
        )  # fmt: skip
        engine = EngineDrafter(settings)
        try:
            context = [10, 11, 12, 13, 10, 11, 12, 13]
            trees = engine.draft(["r1"], [len(context)], [len(context)],
                                 lambda row, a, b: context[a:b])  # fmt: skip
            assert trees[0] is not None and engine.stats.fallback_steps == 0
        finally:
            engine.close()
    finally:
        server.stop()


# --- memory from datastore bytes ---------------------------------------------------------

GIB, MIB = 1 << 30, 1 << 20


REQUEST_STATE_BYTES = 512 * MIB  # datastore.requestStateBytes' default


def expected_memory_mib(
    datastore_bytes: int,
    sub_index_tokens: int = 512_000_000,
    request_state_bytes: int = REQUEST_STATE_BYTES,
) -> str:
    """The README's formula: base 1 GiB + R + D + 2.05 x min(D, 8 x max_sub_index_tokens)."""
    total = (
        GIB + request_state_bytes + datastore_bytes
        + 2.05 * min(datastore_bytes, 8 * sub_index_tokens)
    )  # fmt: skip
    return f"{-(-total // MIB):.0f}Mi"


def memory_mib(objects: list[dict[str, Any]]) -> int:
    """The container's memory, request and limit alike, in MiB."""
    resources = container(objects)["resources"]
    memory = resources["requests"]["memory"]
    assert resources["limits"]["memory"] == memory and memory.endswith("Mi")
    return int(memory[:-2])


@pytest.mark.parametrize(
    ("values", "datastore_bytes", "sub_index_tokens"),
    [
        ({}, 0, 512_000_000),
        ({"datastore": {"expectedBytes": 32 * GIB}}, 32 * GIB, 512_000_000),
        ({"datastore": {"expectedBytes": 2 * GIB}}, 2 * GIB, 512_000_000),
        ({"datastore": {"expectedBytes": 32 * GIB},
          "settings": {"max_sub_index_tokens": 100_000_000}}, 32 * GIB, 100_000_000),
        ({"settings": {"max_resident_bytes": 8 * GIB}}, 8 * GIB, 512_000_000),
    ],
)  # fmt: skip
def test_memory_is_sized_from_datastore_bytes(
    values: dict[str, Any], datastore_bytes: int, sub_index_tokens: int
) -> None:
    objects = render(values)
    resources = container(objects)["resources"]
    memory = expected_memory_mib(datastore_bytes, sub_index_tokens)
    assert resources["requests"]["memory"] == memory
    assert resources["limits"]["memory"] == memory
    assert resources["requests"]["cpu"] == "4"
    bound = settings_map(objects)["data"].get("DRAFTER_MAX_RESIDENT_BYTES")
    assert bound == (str(datastore_bytes) if datastore_bytes else None)


def test_the_default_pod_memory_covers_base_and_request_states() -> None:
    """An empty datastore: 1 GiB of base plus the 512 MiB request-state budget, which the
    drafter gets as its bound (its own default, 4 GiB, would not fit)."""
    objects = render({})
    assert memory_mib(objects) == 1536
    data = settings_map(objects)["data"]
    assert data["DRAFTER_MAX_REQUEST_STATE_BYTES"] == str(REQUEST_STATE_BYTES)
    config = parsed_config([], data)
    assert config.max_request_state_bytes == REQUEST_STATE_BYTES


@pytest.mark.parametrize("datastore_bytes", [0, 32 * GIB])
def test_request_state_bytes_reach_the_drafter_and_the_pod_memory(datastore_bytes: int) -> None:
    """datastore.requestStateBytes is the drafter's request-state budget and is added to
    the pod's memory: raising it raises the memory limit by exactly as much."""
    base = {"datastore": {"expectedBytes": datastore_bytes}}
    before = memory_mib(render(base))
    for raised in (3 * GIB, 3 * GIB + 7 * MIB):
        objects = render({"datastore": {"expectedBytes": datastore_bytes,
                                        "requestStateBytes": raised}})  # fmt: skip
        data = settings_map(objects)["data"]
        assert data["DRAFTER_MAX_REQUEST_STATE_BYTES"] == str(raised)
        assert memory_mib(objects) - before == (raised - REQUEST_STATE_BYTES) // MIB
        assert container(objects)["resources"]["limits"]["memory"] == expected_memory_mib(
            datastore_bytes, request_state_bytes=raised
        )


def test_an_explicit_request_state_setting_wins() -> None:
    """settings.max_request_state_bytes, when set, is both the drafter's budget and the
    pod's share for request states; datastore.requestStateBytes is then ignored."""
    explicit = 2 * GIB
    for datastore in ({}, {"requestStateBytes": 6 * GIB}):
        objects = render({"settings": {"max_request_state_bytes": explicit},
                          "datastore": datastore})  # fmt: skip
        data = settings_map(objects)["data"]
        assert data["DRAFTER_MAX_REQUEST_STATE_BYTES"] == str(explicit)  # not 2.147483648e+09
        assert container(objects)["resources"]["limits"]["memory"] == expected_memory_mib(
            0, request_state_bytes=explicit
        )
    # The settings range leaves it out: one key in the ConfigMap (YAML would keep the last).
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render({"settings": {"max_request_state_bytes": explicit}},
                                 name=RELEASE, namespace=NAMESPACE)  # fmt: skip
    assert sum(t.count("DRAFTER_MAX_REQUEST_STATE_BYTES:") for t in manifests.values()) == 1
    # null: the datastore value again
    objects = render({"settings": {"max_request_state_bytes": None}})
    assert settings_map(objects)["data"]["DRAFTER_MAX_REQUEST_STATE_BYTES"] == str(
        REQUEST_STATE_BYTES
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"datastore": {"requestStateBytes": 1024}}, "/datastore/requestStateBytes"),
        ({"datastore": {"requestStateBytes": "512Mi"}}, "/datastore/requestStateBytes"),
        ({"settings": {"max_request_state_bytes": 1024}}, "/settings/max_request_state_bytes"),
    ],
)
def test_request_state_bytes_are_checked_by_the_schema(
    values: dict[str, Any], message: str
) -> None:
    """Below the drafter's own minimum (1 MiB) or not a number: refused at render time."""
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    assert message in str(caught.value)


def test_explicit_memory_wins() -> None:
    values = {
        "datastore": {"expectedBytes": 32 * GIB},
        "resources": {"requests": {"memory": "10Gi"}, "limits": {"memory": "12Gi"}},
    }
    resources = container(render(values))["resources"]
    assert resources["requests"]["memory"] == "10Gi" and resources["limits"]["memory"] == "12Gi"


# --- monitoring objects -------------------------------------------------------------------


def test_the_chart_holds_the_one_copy_of_dashboards_and_alerts(tmp_path: Path) -> None:
    """Helm reads only files inside a chart, so files/ is the one copy of the dashboards
    and alert rules that the other tests check: Helm loads and packages exactly these
    (their promtool unit tests left out by .helmignore), the unit tests and
    deploy/local-run.sh use the same rule file, and deploy/ keeps no copy."""
    shipped = {str(p.relative_to(CHART)): p.read_text() for p in [ALERTS, *DASHBOARDS]}
    with helm.Chart.load(CHART) as chart:
        loaded = {f["name"]: f["data"] for f in chart.files if f["name"].startswith("files/")}
    assert loaded == shipped
    with tarfile.open(helm.package(CHART, destination=tmp_path)) as archive:
        packaged = {name.removeprefix(f"{CHART.name}/") for name in archive.getnames()}
    assert {name for name in packaged if name.startswith("files/")} == set(shipped)
    assert yaml.safe_load(ALERTS_TEST.read_text())["rule_files"] == [ALERTS.name]
    assert str(ALERTS.relative_to(ROOT)) in (ROOT / "deploy" / "local-run.sh").read_text()
    names = {p.name for p in [ALERTS, ALERTS_TEST, *DASHBOARDS]}
    assert [p for p in (ROOT / "deploy").rglob("*") if p.name in names] == []


def test_dashboard_configmaps() -> None:
    maps = [o for o in rendered("everything-on") if o["kind"] == "ConfigMap" and
            o["metadata"]["labels"].get("grafana_dashboard") == "1"]  # fmt: skip
    assert len(maps) == len(DASHBOARDS)
    contents = {key: text for m in maps for key, text in m["data"].items()}
    for path in DASHBOARDS:
        assert contents[path.name] == path.read_text().rstrip("\n")
    folder = render({"grafanaDashboards": {"enabled": True, "folder": "LLM"}})
    annotations = [o["metadata"].get("annotations") for o in folder if o["kind"] == "ConfigMap"]
    assert {"grafana_folder": "LLM"} in annotations


def prometheus_rule(values: dict[str, Any]) -> dict[str, Any]:
    return one(render({"prometheusRule": {"enabled": True, **values}}), "PrometheusRule")


def test_prometheus_rule_carries_the_alert_file() -> None:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert prometheus_rule({})["spec"]["groups"] == groups


def test_prometheus_rule_thresholds_are_substituted() -> None:
    thresholds = {
        "acceptanceDropRatio": 0.5, "acceptanceFloor": 1.4, "drafterDeadlineSeconds": 0.005,
        "fallbackRatio": 0.1, "snapshotMaxAgeSeconds": 7200,
    }  # fmt: skip
    rule = prometheus_rule({"thresholds": thresholds})
    exprs = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    originals = {r["alert"]: r["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"]
                 for r in g["rules"]}  # fmt: skip
    replaced = {
        "SSSDAcceptanceCollapse": ("< 0.7 *", "< 0.5 *"),
        "SSSDAcceptanceLow": ("< 1.2", "< 1.4"),
        "SSSDDrafterP99OverDeadline": ("> 0.003", "> 0.005"),
        "SSSDDrafterFallbackRateHigh": ("> 0.05", "> 0.1"),
        "SSSDDrafterSnapshotTooOld": ("> 3600", "> 7200"),
    }
    for alert, expr in exprs.items():
        if alert in replaced:
            old, new = replaced[alert]
            assert old not in expr and new in expr, alert
            assert expr == originals[alert].replace(old, new)
        else:
            assert expr == originals[alert]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_rule_with_changed_thresholds_is_valid(tmp_path: Path) -> None:
    rule = prometheus_rule({"thresholds": {
        "acceptanceDropRatio": 0.5, "acceptanceFloor": 1.4, "drafterDeadlineSeconds": 0.0025,
        "fallbackRatio": 0.1, "snapshotMaxAgeSeconds": 86400}})  # fmt: skip
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run(
        ["promtool", "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("> 86400" in e for e in exprs) and any("> 0.0025" in e for e in exprs)


def test_service_monitor_scrapes_the_main_service_only() -> None:
    objects = rendered("everything-on")
    monitor = one(objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [o for o in objects if o["kind"] == "Service"]
    matching = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in matching] == [f"{RELEASE}-sssd-drafter"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_network_policy() -> None:
    objects = rendered("default")
    policy = one(objects, "NetworkPolicy")["spec"]
    port_names = {p["name"] for p in container(objects)["ports"]}
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in policy["ingress"]}
    assert set(by_port) == port_names
    assert by_port["grpc"] == [{"podSelector": {"matchLabels": {"sssd.io/drafter-client": "true"}}}]
    assert by_port["metrics"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    closed = one(render({"networkPolicy": {"admin": {"from": []}}}), "NetworkPolicy")["spec"]
    assert "admin" not in {rule["ports"][0]["port"] for rule in closed["ingress"]}


# --- several replicas: the shared log and snapshot bootstrap ------------------------------

SHARED_LOG_EXAMPLE = "example-replicas-shared-log"
REDIS = "redis-master.llm.svc.cluster.local:6379"
SHARED_LOG_FIELDS = ("shared_log", "shared_log_password_file", "shared_log_prefix",
                     "shared_log_retention", "bootstrap_peers")  # fmt: skip
"""The `drafter serve` settings the chart sets from `sharedLog`."""


def shared_log_settings(objects: list[dict[str, Any]], fullname: str = "") -> dict[str, str]:
    """The shared-log variables of the settings ConfigMap (named ``fullname``, if given)."""
    configmap = one(objects, "ConfigMap", fullname) if fullname else settings_map(objects)
    data: dict[str, str] = configmap["data"]
    names = {ENV_PREFIX + field.upper() for field in SHARED_LOG_FIELDS}
    return {key: value for key, value in data.items() if key in names}


def admin_peers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every NetworkPolicy peer admitted on the admin port."""
    rules = one(objects, "NetworkPolicy")["spec"]["ingress"]
    return [peer for rule in rules if [p["port"] for p in rule["ports"]] == ["admin"]
            for peer in rule["from"]]  # fmt: skip


def other_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The NetworkPolicy's ingress rules for every port but the admin port."""
    rules: list[dict[str, Any]] = one(objects, "NetworkPolicy")["spec"]["ingress"]
    return [rule for rule in rules if [p["port"] for p in rule["ports"]] != ["admin"]]


def own_pods_on_admin_port(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The admin-port peers that select the drafter's own pods (within the namespace)."""
    pod_labels = one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    return [peer for peer in admin_peers(objects) if set(peer) == {"podSelector"}
            and peer["podSelector"]["matchLabels"].items() <= pod_labels.items()]  # fmt: skip


def test_one_replica_learns_alone_by_default() -> None:
    objects = rendered("default")
    assert one(objects, "StatefulSet")["spec"]["replicas"] == 1
    assert shared_log_settings(objects) == {}
    assert "redis-password" not in pod_volumes(objects)
    assert own_pods_on_admin_port(objects) == []


@pytest.mark.parametrize(
    "values",
    [{"replicaCount": 2}, {"replicaCount": 3, "sharedLog": {"redis": {"address": ""}}},
     {"autoscaling": {"enabled": True}},
     {"autoscaling": {"enabled": True}, "sharedLog": {"allowIsolatedReplicas": False}}],
)  # fmt: skip
def test_several_replicas_without_a_shared_log_are_refused(
    values: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    assert "/sharedLog/redis/address" in str(caught.value)
    # Where the schema is skipped (helm --skip-schema-validation), the template refuses
    # too, naming the remedy: the chart without its schema fails to render.
    unchecked = tmp_path / CHART.name
    shutil.copytree(CHART, unchecked)
    (unchecked / "values.schema.json").unlink()
    with helm.Chart.load(unchecked) as chart, pytest.raises(helm.HelmRenderError) as refused:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert "sharedLog.redis.address" in str(refused.value)
    assert "sharedLog.allowIsolatedReplicas" in str(refused.value)
    with helm.Chart.load(unchecked) as chart:
        allowed = chart.render({**values, "sharedLog": {"allowIsolatedReplicas": True}},
                               name=RELEASE, namespace=NAMESPACE)  # fmt: skip
    assert any(path.endswith("statefulset.yaml") for path in allowed)


def test_isolated_replicas_are_an_explicit_opt_out() -> None:
    objects = render({"replicaCount": 3, "sharedLog": {"allowIsolatedReplicas": True}})
    assert one(objects, "StatefulSet")["spec"]["replicas"] == 3
    assert shared_log_settings(objects) == {}
    assert own_pods_on_admin_port(objects) == []
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    with helm.Chart.load(CHART) as chart:
        notes = chart.render({"replicaCount": 3, "sharedLog": {"allowIsolatedReplicas": True}},
                             name=RELEASE, namespace=NAMESPACE)  # fmt: skip
    assert "allowIsolatedReplicas" in next(t for p, t in notes.items() if p.endswith("NOTES.txt"))


def test_shared_log_settings_reach_every_replica() -> None:
    """The example's three replicas get the Redis URL, the stream prefix (the release's
    full name), the retention, the password as a file of the named Secret, and their
    peers' admin API behind the headless Service."""
    objects = rendered(SHARED_LOG_EXAMPLE)
    headless = one(objects, "Service", "-headless")["metadata"]["name"]
    assert one(objects, "StatefulSet")["spec"]["replicas"] == 3
    password_file = "/var/run/secrets/sssd-drafter-redis/password"
    assert shared_log_settings(objects) == {
        "DRAFTER_SHARED_LOG": f"redis://{REDIS}/0",
        "DRAFTER_SHARED_LOG_PREFIX": f"{RELEASE}-sssd-drafter",
        "DRAFTER_SHARED_LOG_RETENTION": "1000000",
        "DRAFTER_SHARED_LOG_PASSWORD_FILE": password_file,
        "DRAFTER_BOOTSTRAP_PEERS": f"http://{headless}.{NAMESPACE}.svc.cluster.local:8400",
    }
    assert secret_file(objects, password_file) == ("redis", "redis-password")
    assert pod_volumes(objects)["redis-password"]["secret"]["defaultMode"] == 0o440
    # The peers are called with the admin token every replica mounts from one Secret.
    admin_token = settings_map(objects)["data"]["DRAFTER_ADMIN_TOKEN_FILE"]
    assert secret_file(objects, admin_token) == (f"{RELEASE}-sssd-drafter-admin", "admin-token")


def test_shared_log_settings_follow_the_values() -> None:
    base = {"replicaCount": 2, "sharedLog": {"redis": {"address": "10.0.0.7:6380"}}}
    settings = shared_log_settings(render(base))
    assert settings["DRAFTER_SHARED_LOG"] == "redis://10.0.0.7:6380/0"
    assert "DRAFTER_SHARED_LOG_PASSWORD_FILE" not in settings
    assert "redis-password" not in pod_volumes(render(base))
    # The prefix defaults to the full name, so two releases on one Redis keep apart.
    renamed = shared_log_settings(render({**base, "fullnameOverride": "tier-b"}), "tier-b")
    assert renamed["DRAFTER_SHARED_LOG_PREFIX"] == "tier-b"
    assert renamed["DRAFTER_BOOTSTRAP_PEERS"] == (
        f"http://tier-b-headless.{NAMESPACE}.svc.cluster.local:8400"
    )
    changed = {
        "replicaCount": 2,
        "ports": {"grpc": 50051, "metrics": 9400, "admin": 9000},
        "sharedLog": {"redis": {"address": "[fd00::7]:6379", "tls": True, "db": 3},
                      "prefix": "shared-a", "retention": 0,
                      "bootstrap": {"clusterDomain": "k8s.internal"}},
    }  # fmt: skip
    settings = shared_log_settings(render(changed))
    assert settings == {
        "DRAFTER_SHARED_LOG": "rediss://[fd00::7]:6379/3",
        "DRAFTER_SHARED_LOG_PREFIX": "shared-a",
        "DRAFTER_SHARED_LOG_RETENTION": "0",
        "DRAFTER_BOOTSTRAP_PEERS": f"http://{RELEASE}-sssd-drafter-headless.{NAMESPACE}"
                                   ".svc.k8s.internal:9000",
    }  # fmt: skip


def test_network_policy_admits_the_peers_on_the_admin_port_only_for_bootstrap() -> None:
    objects = rendered(SHARED_LOG_EXAMPLE)
    (own,) = own_pods_on_admin_port(objects)
    assert "namespaceSelector" not in own  # the release's namespace only
    policy = one(objects, "NetworkPolicy")["spec"]
    # Egress stays open: the replicas reach Redis and each other's admin port.
    assert policy["policyTypes"] == ["Ingress"]
    # The operators' admin peers and the other ports are as without the shared log.
    plain = render({"replicaCount": 3, "sharedLog": {"allowIsolatedReplicas": True}})
    assert [p for p in admin_peers(objects) if p is not own] == admin_peers(plain)
    assert other_rules(objects) == other_rules(plain)
    without_bootstrap = render({"replicaCount": 2, "sharedLog": {
        "redis": {"address": REDIS}, "bootstrap": {"fromPeers": False}}})  # fmt: skip
    assert own_pods_on_admin_port(without_bootstrap) == []
    settings = shared_log_settings(without_bootstrap)
    assert "DRAFTER_BOOTSTRAP_PEERS" not in settings and "DRAFTER_SHARED_LOG" in settings


def test_autoscaled_replicas_share_the_log_and_scale_down_slowly() -> None:
    objects = rendered("everything-on")
    assert shared_log_settings(objects)["DRAFTER_SHARED_LOG"] == f"redis://{REDIS}/0"
    autoscaler = one(objects, "HorizontalPodAutoscaler")["spec"]
    assert autoscaler["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert autoscaler["minReplicas"] >= 2 and "replicas" not in one(objects, "StatefulSet")["spec"]
    # Scaled-down replicas keep their volumes: a later scale-up resumes from its snapshot.
    retention = one(objects, "StatefulSet")["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert retention["whenScaled"] == "Retain"


def test_shared_log_variables_are_drafter_settings() -> None:
    """`drafter serve` reads the chart's shared-log variables as the values set."""
    assert set(SHARED_LOG_FIELDS) <= set(ServeConfig.model_fields)
    objects = rendered(SHARED_LOG_EXAMPLE)
    config = parsed_config([], settings_map(objects)["data"])
    headless = one(objects, "Service", "-headless")["metadata"]["name"]
    assert config.shared_log == f"redis://{REDIS}/0"
    assert config.shared_log_prefix == f"{RELEASE}-sssd-drafter"
    assert config.shared_log_retention == 1_000_000
    password_file = Path("/var/run/secrets/sssd-drafter-redis/password")
    assert config.shared_log_password_file == password_file
    assert config.bootstrap_peers == (f"http://{headless}.{NAMESPACE}.svc.cluster.local:8400",)
    shared_log = config.shared_log_config()
    assert shared_log is not None and shared_log.prefix == f"{RELEASE}-sssd-drafter"
