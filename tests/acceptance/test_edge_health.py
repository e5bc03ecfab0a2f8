"""The edge health-checks its upstreams with the standard gRPC health service: a replica
that starts draining (SIGTERM: NOT_SERVING at once, still serving through its drain
window) receives no new request through Envoy, while the other takes them all."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.dev import edge
from services.dev.processes import free_port
from services.dev.stack import Replica, Stack
from tests.support.edges import RunningEdge, running_edge, set_endpoints

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
    for cluster in ("notify", "notify_streams"):
        set_endpoints(config, cluster, ports)
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
