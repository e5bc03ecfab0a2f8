"""The edge health-checks its upstreams with the standard gRPC health service: a replica
that starts draining (SIGTERM: NOT_SERVING at once, still serving through its drain
window) receives no new request through Envoy, while the other takes them all. A replica
that passes its health check yet keeps answering UNAVAILABLE is set aside by outlier
detection, and stays aside while its health checks pass. A replica that stops answering
behind an idle pooled connection is found by the edge's HTTP/2 pings."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2

from services.dev import edge
from services.dev.processes import free_port
from services.dev.stack import Replica, Stack
from tests.support.edges import (
    SERVICES,
    RecordingUpstream,
    RunningEdge,
    cluster,
    running_edge,
    set_endpoints,
)

# Long enough that the draining replica still answers throughout the test.
DRAIN_WINDOW_SECONDS = 60


def upstream_hosts(running: RunningEdge, url: str, token: str, count: int) -> list[str]:
    """Sends ``count`` ListDevices through the edge; the replica that served each."""
    hosts = []
    for _ in range(count):
        response = httpx.get(url, headers={"authorization": f"Bearer {token}"})
        assert response.status_code == 200, response.text
        hosts.append(running.logged(response.headers["x-request-id"])["upstream_host"])
    return hosts


def until(condition: object, within: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {within:g}s"
        time.sleep(0.1)


@pytest.fixture
def replicas(stack: Stack) -> Iterator[list[Replica]]:
    started = [
        stack.start_replica("notify", extra_env={"ATELIER_DRAIN_WINDOW": str(DRAIN_WINDOW_SECONDS)})
        for _ in range(2)
    ]
    yield started
    for replica in started:
        # Not a drain of 60 s: the test is over.
        replica.child.process.kill()
        replica.child.process.wait()
        stack.children.remove(replica.child)


def test_a_draining_replica_receives_no_new_request(
    stack: Stack, replicas: list[Replica], token: str, tmp_path: Path
) -> None:
    draining, staying = replicas
    config = edge.render(
        listen_port=free_port(), admin_port=free_port(), upstream_ports=stack.ports.upstreams()
    )
    ports = [draining.public_port, staying.public_port]
    for name in ("notify", "notify_streams"):
        set_endpoints(config, name, ports)
    with running_edge(config, tmp_path) as running:
        url = f"{running.url}/v1/devices"
        until(
            lambda: (
                not any(
                    h.get("failed_active_health_check")
                    for h in running.host_health("notify").values()
                )
            ),
            15,
            "both replicas healthy",
        )
        served = set(upstream_hosts(running, url, token, 10))
        assert served == {f"127.0.0.1:{port}" for port in ports}

        draining.child.process.send_signal(signal.SIGTERM)
        until(
            lambda: running.host_health("notify")[draining.public_port].get(
                "failed_active_health_check"
            ),
            10,
            "the draining replica out of the balancer",
        )
        # Still up and answering (its drain window), yet nothing reaches it.
        assert draining.child.alive()
        served_after = upstream_hosts(running, url, token, 20)
        assert set(served_after) == {f"127.0.0.1:{staying.public_port}"}
        assert draining.child.alive()
        # Nor did the draining replica log any call of its own after the drain began.
        log = draining.child.log_path
        assert log is not None
        lines = log.read_text(errors="replace").splitlines()
        drained_at = next(i for i, x in enumerate(lines) if '"service_draining"' in x)
        assert not [x for x in lines[drained_at:] if '"rpc_finished"' in x]


GET_JOB = "/atelier.creation.v1.CreationService/GetJob"
# deploy/envoy/envoy.yaml: outlier_detection.consecutive_gateway_failure
CONSECUTIVE_FAILURES = 5


def creation_stat(running: RunningEdge, name: str) -> int:
    """One of Envoy's counters for the creation cluster (``cluster.creation.<name>``)."""
    pattern = "^cluster\\.creation\\." + name.replace(".", "\\.") + "$"
    with urllib.request.urlopen(
        f"http://127.0.0.1:{running.admin_port}/stats?format=json&filter={pattern}", timeout=5
    ) as response:
        [stat] = json.load(response)["stats"]
    return int(stat["value"])


