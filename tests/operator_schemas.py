"""JSON schemas for the operator objects the chart and deploy/ render: the Prometheus
Operator's (monitoring.coreos.com/v1 ServiceMonitor, PodMonitor, PrometheusRule) and
cert-manager's (cert-manager.io/v1 Certificate).

kubernetes-validate bundles only built-in kinds. These schemas cover the fields we use,
with the operator CRDs' types, and reject unknown fields where we set them, so that a
typo in a template fails a test instead of being dropped by the API server.
"""

from __future__ import annotations

from typing import Any

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?"
             r"(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}  # fmt: skip
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
}
_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
    "additionalProperties": False,
}
_ENDPOINT = {
    "type": "object",
    "required": ["port"],
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
    },
    "additionalProperties": False,
}


def _object(
    kind: str, spec: dict[str, Any], api_version: str = "monitoring.coreos.com/v1"
) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


_RULE = {
    "type": "object",
    "required": ["expr"],
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string", "minLength": 1},
        "record": {"type": "string", "minLength": 1},
        "expr": {"type": "string", "minLength": 1},
        "for": _DURATION,
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
}

# cert-manager's Certificate (the CRD's v1 types): Go durations, its key usages, and
# the DNS names a certificate may carry (a wildcard only as the whole first label).
_GO_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_NAME = {"type": "string", "maxLength": 253, "pattern": rf"^(\*\.)?{_LABEL}(\.{_LABEL})*$"}
_KEY_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime",
    "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
]  # fmt: skip
_CERTIFICATE_SPEC = {
    "type": "object",
    "required": ["secretName", "issuerRef"],
    "properties": {
        "secretName": _METADATA["properties"]["name"],
        "secretTemplate": {
            "type": "object",
            "properties": {"labels": _STRING_MAP, "annotations": _STRING_MAP},
            "additionalProperties": False,
        },
        "issuerRef": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "kind": {"type": "string"},
                "group": {"type": "string"},
            },
            "additionalProperties": False,
        },
        "commonName": {"type": "string", "maxLength": 64},
        "dnsNames": {"type": "array", "minItems": 1, "items": _DNS_NAME},
        "duration": _GO_DURATION,
        "renewBefore": _GO_DURATION,
        "privateKey": {
            "type": "object",
            "properties": {
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                "encoding": {"enum": ["PKCS1", "PKCS8"]},
                "size": {"type": "integer"},
                "rotationPolicy": {"enum": ["Never", "Always"]},
            },
            "additionalProperties": False,
        },
        "usages": {"type": "array", "items": {"enum": _KEY_USAGES}},
    },
    "additionalProperties": False,
}

OPERATOR_SCHEMAS: dict[str, dict[str, Any]] = {
    "Certificate": _object("Certificate", _CERTIFICATE_SPEC, "cert-manager.io/v1"),
    "ServiceMonitor": _object("ServiceMonitor", {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": _SELECTOR,
            "namespaceSelector": {
                "type": "object",
                "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                },
                "additionalProperties": False,
            },
            "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
        },
        "additionalProperties": False,
    }),
    "PodMonitor": _object("PodMonitor", {
        "type": "object",
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": _SELECTOR,
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
        },
        "additionalProperties": False,
    }),
    "PrometheusRule": _object("PrometheusRule", {
        "type": "object",
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": _DURATION,
                        "rules": {"type": "array", "minItems": 1, "items": _RULE},
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    }),
}  # fmt: skip
