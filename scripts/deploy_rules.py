"""Rules the rendered manifests must keep that no schema can express (make deploy-check;
tests/contract/test_deploy_rules.py). Each rule takes one overlay's rendered documents and
returns its problems, one line each (empty: kept)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Manifest = dict[str, Any]
Rule = Callable[[list[Manifest]], list[str]]

HOOK = "argocd.argoproj.io/hook"
EARLY_HOOKS = ("PreSync", "SyncFail")


def _where(doc: Manifest) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def pod_spec(doc: Manifest) -> Manifest | None:
    if doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        spec: Manifest = doc["spec"]["template"]["spec"]
        return spec
    return None


def _references(spec: Manifest) -> Iterator[tuple[str, str]]:
    """(kind, name) of every ConfigMap and Secret a pod spec reads."""
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    for container in containers:
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                yield "ConfigMap", source["configMapRef"]["name"]
            if "secretRef" in source:
                yield "Secret", source["secretRef"]["name"]
        for variable in container.get("env", []):
            reference = variable.get("valueFrom", {})
            if "configMapKeyRef" in reference:
                yield "ConfigMap", reference["configMapKeyRef"]["name"]
            if "secretKeyRef" in reference:
                yield "Secret", reference["secretKeyRef"]["name"]
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"]
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"]


def hooks_read_only_what_exists_before_the_sync(docs: list[Manifest]) -> list[str]:
    """An Argo CD PreSync hook runs before the sync applies anything: a ConfigMap or Secret
    it reads must not be one the same sync creates (it would not exist yet on a first sync,
    nor, with a generated hashed name, after any change)."""
    applied_by_the_sync = {
        (doc["kind"], doc["metadata"]["name"])
        for doc in docs
        if HOOK not in doc["metadata"].get("annotations", {})
    }
    problems = []
    for doc in docs:
        hook = doc["metadata"].get("annotations", {}).get(HOOK)
        spec = pod_spec(doc)
        if hook not in EARLY_HOOKS or spec is None:
            continue
        for kind, name in sorted(set(_references(spec))):
            if (kind, name) in applied_by_the_sync:
                problems.append(
                    f"{_where(doc)}: a {hook} hook reads {kind}/{name}, which the sync itself "
                    "applies only after its hooks"
                )
    return problems


RULES: tuple[Rule, ...] = (hooks_read_only_what_exists_before_the_sync,)


def problems(docs: list[Manifest]) -> list[str]:
    return [problem for rule in RULES for problem in rule(docs)]
