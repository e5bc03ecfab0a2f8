"""Every answer Envoy makes by itself is a JSON google.rpc.Status with a stable reason, and a
JSON body over the limit is refused before Envoy buffers it: memory stays flat under the
100 MB-body attack that once took Envoy from 212 MB to 1.4 GB."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.dev import edge
from services.dev.processes import Child, free_port
from services.dev.stack import Stack
from services.kit.settings import EnvReader
from tests.support.edges import SERVICES, routes, running_edge

INVALID_TOKEN = {"authorization": "Bearer not.a.jwt"}
OVER_LIMIT = edge.DEFAULT_MAX_JSON_BODY + 1
MiB = 1024 * 1024


def assert_status(response: httpx.Response, http_status: int, code: int, reason: str) -> None:
    assert response.status_code == http_status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["code"] == code
    assert body["message"]
    assert body["details"] == [
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "atelier.dev",
        }
    ]


@pytest.mark.parametrize(
    ("method", "path", "body", "http_status", "code", "reason"),
    [
        ("GET", "/v1/nothing-here", None, 404, 5, "ROUTE_NOT_FOUND"),
        ("DELETE", "/v1/catalog", None, 405, 12, "METHOD_NOT_ALLOWED"),
        ("POST", "/atelier.creation.v1.AdminService/GrantPoints", b"{}", 404, 5, "ROUTE_NOT_FOUND"),
        ("GET", "/v1/catalog?bogus=1", None, 400, 3, "INVALID_QUERY_PARAMETER"),
        ("GET", "/v1/jobs?pageSize=ten", None, 400, 3, "INVALID_QUERY_PARAMETER"),
        ("POST", "/v1/jobs", b'{"modelId": ', 400, 3, "MALFORMED_JSON"),
        # An object for a number: the transcoder's own refusal (the routes filter checks
        # only the forms the transcoder would take).
        ("POST", "/v1/jobs", b'{"width": {}}', 400, 3, "MALFORMED_JSON"),
        ("POST", "/v1/jobs", b"[" + b"1," * OVER_LIMIT + b"1]", 413, 3, "REQUEST_TOO_LARGE"),
    ],
)
def test_envoys_own_errors_are_json_statuses(
    edge_url: str,
    token: str,
    method: str,
    path: str,
    body: bytes | None,
    http_status: int,
    code: int,
    reason: str,
) -> None:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    response = httpx.request(method, f"{edge_url}{path}", headers=headers, content=body)
    assert_status(response, http_status, code, reason)


def test_a_chunked_body_over_the_limit_is_413(edge_url: str) -> None:
    pieces = (b"[" + b"1," * 4096 for _ in range(OVER_LIMIT // 8192 + 1))
    response = httpx.post(
        f"{edge_url}/v1/jobs",
        headers={**INVALID_TOKEN, "content-type": "application/json"},
        content=pieces,
    )
    assert "content-length" not in response.request.headers
    assert_status(response, 413, 3, "REQUEST_TOO_LARGE")


def test_a_body_under_the_limit_reaches_the_service(edge_url: str) -> None:
    # 60 KiB of JSON: through the edge, judged (and refused) by creation itself.
    body = b'{"prompt": "' + b"a" * (60 * 1024) + b'"}'
    response = httpx.post(
        f"{edge_url}/v1/jobs",
        headers={**INVALID_TOKEN, "content-type": "application/json"},
        content=body,
    )
    assert response.status_code == 401
    assert response.json()["details"][0]["reason"] == "TOKEN_MALFORMED"


def test_headers_too_large_is_431(edge_url: str) -> None:
    response = httpx.get(f"{edge_url}/v1/catalog", headers={"x-padding": "p" * (96 * 1024)})
    assert_status(response, 431, 3, "HEADERS_TOO_LARGE")


def raw_exchange(port: int, head: str) -> httpx.Response:
    """Sends a request head as written (no client library sends a broken one, or lies
    about Content-Length) and reads Envoy's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head.encode())
        answer = http.client.HTTPResponse(conn)
        answer.begin()
        return httpx.Response(answer.status, headers=answer.getheaders(), content=answer.read())