def test_a_replica_that_keeps_failing_calls_is_set_aside_though_its_health_passes(
    tmp_path: Path,
) -> None:
    """Without ``successful_active_health_check_uneject_host: false`` the next passing
    health check (every second) would bring the replica straight back."""
    with RecordingUpstream() as sound, RecordingUpstream() as failing:
        for replica in (sound, failing):
            replica.health.set(
                "atelier.creation.v1.CreationService", health_pb2.HealthCheckResponse.SERVING
            )
        failing.failures[GET_JOB] = [grpc.StatusCode.UNAVAILABLE] * 1000
        config = edge.render(
            listen_port=free_port(),
            admin_port=free_port(),
            upstream_ports=dict.fromkeys(SERVICES, sound.port),
        )
        set_endpoints(config, "creation", [sound.port, failing.port])
        with running_edge(config, tmp_path) as running:

            def checks_passed() -> int:
                return creation_stat(running, "health_check.success")

            def read() -> None:
                # A read: the edge tries it again on the other replica when one fails.
                response = httpx.get(f"{running.url}/v1/jobs/{uuid.uuid4()}")
                assert response.status_code == 200, response.text

            def ejected() -> bool:
                status = running.host_health("creation")[failing.port]
                return bool(status.get("failed_outlier_check"))

            def read_through_health_checks(rounds: int) -> None:
                """Reads until both replicas have passed ``rounds`` more health checks."""
                target = checks_passed() + 2 * rounds
                while checks_passed() < target:
                    read()

            until(lambda: checks_passed() >= 2, 15, "both replicas checked")
            deadline = time.monotonic() + 20
            while not ejected():
                assert time.monotonic() < deadline, "the failing replica was never set aside"
                read()
            assert len(failing.calls_to(GET_JOB)) >= CONSECUTIVE_FAILURES
            assert creation_stat(running, "outlier_detection.ejections_enforced_total") == 1
            assert (
                creation_stat(
                    running, "outlier_detection.ejections_enforced_consecutive_gateway_failure"
                )
                == 1
            )
            # Envoy's workers see the ejection within its update merge window (1 s).
            read_through_health_checks(1)
            failed_before = len(failing.calls_to(GET_JOB))
            # Two more rounds of passing health checks on both replicas: neither brings
            # the failing one back before its ejection time (15 s).
            read_through_health_checks(2)
            assert ejected()
            assert len(failing.calls_to(GET_JOB)) == failed_before
            assert "failed_active_health_check" not in running.host_health("creation")[failing.port]


def test_a_replica_that_stops_answering_behind_a_quiet_connection_is_found_by_pings(
    stack: Stack, token: str, tmp_path: Path
) -> None:
    """A replica frozen (SIGSTOP: its socket stays open, nothing answers) behind an idle
    pooled connection: the edge's HTTP/2 ping goes unanswered and the connection is
    closed. deploy/envoy/envoy.yaml pings every 30 s and waits 10 s; 1 s each here."""
    frozen = stack.start_replica("notify")
    try:
        config = edge.render(
            listen_port=free_port(), admin_port=free_port(), upstream_ports=stack.ports.upstreams()
        )
        set_endpoints(config, "notify", [frozen.public_port])
        options = cluster(config, "notify")["typed_extension_protocol_options"]
        http2 = options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"][
            "explicit_http_config"
        ]["http2_protocol_options"]
        assert http2["connection_keepalive"] == {"interval": "30s", "timeout": "10s"}
        http2["connection_keepalive"] = {"interval": "1s", "timeout": "1s"}
        with running_edge(config, tmp_path) as running:
            answer = httpx.get(
                f"{running.url}/v1/devices", headers={"authorization": f"Bearer {token}"}
            )
            assert answer.status_code == 200, answer.text
            assert notify_stat(running, "http2.keepalive_timeout") == 0
            frozen.child.process.send_signal(signal.SIGSTOP)
            until(
                lambda: notify_stat(running, "http2.keepalive_timeout") >= 1,
                15,
                "the unanswered ping closing the connection",
            )
    finally:
        frozen.child.process.send_signal(signal.SIGCONT)
        frozen.child.process.kill()
        frozen.child.process.wait()
        stack.children.remove(frozen.child)


def notify_stat(running: RunningEdge, name: str) -> int:
    pattern = "^cluster\\.notify\\." + name.replace(".", "\\.") + "$"
    with urllib.request.urlopen(
        f"http://127.0.0.1:{running.admin_port}/stats?format=json&filter={pattern}", timeout=5
    ) as response:
        stats = json.load(response)["stats"]
    return int(stats[0]["value"]) if stats else 0
