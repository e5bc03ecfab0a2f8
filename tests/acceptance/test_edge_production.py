"""The production edge (deploy/envoy/envoy.yaml as the edge pod's init container renders
it), run as a real Envoy on local ports, with its TLS Secret in a directory laid out and
updated the way the kubelet does it, and a real gRPC server standing in for the services:

- plain HTTP answers the load balancer's /healthz and redirects everything else to the
  same URL over HTTPS, serving no API call;
- HTTPS answers carry HSTS;
- a new certificate swapped into the Secret's directory is served without a restart,
  while connections opened before keep working; a broken one is not taken;
- the monitoring port passes GET /stats/prometheus and GET /ready to the admin interface
  and refuses every other path, /quitquitquit and /runtime_modify among them."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2

from services.dev import edge
from services.dev.processes import Child, http_ok, spawn, wait_until
from tests.support.certificates import self_signed_for
from tests.support.edges import RecordingUpstream
from tests.support.production_edge import (
    ProductionPorts,
    SecretMount,
    production_config,
)

pytestmark = pytest.mark.acceptance

HSTS = "max-age=31536000; includeSubDomains"
SERVICES = (
    "atelier.creation.v1.CreationService",
    "atelier.media.v1.MediaService",
    "atelier.notify.v1.NotifyService",
)
# How long a swapped certificate may take to be served (Envoy reacts to the move at once).
RELOAD_BOUND_SECONDS = 10.0


@dataclass(frozen=True)
class ProductionEdge:
    child: Child
    ports: ProductionPorts
    secret: SecretMount
    # The certificate it started with, and a spare one for the swap.
    first: tuple[Path, Path]
    second: tuple[Path, Path]
    upstream: RecordingUpstream

    def admin(self, path: str) -> str:
        """An admin interface answer, asked on the loopback (as the pod's hooks do)."""
        url = f"http://127.0.0.1:{self.ports.admin}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def sds_updates(self) -> int:
        stats = json.loads(self.admin("/stats?format=json&filter=ssl_context_update_by_sds"))
        [stat] = stats["stats"]
        return int(stat["value"])


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductionEdge]:
    work = tmp_path_factory.mktemp("production-edge")
    first = self_signed_for(work, ("localhost",), ("127.0.0.1",), stem="first")
    second = self_signed_for(work, ("localhost",), ("127.0.0.1",), stem="second")
    secret = SecretMount(work / "tls")
    secret.write(pair(first))
    with RecordingUpstream() as upstream:
        for service in SERVICES:
            upstream.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        config, ports = production_config(work, secret.directory, upstream.port)
        path = edge.write(work / "envoy.yaml", config)
        child = spawn("envoy", edge.argv(path), {}, work)
        try:
            wait_until(child, http_ok(f"http://127.0.0.1:{ports.admin}/ready"), 30)
            yield ProductionEdge(child, ports, secret, first, second, upstream)
        finally:
            child.stop()


def pair(files: tuple[Path, Path]) -> dict[str, bytes]:
    return {"tls.crt": files[0].read_bytes(), "tls.key": files[1].read_bytes()}


def request(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    trust: Path | None = None,
) -> http.client.HTTPResponse:
    """One request with the path sent exactly as given (no client-side normalizing)."""
    connection: http.client.HTTPConnection
    if trust is None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        context = ssl.create_default_context(cafile=trust)
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    body = b"{}" if method == "POST" else None
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def served_certificate(port: int) -> x509.Certificate:
    pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=5)
    return x509.load_pem_x509_certificate(pem.encode())


def certificate(files: tuple[Path, Path]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(files[0].read_bytes())


# --- plain HTTP: health and a redirect, nothing else ---------------------------------


def test_plain_http_answers_the_health_probe(production: ProductionEdge) -> None:
    response = request(production.ports.plaintext, "GET", "/healthz")
    assert response.status == 200
    assert response.getheader("strict-transport-security") is None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/catalog?page_size=5"),
        ("POST", "/v1/jobs"),
        ("DELETE", "/v1/devices/abc"),
        ("GET", "/openapi.json"),
        ("GET", "/"),
    ],
)
def test_plain_http_redirects_everything_else_to_https(
    production: ProductionEdge, method: str, path: str
) -> None:
    before = len(production.upstream.calls)
    headers = {"host": "api.example.com", "authorization": "Bearer abc"}
    response = request(production.ports.plaintext, method, path, headers)
    # 308: the client repeats the same method and body at the new URL.
    assert response.status == 308
    assert response.getheader("location") == f"https://api.example.com{path}"
    assert response.getheader("strict-transport-security") is None
    # No API call is served in the clear.
    assert len(production.upstream.calls) == before


# --- HTTPS: HSTS on every answer -------------------------------------------------------


def test_https_answers_carry_hsts(production: ProductionEdge) -> None:
    served = production.ports.tls
    trust = production_trust(production)
    api = request(served, "GET", "/v1/catalog", trust=trust)
    # An answer from behind the edge (the stand-in service answered the RPC) ...
    assert production.upstream.calls_to("/atelier.creation.v1.CreationService/ListCatalog")
    assert api.status == 200
    assert api.getheader("strict-transport-security") == HSTS
    # ... a file the edge serves itself, and the edge's own error.
    for path, status in (("/openapi.json", 200), ("/no-such-route", 404)):
        answer = request(served, "GET", path, trust=trust)
        assert answer.status == status
        assert answer.getheader("strict-transport-security") == HSTS


