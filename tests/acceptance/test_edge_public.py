"""The edge as a public mobile edge, through the real Envoy: what of a client's headers
reaches a service (its address and request id come from the edge; forwarding, internal and
x-envoy-* headers from clients never), what the client gets back (no x-envoy-* headers),
the JSON access log (no credential, no URL signature), the per-client rate limit, retries
of reads only, grpc-timeout, the request headers timeout, bounded HTTP/2, the connection
limit and the heap's overload actions.

A recording gRPC server stands in for the services where a test must see every header a
request arrives with, or make a service fail on purpose; the rest go to the real stack."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import h2.connection
import h2.events
import h2.settings
import httpx
import pytest

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from services.dev import edge
from services.dev.processes import free_port
from services.dev.stack import Stack
from tests.support.edges import (
    SERVICES,
    RecordingUpstream,
    RunningEdge,
    logged,
    manager,
    running_edge,
)

CREATION = "/atelier.creation.v1.CreationService"
LIST_CATALOG = f"{CREATION}/ListCatalog"
GET_JOB = f"{CREATION}/GetJob"
SUBMIT_JOB = f"{CREATION}/SubmitJob"
DESCRIPTOR = Path(__file__).resolve().parents[2] / "gen" / "atelier.binpb"
# Headers a client may send hoping a service or Envoy trusts them.
FORGED = {
    "x-request-id": "chosen-by-the-client",
    "x-forwarded-for": "203.0.113.7",
    "forwarded": "for=203.0.113.7",
    "x-real-ip": "203.0.113.7",
    "x-atelier-service": "creation",
    "x-envoy-upstream-rq-timeout-ms": "1",
    "x-envoy-retry-on": "5xx",
    "x-envoy-max-retries": "7",
    "x-envoy-original-path": "/forged",
}


def no_envoy_headers(response: httpx.Response) -> None:
    assert [h for h in response.headers if h.lower().startswith("x-envoy-")] == []
    assert "envoy" not in response.headers.get("server", "")


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as running:
        yield running


def edge_config(ports: dict[str, int], **options: Any) -> dict[str, Any]:
    return edge.render(
        listen_port=free_port(),
        admin_port=free_port(),
        upstream_ports=ports,
        options=edge.EdgeOptions(**options),
    )


@pytest.fixture(scope="module")
def recorded(
    upstream: RecordingUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningEdge]:
    """The edge with every cluster on the recording server."""
    config = edge_config(dict.fromkeys(SERVICES, upstream.port))
    with running_edge(config, tmp_path_factory.mktemp("recorded-edge")) as running:
        yield running


def service_line(stack: Stack, service: str, request_id: str, within: float = 10.0) -> Any:
    """The service's rpc_finished log line for the edge's request ``request_id``."""
    assert stack.log_dir is not None
    deadline = time.monotonic() + within
    while True:
        for line in (stack.log_dir / f"{service}.log").read_text(errors="replace").splitlines():
            if request_id in line and line.startswith("{"):
                entry = json.loads(line)
                if entry.get("action") == "rpc_finished" and entry["request_id"] == request_id:
                    return entry
        assert time.monotonic() < deadline, f"{service} logged nothing for {request_id}"
        time.sleep(0.05)


def test_a_service_sees_the_edges_request_id_and_the_clients_true_address(
    stack: Stack, edge_url: str, token: str
) -> None:
    response = httpx.get(
        f"{edge_url}/v1/catalog", headers={"authorization": f"Bearer {token}", **FORGED}
    )
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    assert request_id != FORGED["x-request-id"]
    uuid.UUID(request_id)  # Envoy's own
    line = service_line(stack, "creation", request_id)
    assert line["method"] == LIST_CATALOG
    assert line["client"] == "127.0.0.1"
    no_envoy_headers(response)
    # The edge's access log line carries the same id: the two can be joined.
    assert logged(stack.child("envoy"), request_id)["client"] == "127.0.0.1"


def test_forwarding_internal_and_envoy_headers_from_clients_never_reach_a_service(
    upstream: RecordingUpstream, recorded: RunningEdge
) -> None:
    response = httpx.get(f"{recorded.url}/v1/catalog", headers=FORGED)
    assert response.status_code == 200, response.text
    no_envoy_headers(response)
    seen = upstream.calls_to(LIST_CATALOG)[-1].metadata
    assert seen["x-request-id"] == response.headers["x-request-id"] != FORGED["x-request-id"]
    assert seen["x-forwarded-for"] == "127.0.0.1"
    for name in ("forwarded", "x-real-ip", "x-atelier-service"):
        assert name not in seen, name
    # Envoy's own x-envoy-* for the service (the transcoder's original path) may pass;
    # none of the client's.
    forged_envoy = {k: v for k, v in FORGED.items() if k.startswith("x-envoy-")}
    assert all(seen.get(name) != value for name, value in forged_envoy.items()), seen
    assert seen.get("x-envoy-original-path", "/v1/catalog") == "/v1/catalog"


def test_native_grpc_callers_cannot_choose_their_request_id_or_address_either(
    upstream: RecordingUpstream, recorded: RunningEdge
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{recorded.port}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        _, call = stub.ListCatalog.with_call(
            creation_service_pb2.ListCatalogRequest(),
            metadata=tuple((k, v) for k, v in FORGED.items() if k != "x-envoy-original-path"),
            timeout=10,
        )
    answered = dict(call.initial_metadata())
    seen = upstream.calls_to(LIST_CATALOG)[-1].metadata
    assert seen["x-request-id"] == answered["x-request-id"] != FORGED["x-request-id"]
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert "x-atelier-service" not in seen
    assert not [k for k in answered if k.startswith("x-envoy-")]


def test_behind_a_trusted_proxy_the_client_is_the_address_that_proxy_appended(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """With one trusted hop (a cloud load balancer), the client is the last address in
    x-forwarded-for; what the client itself put before it counts for nothing."""
    config = edge_config(dict.fromkeys(SERVICES, upstream.port), xff_num_trusted_hops=1)
    with running_edge(config, tmp_path) as running:
        response = httpx.get(
            f"{running.url}/v1/catalog",
            headers={"x-forwarded-for": "198.51.100.66, 203.0.113.7"},
        )
        assert response.status_code == 200
        assert upstream.calls_to(LIST_CATALOG)[-1].metadata["x-forwarded-for"] == "203.0.113.7"
        assert running.logged(response.headers["x-request-id"])["client"] == "203.0.113.7"


def test_a_header_with_an_underscore_is_refused(
    upstream: RecordingUpstream, recorded: RunningEdge
) -> None:
    before = len(upstream.calls)
    response = httpx.get(f"{recorded.url}/v1/catalog", headers={"x_user_id": "admin"})
    assert response.status_code == 400
    assert response.json()["details"][0]["reason"] == "MALFORMED_REQUEST"
    assert len(upstream.calls) == before
    no_envoy_headers(response)


def test_envoys_own_answers_carry_no_envoy_headers(edge_url: str) -> None:
    for response in (
        httpx.get(f"{edge_url}/v1/nothing-here"),
        httpx.get(f"{edge_url}/v1/catalog?bogus=1"),
        httpx.get(f"{edge_url}/v1/catalog"),  # the service's 401
    ):
        assert response.status_code >= 400
        no_envoy_headers(response)
        assert response.headers["x-request-id"]


def test_the_access_log_has_the_request_and_never_a_credential_or_signature(
    stack: Stack, edge_url: str, token: str
) -> None:
    auth = {"authorization": f"Bearer {token}"}
    signature = "c2lnbmF0dXJlLW5vdC10by1iZS1sb2dnZWQ"
    signed = httpx.get(
        f"{edge_url}/media-objects/ai_input/2026/01/x?expires=4102444800&signature={signature}",
        headers=auth,
    )
    jobs = httpx.get(f"{edge_url}/v1/jobs?pageSize=1&pageToken=", headers=auth)
    assert jobs.status_code == 200, jobs.text
    envoy = stack.child("envoy")
    line = logged(envoy, jobs.headers["x-request-id"])
    assert line["path"] == "/v1/jobs"
    assert line["status"] == 200
    assert line["grpc_status"] == 0
    assert line["upstream_host"] == f"127.0.0.1:{stack.ports.public['creation']}"
    assert line["upstream_cluster"] == "creation"
    assert isinstance(line["duration_ms"], int)
    assert uuid.UUID(line["request_id"])
    object_line = logged(envoy, signed.headers["x-request-id"])
    assert object_line["path"] == "/media-objects/ai_input/2026/01/x"
    assert object_line["status"] == signed.status_code
    assert envoy.log_path is not None
    text = envoy.log_path.read_text(errors="replace")
    assert signature not in text
    assert "expires=" not in text
    assert token not in text
    assert "Bearer" not in text


def test_grpc_calls_are_logged_with_their_grpc_status(stack: Stack, edge_url: str) -> None:
    with grpc.insecure_channel(edge_url.removeprefix("http://")) as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ListCatalog(creation_service_pb2.ListCatalogRequest(), timeout=10)
    assert failed.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # A trailers-only answer: the response headers arrive as trailers.
    trailers: Any = failed.value.trailing_metadata()
    request_id = dict(trailers)["x-request-id"]
    line = logged(stack.child("envoy"), request_id)
    assert line["path"] == LIST_CATALOG
    assert line["grpc_status"] == grpc.StatusCode.UNAUTHENTICATED.value[0]
    assert line["protocol"] == "HTTP/2"


@pytest.fixture
def limited(stack: Stack, tmp_path: Path) -> Iterator[RunningEdge]:
    """The edge in front of the stack's services, three requests per client address and
    no refill during the test."""
    config = edge_config(stack.ports.upstreams(), rate_limit_burst=3, rate_limit_per_second=1)
    for http_filter in config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["http_filters"]:
        if http_filter["name"] == edge.RATE_LIMIT:
            for descriptor in http_filter["typed_config"]["descriptors"]:
                descriptor["token_bucket"]["fill_interval"] = "3600s"
    with running_edge(config, tmp_path) as running:
        yield running


def test_a_client_over_its_rate_limit_gets_429_with_a_status_and_retry_after(
    limited: RunningEdge, token: str
) -> None:
    auth = {"authorization": f"Bearer {token}"}
    for _ in range(3):
        assert httpx.get(f"{limited.url}/v1/catalog", headers=auth).status_code == 200
    refused = httpx.get(f"{limited.url}/v1/catalog", headers=auth)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["content-type"] == "application/json"
    body = refused.json()
    assert body["code"] == 8
    assert body["details"][0] == {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "RATE_LIMITED",
        "domain": "atelier.dev",
    }
    assert body["details"][1]["@type"] == "type.googleapis.com/google.rpc.RetryInfo"
    no_envoy_headers(refused)
    # Native gRPC from the same address: RESOURCE_EXHAUSTED.
    with grpc.insecure_channel(f"127.0.0.1:{limited.port}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ListCatalog(creation_service_pb2.ListCatalogRequest(), timeout=10)
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Another client address has a bucket of its own.
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    with other:
        assert other.get(f"{limited.url}/v1/catalog", headers=auth).status_code == 200


def test_reads_are_retried_on_another_try_and_writes_never(
    upstream: RecordingUpstream, recorded: RunningEdge
) -> None:
    upstream.failures[GET_JOB] = [grpc.StatusCode.UNAVAILABLE]
    before = len(upstream.calls_to(GET_JOB))
    read = httpx.get(f"{recorded.url}/v1/jobs/{uuid.uuid4()}")
    assert read.status_code == 200, read.text
    assert len(upstream.calls_to(GET_JOB)) - before == 2
    upstream.failures[SUBMIT_JOB] = [grpc.StatusCode.UNAVAILABLE]
    before = len(upstream.calls_to(SUBMIT_JOB))
    write = httpx.post(
        f"{recorded.url}/v1/jobs",
        headers={"content-type": "application/json", "idempotency-key": str(uuid.uuid4())},
        content=b"{}",
    )
    assert write.status_code == 503
    assert len(upstream.calls_to(SUBMIT_JOB)) - before == 1
    assert write.json()["code"] == 14


def test_the_edge_ends_a_call_at_its_grpc_timeout(tmp_path: Path) -> None:
    """A service that never answers: the caller's grpc-timeout (1 s) ends the call at the
    edge, well before the route's 30 s maximum (the caller itself waits up to 20 s)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        config = edge_config(dict.fromkeys(SERVICES, silent.getsockname()[1]))
        with (
            running_edge(config, tmp_path) as running,
            httpx.Client(http1=False, http2=True, timeout=20) as client,
        ):
            started = time.monotonic()
            response = client.post(
                f"{running.url}{LIST_CATALOG}",
                headers={
                    "content-type": "application/grpc",
                    "te": "trailers",
                    "grpc-timeout": "1S",
                },
                content=b"\x00\x00\x00\x00\x00",  # one empty message
            )
            elapsed = time.monotonic() - started
            line = running.logged(response.headers["x-request-id"])
    assert response.headers["grpc-status"] == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    assert 0.9 < elapsed < 10
    assert line["details"] == "max_duration_timeout"


