"""Rules the rendered manifests must keep that no schema can express (make deploy-check;
tests/contract/test_deploy_rules.py). Each rule takes one overlay's rendered documents and
returns its problems, one line each (empty: kept)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import yaml

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


def quantity_bytes(value: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, factor in units.items():
        if str(value).endswith(suffix):
            return float(str(value).removesuffix(suffix)) * factor
    return float(value)


def quantity_cpus(value: str | int | float) -> float:
    text = str(value)
    return float(text.removesuffix("m")) / 1000 if text.endswith("m") else float(text)


def named(docs: list[Manifest], kind: str, name: str) -> Manifest | None:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found[0] if found else None


def _envoy(docs: list[Manifest]) -> tuple[Manifest, Manifest] | None:
    """The edge's Envoy container and the Envoy config its template ConfigMap holds."""
    edge = named(docs, "Deployment", "edge")
    if edge is None:
        return None
    [container] = [
        c for c in edge["spec"]["template"]["spec"]["containers"] if c["name"] == "envoy"
    ]
    [template] = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("edge-envoy-template")
    ]
    config: Manifest = yaml.safe_load(template["data"]["envoy.yaml"])
    return container, config


HEAP_SHARE = (0.5, 0.85)


def envoy_heap_fits_its_memory_limit(docs: list[Manifest]) -> list[str]:
    """The overload manager's heap must be most of the container's memory limit, not more:
    above it the kernel kills Envoy before the manager sheds a request; far below it the
    edge refuses work it had room for."""
    found = _envoy(docs)
    if found is None:
        return []
    container, config = found
    monitors = config.get("overload_manager", {}).get("resource_monitors", [])
    heaps = [
        m["typed_config"]["max_heap_size_bytes"]
        for m in monitors
        if m["name"] == "envoy.resource_monitors.fixed_heap"
    ]
    if not heaps:
        return ["edge: the overload manager has no fixed_heap monitor"]
    limit = quantity_bytes(container["resources"]["limits"]["memory"])
    share = heaps[0] / limit
    low, high = HEAP_SHARE
    if not low <= share <= high:
        return [
            f"edge: the overload manager's heap ({heaps[0]} bytes) is {share:.0%} of the "
            f"container's memory limit ({container['resources']['limits']['memory']}); "
            f"keep it within {low:.0%}-{high:.0%}"
        ]
    return []


def envoy_workers_match_its_cpu_limit(docs: list[Manifest]) -> list[str]:
    """Envoy starts a worker per core of the node unless told: under a CPU quota the extra
    workers only contend. --concurrency must be the limit's CPUs (rounded up)."""
    found = _envoy(docs)
    if found is None:
        return []
    container, _ = found
    args = [str(a) for a in container.get("args", [])]
    wanted = math.ceil(quantity_cpus(container["resources"]["limits"]["cpu"]))
    if "--concurrency" not in args:
        return [f"edge: Envoy runs without --concurrency (the CPU limit allows {wanted})"]
    given = int(args[args.index("--concurrency") + 1])
    if given != wanted:
        return [f"edge: --concurrency {given}, but the CPU limit is {wanted}"]
    return []


HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
# Sent to by nodes (externalTrafficPolicy: Local): its replicas must be on distinct nodes.
HARD_SPREAD = ("edge",)


def _selects_itself(constraint: Manifest, labels: dict[str, str]) -> bool:
    selector = constraint.get("labelSelector", {})
    matched = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    own = "app.kubernetes.io/name" in constraint.get("matchLabelKeys", []) or (
        selector.get("matchLabels", {}).get("app.kubernetes.io/name")
        == labels.get("app.kubernetes.io/name")
    )
    return bool(selector) and matched and own


def deployments_spread_over_nodes_and_zones(docs: list[Manifest]) -> list[str]:
    """Each Deployment's own pods spread over nodes and zones (a constraint that selects
    them and no other workload's); the edge's over nodes is hard."""
    problems = []
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        name = doc["metadata"]["name"]
        labels = doc["spec"]["template"]["metadata"].get("labels", {})
        constraints = doc["spec"]["template"]["spec"].get("topologySpreadConstraints", [])
        by_key = {c["topologyKey"]: c for c in constraints if _selects_itself(c, labels)}
        for key in (HOSTNAME, ZONE):
            if key not in by_key:
                problems.append(f"Deployment/{name}: its pods are not spread over {key}")
        if name in HARD_SPREAD and by_key.get(HOSTNAME, {}).get("whenUnsatisfiable") != (
            "DoNotSchedule"
        ):
            problems.append(
                f"Deployment/{name}: behind externalTrafficPolicy: Local its spread over "
                "nodes must be DoNotSchedule"
            )
    return problems


# How long a cloud load balancer in front of externalTrafficPolicy: Local may keep sending
# new connections to a node after its pod starts to stop (health check interval times its
# unhealthy threshold: 10-30 s on the common clouds).
LOAD_BALANCER_DEREGISTRATION_SECONDS = 30
_SLEEP = re.compile(r"time\.sleep\((\d+(?:\.\d+)?)\)")