def production_trust(production: ProductionEdge) -> Path:
    """The certificate the edge serves now (the reload test swaps it)."""
    served = served_certificate(production.ports.tls)
    for files in (production.first, production.second):
        if certificate(files) == served:
            return files[0]
    raise AssertionError("the edge serves neither test certificate")


# --- the certificate reloaded from the Secret's directory -------------------------------


def test_a_swapped_certificate_is_served_without_a_restart(production: ProductionEdge) -> None:
    port = production.ports.tls
    assert served_certificate(port) == certificate(production.first)
    updates = production.sds_updates()
    pid = production.child.process.pid
    # A connection opened before the swap, trusting only the first certificate.
    context = ssl.create_default_context(cafile=production.first[0])
    kept = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    kept.request("GET", "/openapi.json")
    assert kept.getresponse().read()
    socket_before = kept.sock

    production.secret.write(pair(production.second))

    deadline = time.monotonic() + RELOAD_BOUND_SECONDS
    while served_certificate(port) != certificate(production.second):
        assert time.monotonic() < deadline, f"still the old certificate {RELOAD_BOUND_SECONDS}s on"
        time.sleep(0.05)
    # The same process, one certificate update, and new connections that trust the new
    # certificate get through.
    assert production.child.alive() and production.child.process.pid == pid
    assert production.sds_updates() == updates + 1
    assert request(port, "GET", "/openapi.json", trust=production.second[0]).status == 200
    # The connection from before the swap was not cut.
    kept.request("GET", "/openapi.json")
    assert kept.getresponse().status == 200
    assert kept.sock is socket_before
    kept.close()


def test_a_broken_certificate_pair_is_not_taken(production: ProductionEdge, tmp_path: Path) -> None:
    """A Secret whose key does not match its certificate: Envoy refuses the update and
    goes on serving the certificate it has."""
    serving = served_certificate(production.ports.tls)
    trust = production_trust(production)
    stranger = self_signed_for(tmp_path, ("localhost",), ("127.0.0.1",), stem="stranger")
    rejected_before = sds_rejections(production)
    updates = production.sds_updates()
    production.secret.write({"tls.crt": trust.read_bytes(), "tls.key": stranger[1].read_bytes()})
    deadline = time.monotonic() + RELOAD_BOUND_SECONDS
    while sds_rejections(production) == rejected_before:
        assert time.monotonic() < deadline, "the broken pair was neither taken nor refused"
        time.sleep(0.05)
    assert served_certificate(production.ports.tls) == serving
    assert production.sds_updates() == updates
    assert request(production.ports.tls, "GET", "/openapi.json", trust=trust).status == 200
    # Put back a good pair for whatever runs next.
    good = production.first if trust == production.first[0] else production.second
    production.secret.write(pair(good))


def sds_rejections(production: ProductionEdge) -> int:
    """Reloads Envoy refused (the counter operators alert on, docs/operations.md)."""
    stats = json.loads(production.admin("/stats?format=json&filter=key_rotation_failed$"))
    return sum(int(stat["value"]) for stat in stats["stats"] if "name" in stat)


# --- the admin interface: two read-only paths for monitoring ---------------------------


def test_the_monitoring_port_answers_prometheus_and_ready(production: ProductionEdge) -> None:
    port = production.ports.monitoring
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/stats/prometheus")
    metrics = connection.getresponse()
    body = metrics.read().decode()
    assert metrics.status == 200
    assert "# TYPE envoy_server_live gauge" in body
    connection.request("GET", "/ready")
    ready = connection.getresponse()
    assert (ready.status, ready.read()) == (200, b"LIVE\n")
    connection.close()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/quitquitquit"),
        ("GET", "/quitquitquit"),
        ("POST", "/runtime_modify?edge.rate_limit.enabled=0"),
        ("POST", "/healthcheck/fail"),
        ("POST", "/drain_listeners"),
        ("POST", "/logging?level=trace"),
        ("POST", "/reset_counters"),
        ("GET", "/config_dump"),
        ("GET", "/certs"),
        ("GET", "/clusters"),
        ("GET", "/server_info"),
        ("GET", "/runtime"),
        ("GET", "/stats"),
        ("GET", "/"),
        # The allowed paths with another method, or as a way around the list.
        ("POST", "/ready"),
        ("POST", "/stats/prometheus"),
        ("POST", "/ready/../quitquitquit"),
        ("POST", "/stats/prometheus/../../quitquitquit"),
        ("POST", "//quitquitquit"),
        ("POST", "/ready%2F..%2Fquitquitquit"),
        ("GET", "/stats/prometheus/extra"),
    ],
)
def test_every_other_admin_path_is_refused(
    production: ProductionEdge, method: str, path: str
) -> None:
    response = request(production.ports.monitoring, method, path)
    assert response.status in (400, 403, 404), (method, path, response.status)


def test_after_the_refused_calls_envoy_is_unchanged(production: ProductionEdge) -> None:
    """Had any refused call reached the admin interface, Envoy would have quit, failed its
    health check or changed its runtime."""
    for path in ("/quitquitquit", "/healthcheck/fail", "/runtime_modify?atelier.probe=1"):
        assert request(production.ports.monitoring, "POST", path).status == 404
    assert production.child.alive()
    assert request(production.ports.monitoring, "GET", "/ready").status == 200
    assert request(production.ports.plaintext, "GET", "/healthz").status == 200
    runtime = json.loads(production.admin("/runtime"))
    assert "atelier.probe" not in runtime["entries"]