def test_http2_clients_get_bounded_streams_and_windows(stack: Stack) -> None:
    with socket.create_connection(("127.0.0.1", stack.ports.envoy), timeout=10) as raw:
        connection = h2.connection.H2Connection()
        connection.initiate_connection()
        raw.sendall(connection.data_to_send())
        settings: dict[int, int] = {}
        window_growth = 0
        deadline = time.monotonic() + 10
        while not (settings and window_growth) and time.monotonic() < deadline:
            for event in connection.receive_data(raw.recv(65536)):
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    settings.update({k: v.new_value for k, v in event.changed_settings.items()})
                if isinstance(event, h2.events.WindowUpdated) and event.stream_id == 0:
                    window_growth += event.delta
            raw.sendall(connection.data_to_send())
    assert settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 100
    assert settings[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] == 256 * 1024
    # The connection window starts at 65,535 bytes and grows to 1 MiB.
    assert window_growth + 65535 == 1024 * 1024


def test_connections_over_the_global_limit_are_closed(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    config = edge_config(dict.fromkeys(SERVICES, upstream.port), max_connections=2)
    with running_edge(config, tmp_path) as running:
        clients = [httpx.Client(base_url=running.url) for _ in range(3)]
        try:
            for client in clients[:2]:
                assert client.get("/v1/catalog").status_code == 200
            # Both connections stay open (keep-alive): a third is closed as accepted.
            with pytest.raises(httpx.TransportError):
                clients[2].get("/v1/catalog")
            clients[0].close()
            # A slot is free again once Envoy has seen the close.
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert clients[2].get("/v1/catalog").status_code == 200
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
        finally:
            for client in clients:
                client.close()


def test_a_client_that_never_finishes_its_headers_gets_408_and_is_closed(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """deploy/envoy/envoy.yaml gives the headers 10 s; 1 s here, to keep the test short."""
    config = edge_config(dict.fromkeys(SERVICES, upstream.port))
    assert manager(config)["request_headers_timeout"] == "10s"
    manager(config)["request_headers_timeout"] = "1s"
    before = len(upstream.calls)
    with (
        running_edge(config, tmp_path) as running,
        socket.create_connection(("127.0.0.1", running.port), timeout=20) as raw,
    ):
        started = time.monotonic()
        raw.sendall(b"GET /v1/catalog HTTP/1.1\r\nHost: edge\r\n")  # no blank line
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
        elapsed = time.monotonic() - started
        line = next(x for x in running.access_log() if x["details"] == "request_header_timeout")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in head.lower()
    assert json.loads(body)["details"][0]["reason"] == "BAD_REQUEST"
    assert 0.9 < elapsed < 8
    assert line["status"] == 408
    assert len(upstream.calls) == before


def test_an_edge_over_its_heap_limit_sheds_requests_with_a_retryable_status(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """The overload manager's heap actions, made to fire by a limit (1 MiB) below what
    Envoy holds at rest: requests are answered 503 UNAVAILABLE with retry-after and the
    connection is not kept alive; no request reaches a service."""
    config = edge_config(dict.fromkeys(SERVICES, upstream.port))
    [heap] = [
        m
        for m in config["overload_manager"]["resource_monitors"]
        if m["name"] == "envoy.resource_monitors.fixed_heap"
    ]
    heap["typed_config"]["max_heap_size_bytes"] = 1024 * 1024
    before = len(upstream.calls)
    with running_edge(config, tmp_path) as running:

        def active(action: str) -> bool:
            name = f"overload.envoy.overload_actions.{action}.active"
            with urllib.request.urlopen(
                f"http://127.0.0.1:{running.admin_port}/stats?format=json&filter=^{name}$",
                timeout=5,
            ) as response:
                return bool(json.load(response)["stats"][0]["value"])

        deadline = time.monotonic() + 10
        while not active("stop_accepting_requests"):
            assert time.monotonic() < deadline, "the heap's overload actions never fired"
            time.sleep(0.05)
        assert active("disable_http_keepalive") and active("shrink_heap")
        refused = httpx.get(f"{running.url}/v1/catalog")
    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert refused.headers["connection"] == "close"
    body = refused.json()
    assert body["code"] == 14
    assert body["details"][0]["reason"] == "UPSTREAM_UNAVAILABLE"
    no_envoy_headers(refused)
    assert len(upstream.calls) == before