def edge_keeps_accepting_until_load_balancers_deregister_it(docs: list[Manifest]) -> list[str]:
    """The edge's preStop fails its health first, then keeps its listeners open for the load
    balancers' deregistration time, and only then drains them: draining at once refuses
    the connections a balancer still sends there. Its grace period holds both waits."""
    edge = named(docs, "Deployment", "edge")
    if edge is None:
        return []
    pod = edge["spec"]["template"]["spec"]
    [envoy] = [c for c in pod["containers"] if c["name"] == "envoy"]
    hook = " ".join(
        envoy.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    )
    fail, drain = hook.find("/healthcheck/fail"), hook.find("/drain_listeners")
    if fail < 0 or drain < 0 or fail > drain:
        return ["edge: preStop must fail the health check, then drain the listeners"]
    waited = sum(float(m.group(1)) for m in _SLEEP.finditer(hook[fail:drain]))
    problems = []
    if waited < LOAD_BALANCER_DEREGISTRATION_SECONDS:
        problems.append(
            f"edge: preStop drains the listeners {waited:.0f} s after failing its health "
            f"check; load balancers take up to {LOAD_BALANCER_DEREGISTRATION_SECONDS} s to stop "
            "sending new connections"
        )
    total = sum(float(m.group(1)) for m in _SLEEP.finditer(hook))
    grace = float(pod.get("terminationGracePeriodSeconds", 30))
    if grace < total + 5:
        problems.append(f"edge: a {grace:.0f} s grace period cannot hold a {total:.0f} s preStop")
    return problems


