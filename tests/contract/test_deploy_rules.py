"""scripts/deploy_rules.py on the rendered overlays: each rule holds for what we ship, and
refuses the defect it was written for (the manifests as they were before its fix)."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import deploy_check, deploy_rules, prometheus_rule
from services.kit.settings import DEFAULT_PORTS

Manifest = dict[str, Any]


@pytest.fixture(scope="module", params=deploy_check.OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on the PATH: the kustomizations cannot be rendered here")
    return deploy_check.render(request.param)


def named(docs: list[Manifest], kind: str, name: str) -> Manifest:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def settings_map(docs: list[Manifest]) -> str:
    [name] = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("atelier-settings")
    ]
    return name


def test_every_rule_holds_for_what_we_ship(rendered: list[Manifest]) -> None:
    assert deploy_rules.problems(rendered) == []


def test_a_presync_hook_reading_the_generated_settings_is_refused(
    rendered: list[Manifest],
) -> None:
    # The migration Job as it was: envFrom the settings ConfigMap the sync applies after it.
    docs = copy.deepcopy(rendered)
    job = named(docs, "Job", "atelier-migrate")
    [container] = job["spec"]["template"]["spec"]["containers"]
    container["envFrom"] = [{"configMapRef": {"name": settings_map(docs)}}]
    [problem] = deploy_rules.hooks_read_only_what_exists_before_the_sync(docs)
    assert "Job/atelier-migrate" in problem
    assert settings_map(docs) in problem
    # A Secret made by hand (not rendered) is fine: it exists before any sync.
    assert job["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "PreSync"
    container.pop("envFrom")
    assert deploy_rules.hooks_read_only_what_exists_before_the_sync(docs) == []


def edge_envoy(docs: list[Manifest]) -> Manifest:
    [envoy] = [
        c
        for c in named(docs, "Deployment", "edge")["spec"]["template"]["spec"]["containers"]
        if c["name"] == "envoy"
    ]
    return envoy


def set_heap(docs: list[Manifest], heap: int) -> None:
    [template] = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("edge-envoy-template")
    ]
    config = yaml.safe_load(template["data"]["envoy.yaml"])
    [monitor] = [
        m
        for m in config["overload_manager"]["resource_monitors"]
        if m["name"] == "envoy.resource_monitors.fixed_heap"
    ]
    monitor["typed_config"]["max_heap_size_bytes"] = heap
    template["data"]["envoy.yaml"] = yaml.safe_dump(config)


def test_an_envoy_heap_beyond_its_memory_limit_is_refused(rendered: list[Manifest]) -> None:
    # As it was: a 1 GiB heap inside a 512Mi limit (the OOM killer acts first).
    docs = copy.deepcopy(rendered)
    set_heap(docs, 1073741824)
    [problem] = deploy_rules.envoy_heap_fits_its_memory_limit(docs)
    assert "200%" in problem and "512Mi" in problem
    # A heap far below the limit refuses work it had room for.
    set_heap(docs, 64 * 2**20)
    assert deploy_rules.envoy_heap_fits_its_memory_limit(docs)


def test_envoy_without_concurrency_under_a_cpu_limit_is_refused(
    rendered: list[Manifest],
) -> None:
    docs = copy.deepcopy(rendered)
    envoy = edge_envoy(docs)
    at = envoy["args"].index("--concurrency")
    del envoy["args"][at : at + 2]
    [problem] = deploy_rules.envoy_workers_match_its_cpu_limit(docs)
    assert "without --concurrency" in problem
    envoy["args"] += ["--concurrency", "8"]
    [problem] = deploy_rules.envoy_workers_match_its_cpu_limit(docs)
    assert "--concurrency 8, but the CPU limit is 2" in problem


def test_deployments_without_a_spread_are_refused(rendered: list[Manifest]) -> None:
    # As they were: no topologySpreadConstraints anywhere.
    docs = copy.deepcopy(rendered)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for doc in deployments:
        doc["spec"]["template"]["spec"].pop("topologySpreadConstraints")
    problems = deploy_rules.deployments_spread_over_nodes_and_zones(docs)
    assert len(problems) == 2 * len(deployments) + 1  # hostname and zone each; edge hard
    # A constraint that selects every atelier pod alike spreads nothing of its own.
    docs = copy.deepcopy(rendered)
    media = named(docs, "Deployment", "media")
    for constraint in media["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        constraint["matchLabelKeys"] = ["pod-template-hash"]
    assert len(deploy_rules.deployments_spread_over_nodes_and_zones(docs)) == 2
    # The edge behind externalTrafficPolicy: Local: a soft spread over nodes is refused.
    docs = copy.deepcopy(rendered)
    edge = named(docs, "Deployment", "edge")
    edge["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"] = (
        "ScheduleAnyway"
    )
    [problem] = deploy_rules.deployments_spread_over_nodes_and_zones(docs)
    assert "DoNotSchedule" in problem


OLD_EDGE_PRE_STOP = (
    "import time, urllib.request; [urllib.request.urlopen(urllib.request.Request("
    "'http://127.0.0.1:9901' + path, method='POST'), timeout=2) for path in "
    "('/healthcheck/fail', '/drain_listeners?graceful&inboundonly')]; time.sleep(15)"
)


def test_an_edge_that_drains_before_load_balancers_deregister_it_is_refused(
    rendered: list[Manifest],
) -> None:
    # As it was: health failed and listeners drained at once, 15 s, in a 30 s grace.
    docs = copy.deepcopy(rendered)
    edge_envoy(docs)["lifecycle"]["preStop"]["exec"]["command"][-1] = OLD_EDGE_PRE_STOP
    [problem] = deploy_rules.edge_keeps_accepting_until_load_balancers_deregister_it(docs)
    assert "0 s after failing its health check" in problem
    # The waits must fit in the grace period.
    docs = copy.deepcopy(rendered)
    named(docs, "Deployment", "edge")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ] = 30
    [problem] = deploy_rules.edge_keeps_accepting_until_load_balancers_deregister_it(docs)
    assert "grace period" in problem


def test_deployments_without_an_autoscaler_are_refused(rendered: list[Manifest]) -> None:
    # As they were: only the workers autoscaled (KEDA).
    docs = [d for d in copy.deepcopy(rendered) if d["kind"] != "HorizontalPodAutoscaler"]
    problems = deploy_rules.every_deployment_autoscales(docs)
    assert sorted(problems) == sorted(
        f"Deployment/{name}: nothing scales it"
        for name in ("creation-api", "media", "notify", "edge", "console")
    )
    # notify on CPU alone misses what its replicas are planned by: streams.
    docs = copy.deepcopy(rendered)
    hpa = named(docs, "HorizontalPodAutoscaler", "notify")
    hpa["spec"]["metrics"] = [m for m in hpa["spec"]["metrics"] if m["type"] == "Resource"]
    [problem] = deploy_rules.every_deployment_autoscales(docs)
    assert "atelier_notify_open_streams" in problem


def test_pools_left_at_the_default_are_refused_and_overrun_the_budget(
    rendered: list[Manifest],
) -> None:
    # As they were: no pool set anywhere (20 each), the workers up to 20 replicas.
    docs = copy.deepcopy(rendered)
    for doc in docs:
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                container["env"] = [
                    v for v in container.get("env", []) if v["name"] != "ATELIER_DB_POOL_SIZE"
                ]
    problems = deploy_rules.postgres_connections_fit_the_budget(docs)
    unset = [p for p in problems if "no ATELIER_DB_POOL_SIZE" in p]
    assert len(unset) == 4  # creation-api, creation-worker, media, notify
    if named(docs, "ScaledObject", "creation-worker")["spec"]["maxReplicaCount"] == 20:
        [over] = [p for p in problems if p.startswith("PostgreSQL:")]
        assert "creation-worker 20 x 23" in over


def test_the_budget_counts_every_replica_at_its_most(rendered: list[Manifest]) -> None:
    docs = copy.deepcopy(rendered)
    before, _ = deploy_rules.connection_budget(docs)
    named(docs, "HorizontalPodAutoscaler", "creation-api")["spec"]["maxReplicas"] += 1
    after, _ = deploy_rules.connection_budget(docs)
    assert after - before == 10 + 3  # its pool and its three LISTEN connections
    named(docs, "HorizontalPodAutoscaler", "creation-api")["spec"]["maxReplicas"] = 100
    [problem] = deploy_rules.postgres_connections_fit_the_budget(docs)
    assert "exceed" in problem


ROOT = Path(__file__).resolve().parents[2]


def test_the_stream_figures_agree(rendered: list[Manifest]) -> None:
    """One story of a notify replica's streams: planned for N (docs/operations.md), the
    HPA scales out below it, the alert fires above the HPA's target and at most at N."""
    operations = (ROOT / "docs" / "operations.md").read_text()
    [planned] = re.findall(r"notify replicas at ~([\d,]+) streams each", operations)
    capacity = int(planned.replace(",", ""))
    alerts = yaml.safe_load((ROOT / "deploy" / "observability" / "alerts.yml").read_text())
    [rule] = [
        r
        for group in alerts["groups"]
        for r in group["rules"]
        if r.get("alert") == "AtelierNotifyStreamsCrowded"
    ]
    threshold = int(re.fullmatch(r".*atelier_notify_open_streams\) > (\d+)", rule["expr"])[1])
    hpa = named(rendered, "HorizontalPodAutoscaler", "notify")
    [streams] = [m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    target = int(streams["pods"]["target"]["averageValue"])
    assert target < threshold <= capacity, (target, threshold, capacity)
    assert f"{threshold:,}" in rule["annotations"]["summary"]
    observability = (ROOT / "docs" / "observability.md").read_text()
    assert f"over {threshold:,} on one replica" in observability
    assert f"past {target:,} on average" in observability
    assert f"planned for {capacity:,} streams" in observability


def test_a_deployment_nobody_scrapes_is_refused(rendered: list[Manifest]) -> None:
    # As it was: metrics ports on the containers, on no Service, no ServiceMonitor.
    docs = [
        d
        for d in copy.deepcopy(rendered)
        if d["kind"] != "ServiceMonitor"
        and not (d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics"))
    ]
    problems = deploy_rules.every_deployment_is_scraped(docs)
    assert sorted(problems) == sorted(
        f"Deployment/{name}: no ServiceMonitor scrapes its {port} port ({number}) through "
        "a Service (nor a PodMonitor on its pods)"
        for name, port, number in (
            ("creation-api", "metrics", 9461),
            ("creation-worker", "metrics", 9461),
            ("media", "metrics", 9462),
            ("notify", "metrics", 9463),
            ("edge", "monitoring", 9902),
            ("console", "metrics", 9464),
        )
    )
    # A ServiceMonitor on the wrong port name scrapes nothing; a port undeclared on the
    # container is refused as such.
    docs = copy.deepcopy(rendered)
    named(docs, "ServiceMonitor", "notify")["spec"]["endpoints"][0]["port"] = "grpc-internal"
    [problem] = deploy_rules.every_deployment_is_scraped(docs)
    assert problem.startswith("Deployment/notify: no ServiceMonitor")
    docs = copy.deepcopy(rendered)
    [container] = named(docs, "Deployment", "media")["spec"]["template"]["spec"]["containers"]
    container["ports"] = [p for p in container["ports"] if p["name"] != "metrics"]
    assert deploy_rules.every_deployment_is_scraped(docs) == [
        "Deployment/media: no container port named metrics"
    ]
    # A PodMonitor on the pods' port is as good.
    docs = [d for d in copy.deepcopy(rendered) if d["kind"] != "ServiceMonitor"]
    docs += [
        {
            "kind": "PodMonitor",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                "podMetricsEndpoints": [{"port": "monitoring" if name == "edge" else "metrics"}],
            },
        }
        for name in ("creation-api", "creation-worker", "media", "notify", "edge", "console")
    ]
    assert deploy_rules.every_deployment_is_scraped(docs) == []


def test_the_metrics_ports_are_the_ones_the_services_listen_on(rendered: list[Manifest]) -> None:
    for name, service in (
        ("creation-api", "creation"),
        ("creation-worker", "creation"),
        ("media", "media"),
        ("notify", "notify"),
    ):
        container = named(rendered, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == DEFAULT_PORTS[service].metrics_port, name
        [port] = named(rendered, "Service", f"{name}-metrics")["spec"]["ports"]
        assert port["port"] == ports["metrics"] and port["targetPort"] == "metrics"


def test_the_prometheus_rule_carries_the_alerts_file(rendered: list[Manifest]) -> None:
    assert deploy_check.prometheus_rule_drift(rendered) == []
    # The committed file is what the script writes now (nobody edited it by hand).
    assert prometheus_rule.TARGET.read_text() == prometheus_rule.text()
    # An alert added to alerts.yml and not regenerated: the check says so.
    docs = copy.deepcopy(rendered)
    rule = named(docs, "PrometheusRule", prometheus_rule.NAME)
    rule["spec"]["groups"][0]["rules"].pop()
    [problem] = deploy_check.prometheus_rule_drift(docs)
    assert "differ from deploy/observability/alerts.yml" in problem