@pytest.mark.parametrize(
    ("head", "http_status", "reason"),
    [
        ("GET /v1/cat alog HTTP/1.1\r\nhost: edge\r\n\r\n", 400, "MALFORMED_REQUEST"),
        (
            "GET /v1/catalog HTTP/1.1\r\nhost: edge\r\ncontent-length: x\r\n\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        # Anything else Envoy refuses by itself still gets a Status (here HTTP/1.0: 426).
        ("GET /v1/catalog HTTP/1.0\r\n\r\n", 426, "BAD_REQUEST"),
    ],
)
def test_requests_envoy_cannot_parse_get_a_status(
    stack: Stack, head: str, http_status: int, reason: str
) -> None:
    assert_status(raw_exchange(stack.ports.envoy, head), http_status, 3, reason)


def test_object_upload_limits_answer_json_too(stack: Stack, edge_url: str) -> None:
    # The object route keeps its own 20 MiB bound and wants a declared length.
    path = "/media-objects/ai_input/2026/01/x"
    promised = f"PUT {path} HTTP/1.1\r\nhost: edge\r\ncontent-length: {20 * MiB + 1}\r\n\r\n"
    assert_status(raw_exchange(stack.ports.envoy, promised), 413, 3, "REQUEST_TOO_LARGE")
    chunked = httpx.put(f"{edge_url}{path}", content=iter([b"a", b"b"]))
    assert_status(chunked, 411, 3, "LENGTH_REQUIRED")


def test_the_services_own_errors_pass_unchanged(edge_url: str, token: str) -> None:
    missing = httpx.get(
        f"{edge_url}/v1/jobs/00000000-0000-0000-0000-000000000000",
        headers={"authorization": f"Bearer {token}"},
    )
    assert missing.status_code == 404
    assert missing.json()["details"][0]["reason"] == "JOB_NOT_FOUND"
    unauthenticated = httpx.get(f"{edge_url}/v1/catalog")
    assert unauthenticated.status_code == 401
    assert unauthenticated.json()["details"][0]["reason"] == "TOKEN_MISSING"


@contextlib.contextmanager
def edge_in_front_of(upstream: int, work: Path, route_timeout: str | None = None) -> Iterator[str]:
    """The same edge config, every cluster pointing at ``upstream``; optionally with a
    shorter timeout on the routes that have one."""
    config = edge.render(
        listen_port=free_port(),
        admin_port=free_port(),
        upstream_ports=dict.fromkeys(SERVICES, upstream),
    )
    for route in routes(config):
        if route_timeout and route.get("route", {}).get("timeout", "0s") != "0s":
            route["route"]["timeout"] = route_timeout
            # A gRPC route's bound is its maximum stream duration (the route timeout does
            # not apply to gRPC without a grpc-timeout).
            if "max_stream_duration" in route["route"]:
                route["route"]["max_stream_duration"]["max_stream_duration"] = route_timeout
    with running_edge(config, work) as running:
        yield running.url


@pytest.fixture(scope="module")
def edge_without_upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Every cluster points at a port nobody listens on."""
    with edge_in_front_of(free_port(), tmp_path_factory.mktemp("edge-down")) as url:
        yield url


def test_a_service_that_never_answers_is_504(tmp_path: Path) -> None:
    # Takes connections (the kernel completes them) and never says a word.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        with edge_in_front_of(port, tmp_path, route_timeout="1s") as url:
            response = httpx.get(f"{url}/v1/catalog", headers={"authorization": "Bearer x"})
    assert_status(response, 504, 4, "UPSTREAM_TIMEOUT")


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/catalog"), ("POST", "/v1/jobs"), ("GET", "/media-objects/ai_input/x")],
)
def test_a_service_down_is_503_unavailable_with_retry_after(
    edge_without_upstreams: str, method: str, path: str
) -> None:
    response = httpx.request(
        method,
        f"{edge_without_upstreams}{path}",
        headers={"content-type": "application/json"},
        content=b"{}" if method == "POST" else None,
    )
    assert_status(response, 503, 14, "UPSTREAM_UNAVAILABLE")
    assert response.headers["retry-after"] == "1"
    assert "upstream connect error" not in response.text


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak since the last reset) of a process, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def send_huge_body(port: int, *, chunked: bool, size: int = 100 * MiB) -> bytes:
    """POSTs ``size`` bytes of JSON with an invalid token as fast as Envoy takes them;
    returns whatever Envoy answered."""
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {size}"
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nhost: edge\r\nauthorization: Bearer not.a.jwt\r\n"
        f"content-type: application/json\r\n{framing}\r\n\r\n"
    )
    piece = b"[" + b"1," * (256 * 1024)
    if chunked:
        piece = b"%x\r\n%s\r\n" % (len(piece), piece)
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head.encode())
        sent = 0
        try:
            while sent < size:
                conn.sendall(piece)
                sent += len(piece)
        except OSError:
            pass  # Envoy answered and closed: the point of the test.
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except OSError:
            pass
    return answer


def test_huge_bodies_leave_envoys_memory_flat(stack: Stack) -> None:
    envoy: Child = next(c for c in stack.children if c.name == "envoy")
    pid = envoy.process.pid  # the envoy console script execs the real binary: same pid
    assert Path(f"/proc/{pid}/exe").resolve().name == "envoy"
    # Reset the peak so VmHWM afterwards is the peak during the attack.
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = memory_mib(pid)
    answers: list[bytes] = []
    attackers = [
        threading.Thread(
            target=lambda chunked=chunked: answers.append(
                send_huge_body(stack.ports.envoy, chunked=chunked)
            )
        )
        for chunked in (False, True, False)
    ]
    for attacker in attackers:
        attacker.start()
    for attacker in attackers:
        attacker.join(120)
    after = memory_mib(pid)
    # Each request may hold at most the 64 KiB limit plus Envoy's per-connection read
    # buffer (1 MiB) before it is refused: a few MiB for three. 32 MiB leaves room for
    # allocator noise and is far below a single 100 MB body (which Envoy held ~4.5 times
    # over when it buffered).
    assert after["VmHWM"] - before["VmRSS"] < 32, (before, after)
    assert after["VmRSS"] - before["VmRSS"] < 32, (before, after)
    assert len(answers) == 3
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"reason":"REQUEST_TOO_LARGE"' in answer


def test_the_json_body_limit_is_a_setting_rendered_before_the_transcoder() -> None:
    reader = EnvReader({"ATELIER_EDGE_MAX_JSON_BODY": "4096"})
    limit = edge.max_json_body(reader)
    reader.finish()
    config = edge.render(
        listen_port=1,
        admin_port=2,
        upstream_ports={"creation": 3, "media": 4, "notify": 5, "media_http": 6},
        max_json_body=limit,
    )
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    names = [f["name"] for f in manager["http_filters"]]
    assert names.index(edge.BUFFER) < names.index(edge.TRANSCODER)
    assert manager["http_filters"][names.index(edge.BUFFER)]["typed_config"] == {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": 4096,
    }
    # Only JSON is held whole: object uploads and native gRPC stream through.
    routed = [r for r in manager["route_config"]["virtual_hosts"][0]["routes"] if "route" in r]
    assert routed
    for route in routed:
        assert route["typed_per_filter_config"][edge.BUFFER]["disabled"] is True, route