def _scalers(docs: list[Manifest]) -> dict[str, Manifest]:
    """Each autoscaled Deployment's HPA or KEDA ScaledObject, by the Deployment's name."""
    scalers = {}
    for doc in docs:
        if doc["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
            scalers[doc["spec"]["scaleTargetRef"]["name"]] = doc
    return scalers


def most_replicas(docs: list[Manifest], deployment: Manifest) -> int:
    """What its autoscaler may scale it to (its replicas when none does)."""
    scaler = _scalers(docs).get(deployment["metadata"]["name"])
    if scaler is None:
        return int(deployment["spec"].get("replicas", 1))
    key = "maxReplicas" if scaler["kind"] == "HorizontalPodAutoscaler" else "maxReplicaCount"
    return int(scaler["spec"][key])


# Scaled on their open streams (besides CPU): the figure a notify replica is planned by.
STREAM_SCALED = {"notify": "atelier_notify_open_streams"}


def every_deployment_autoscales(docs: list[Manifest]) -> list[str]:
    """Every Deployment follows its load: an HPA (or KEDA's, for the workers); notify's
    counts its open streams."""
    scalers = _scalers(docs)
    problems = []
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        name = doc["metadata"]["name"]
        scaler = scalers.get(name)
        if scaler is None:
            problems.append(f"Deployment/{name}: nothing scales it")
            continue
        if name in STREAM_SCALED:
            metrics = {
                m.get("pods", {}).get("metric", {}).get("name")
                for m in scaler["spec"].get("metrics", [])
            }
            if STREAM_SCALED[name] not in metrics:
                problems.append(f"Deployment/{name}: its autoscaler ignores {STREAM_SCALED[name]}")
    return problems


# The PostgreSQL the manifests are written for when they carry none (a managed one):
# max_connections less those kept for superusers and operators (psql, backups, the
# migration Job while a rollout runs). With the data tier's CloudNativePG Cluster the
# figures are its own (max_connections, superuser_reserved_connections and
# reserved_connections).
POSTGRES_MAX_CONNECTIONS = 500
POSTGRES_RESERVED_CONNECTIONS = 10


def postgres_connections(docs: list[Manifest]) -> tuple[int, int, str]:
    """(max_connections, those reserved, where the figures come from)."""
    clusters = [d for d in docs if d["kind"] == "Cluster" and "cnpg.io" in d["apiVersion"]]
    if not clusters:
        return POSTGRES_MAX_CONNECTIONS, POSTGRES_RESERVED_CONNECTIONS, "the stated budget"
    [cluster] = clusters
    parameters = cluster["spec"].get("postgresql", {}).get("parameters", {})
    most = int(parameters.get("max_connections", 100))  # PostgreSQL's default
    reserved = int(parameters.get("superuser_reserved_connections", 3)) + int(
        parameters.get("reserved_connections", 0)
    )
    return most, reserved, f"Cluster/{cluster['metadata']['name']}"


DEFAULT_POOL_SIZE = 20  # services/kit/settings.py, ATELIER_DB_POOL_SIZE
# The LISTEN connections a process holds beside its pool (services/kit/listen.py users):
# creation's relay and webhook deliverer in every role, the worker loop in the worker
# role, the API's waits (WaitJob) in the api role.
LISTENS = {("creation", "api"): 3, ("creation", "worker"): 3, ("creation", "all"): 4}


def _connections_per_replica(container: Manifest) -> int | None:
    """Pool + LISTEN connections of one replica, or None for a process with no database."""
    env = {v["name"]: v.get("value") for v in container.get("env", [])}
    if "ATELIER_DATABASE_URL" not in env:
        return None
    args = [str(a) for a in container.get("args", [])]
    if args[:1] != ["serve"]:
        return None
    role = args[args.index("--role") + 1] if "--role" in args else "all"
    pool = int(env.get("ATELIER_DB_POOL_SIZE") or DEFAULT_POOL_SIZE)
    return pool + LISTENS.get((args[1], role), 0)


def connection_budget(docs: list[Manifest]) -> tuple[int, list[str]]:
    """The most connections the Deployments may open (each at its most replicas), with the
    sum's terms."""
    total, terms = 0, []
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            each = _connections_per_replica(container)
            if each is None:
                continue
            replicas = most_replicas(docs, doc)
            total += replicas * each
            terms.append(f"{doc['metadata']['name']} {replicas} x {each}")
    # KEDA's queue query (one connection) while it polls.
    if any(d["kind"] == "ScaledObject" for d in docs):
        total += 1
        terms.append("KEDA 1")
    return total, terms


def postgres_connections_fit_the_budget(docs: list[Manifest]) -> list[str]:
    """Every role's pool is set in the manifests, and all replicas at their most, pools
    and LISTEN connections included, fit in the database's connections."""
    problems = []
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            env = {v["name"] for v in container.get("env", [])}
            if "ATELIER_DATABASE_URL" in env and "ATELIER_DB_POOL_SIZE" not in env:
                problems.append(
                    f"Deployment/{doc['metadata']['name']}: no ATELIER_DB_POOL_SIZE (the "
                    f"default {DEFAULT_POOL_SIZE} is sized for no role)"
                )
    total, terms = connection_budget(docs)
    most, reserved, source = postgres_connections(docs)
    allowed = most - reserved
    if total > allowed:
        problems.append(
            f"PostgreSQL: up to {total} connections ({' + '.join(terms)}) exceed the "
            f"{allowed} a max_connections of {most} leaves ({source})"
        )
    return problems


# The container port each Deployment serves Prometheus text on (services/kit/settings.py's
# <SERVICE>_METRICS_PORT; the edge's monitoring listener in front of Envoy's stats).
METRICS_PORT_NAME = {"edge": "monitoring"}
DEFAULT_METRICS_PORT_NAME = "metrics"


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def every_deployment_is_scraped(docs: list[Manifest]) -> list[str]:
    """Each Deployment names its metrics port on its container, a Service selecting its
    pods carries that port, and a ServiceMonitor (or a PodMonitor on the pods) scrapes
    it: a port missing anywhere on the way is a role Prometheus never sees."""
    problems = []
    services = [d for d in docs if d["kind"] == "Service"]
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    pod_monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        name = doc["metadata"]["name"]
        port_name = METRICS_PORT_NAME.get(name, DEFAULT_METRICS_PORT_NAME)
        template = doc["spec"]["template"]
        labels = template["metadata"].get("labels", {})
        container = template["spec"]["containers"][0]
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if port_name not in ports:
            problems.append(f"Deployment/{name}: no container port named {port_name}")
            continue
        scraped = any(
            _selects(m["spec"]["selector"].get("matchLabels", {}), labels)
            and any(e.get("port") == port_name for e in m["spec"].get("podMetricsEndpoints", []))
            for m in pod_monitors
        )
        for service in services:
            if not _selects(service["spec"].get("selector", {}), labels):
                continue
            service_labels = service["metadata"].get("labels", {})
            for port in service["spec"].get("ports", []):
                if port.get("targetPort") not in (port_name, ports[port_name]):
                    continue
                scraped = scraped or any(
                    _selects(m["spec"]["selector"].get("matchLabels", {}), service_labels)
                    and any(e.get("port") == port.get("name") for e in m["spec"]["endpoints"])
                    for m in monitors
                )
        if not scraped:
            problems.append(
                f"Deployment/{name}: no ServiceMonitor scrapes its {port_name} port "
                f"({ports[port_name]}) through a Service (nor a PodMonitor on its pods)"
            )
    return problems


RULES: tuple[Rule, ...] = (
    hooks_read_only_what_exists_before_the_sync,
    envoy_heap_fits_its_memory_limit,
    envoy_workers_match_its_cpu_limit,
    deployments_spread_over_nodes_and_zones,
    edge_keeps_accepting_until_load_balancers_deregister_it,
    every_deployment_autoscales,
    postgres_connections_fit_the_budget,
    every_deployment_is_scraped,
)


def problems(docs: list[Manifest]) -> list[str]:
    return [problem for rule in RULES for problem in rule(docs)]
