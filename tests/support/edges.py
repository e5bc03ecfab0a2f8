"""Envoy processes of a test's own, from configs services/dev/edge.py renders (and the
test adjusts), with what they write: the JSON access log and the admin API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from services.dev import edge
from services.dev.processes import Child, http_ok, spawn, venv_binary, wait_until

SERVICES = ("creation", "media", "notify", "media_http")

if TYPE_CHECKING:
    # grpc-stubs makes the handler generic; at run time it is a plain class.
    GenericHandler: TypeAlias = grpc.GenericRpcHandler[bytes, bytes]
else:
    GenericHandler = grpc.GenericRpcHandler


@dataclass(frozen=True)
class RunningEdge:
    child: Child
    port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def access_log(self) -> list[dict[str, Any]]:
        """The access log lines written so far (the edge's output holds them, among its
        own warnings)."""
        return access_lines(self.child)

    def logged(self, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The access log line of one request, once it is written."""
        return logged(self.child, request_id, timeout)

    def clusters(self) -> dict[str, Any]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.admin_port}/clusters?format=json", timeout=5
        ) as response:
            loaded: dict[str, Any] = json.load(response)
        return loaded

    def host_health(self, cluster: str) -> dict[int, dict[str, Any]]:
        """Each upstream port of ``cluster`` and its health status as Envoy reports it
        (``failed_active_health_check`` true: the health check took it out)."""
        for status in self.clusters()["cluster_statuses"]:
            if status["name"] == cluster:
                return {
                    host["address"]["socket_address"]["port_value"]: host.get("health_status", {})
                    for host in status.get("host_statuses", [])
                }
        raise AssertionError(f"no cluster {cluster}")


def access_lines(child: Child) -> list[dict[str, Any]]:
    assert child.log_path is not None
    lines = []
    for line in child.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def logged(child: Child, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
    """The access log line of request ``request_id``, once Envoy has written it (it
    flushes every half second in tests)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [x for x in access_lines(child) if x.get("request_id") == request_id]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no access log line for {request_id}"
        time.sleep(0.1)


@contextmanager
def running_edge(config: dict[str, Any], work: Path, name: str = "envoy") -> Iterator[RunningEdge]:
    """Envoy on ``config`` (as render() returned it, possibly adjusted); its output,
    access log included, goes to ``work/<name>.log``."""
    listener = config["static_resources"]["listeners"][0]
    port = listener["address"]["socket_address"]["port_value"]
    admin = config["admin"]["address"]["socket_address"]["port_value"]
    path = edge.write(work / f"{name}.yaml", config)
    child = spawn(name, edge.argv(path), {}, work)
    try:
        wait_until(child, http_ok(f"http://127.0.0.1:{admin}/ready"), 30)
        yield RunningEdge(child, port, admin)
    finally:
        child.stop()


def validate(config: dict[str, Any], work: Path) -> str:
    """`envoy --mode validate` on ``config``; fails with Envoy's complaint."""
    path = edge.write(work / "validate.yaml", config)
    result = subprocess.run(
        [venv_binary("envoy"), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    return result.stdout


def manager(config: dict[str, Any]) -> dict[str, Any]:
    """The HTTP connection manager of the plain listener (the TLS one shares it)."""
    typed: dict[str, Any] = config["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"
    ][0]["typed_config"]
    return typed


def routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = manager(config)["route_config"]["virtual_hosts"][0]["routes"]
    return found


def cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


def set_endpoints(config: dict[str, Any], name: str, ports: list[int]) -> None:
    """Cluster ``name`` balances over these local ports."""
    cluster(config, name)["load_assignment"]["endpoints"] = [
        {
            "lb_endpoints": [
                {
                    "endpoint": {
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}
                    }
                }
                for p in ports
            ]
        }
    ]


@dataclass(frozen=True)
class Call:
    method: str
    metadata: dict[str, str]


class RecordingUpstream:
    """A real gRPC server standing in for a service behind the edge: it answers every
    unary method with an empty message (or, for methods in ``failures``, with that status
    the first times), records each call's method and metadata, and has the standard
    health service."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        # Method -> statuses to answer, one per call, before answering OK.
        self.failures: dict[str, list[grpc.StatusCode]] = {}
        self.health = health.HealthServicer()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self._server.add_generic_rpc_handlers((_Recorder(self),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def __enter__(self) -> RecordingUpstream:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.stop(grace=None)

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]


class _Recorder(GenericHandler):
    def __init__(self, upstream: RecordingUpstream) -> None:
        self._upstream = upstream

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        method = details.method
        if method.startswith("/grpc.health.v1.Health/"):
            return None
        upstream = self._upstream

        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            metadata = {key: str(value) for key, value in context.invocation_metadata()}
            upstream.calls.append(Call(method, metadata))
            planned = upstream.failures.get(method)
            if planned:
                context.abort(planned.pop(0), "planned failure")
            return b""

        return grpc.unary_unary_rpc_method_handler(answer)


def _local(port: int) -> dict[str, Any]:
    return {"address": "127.0.0.1", "port_value": port}
