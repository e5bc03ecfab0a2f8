"""HTTP that clients branch on, through the real Envoy in front of the real stack: the two
kinds of 409 told apart by `retry-after` alone, a JSON body field the message does not
have refused like an unknown query parameter, a method a route does not take answered
405 with `allow`, CORS for the allowed origins, and the rate-limit headers on every
answer (docs/edge.md)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
import pytest

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from services.dev import edge
from services.dev.openapi.descriptors import Index
from services.dev.openapi.schemas import WELL_KNOWN
from services.dev.postgres import connect_kwargs
from services.dev.processes import free_port
from services.dev.stack import Stack
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.edges import RunningEdge, manager, running_edge

pytestmark = pytest.mark.acceptance

DESCRIPTOR = Path(__file__).resolve().parents[2] / "gen" / "atelier.binpb"
RATE_LIMIT_HEADERS = ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset")
ALLOWED_ORIGIN = "https://app.example.com"


def error(response: httpx.Response) -> tuple[int, str, list[dict[str, Any]]]:
    """(HTTP status, ErrorInfo reason, field violations) of an error answer."""
    body = response.json()
    reasons = [d["reason"] for d in body["details"] if d["@type"].endswith("ErrorInfo")]
    violations = [
        v
        for d in body["details"]
        if d["@type"].endswith("BadRequest")
        for v in d["fieldViolations"]
    ]
    return response.status_code, reasons[0], violations


# --- 409: retry with the same key, or never ---------------------------------------------


async def test_a_reused_idempotency_key_is_409_without_retry_after(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    headers = {**user.headers, "idempotency-key": f"k-{uuid.uuid4().hex}"}
    first = await http.post(f"{edge_url}/v1/jobs", headers=headers, json=job_body(asset))
    assert first.status_code == 200, first.text
    other = await http.post(
        f"{edge_url}/v1/jobs", headers=headers, json=job_body(asset, prompt="something else")
    )
    assert error(other)[:2] == (409, "IDEMPOTENCY_KEY_REUSED")
    assert "retry-after" not in other.headers
    assert other.json()["code"] == 6  # ALREADY_EXISTS


async def test_a_busy_user_is_409_with_retry_after(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    """ABORTED (USER_BUSY here; LOCK_TIMEOUT and UPLOAD_CHANGED alike): the same request
    may succeed when sent again, with the same key, after `retry-after` seconds."""
    user = User()
    asset = await put_input(stack, user.user_id)
    holder = await asyncpg.connect(**connect_kwargs(stack.database_url))
    try:
        await holder.execute("BEGIN")
        await holder.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('creation.user:' || $1::text, 0))",
            user.user_id,
        )
        headers = {**user.headers, "idempotency-key": f"k-{uuid.uuid4().hex}"}
        busy = await http.post(f"{edge_url}/v1/jobs", headers=headers, json=job_body(asset))
        assert error(busy)[:2] == (409, "USER_BUSY"), busy.text
        assert busy.json()["code"] == 10  # ABORTED
        assert int(busy.headers["retry-after"]) >= 0
    finally:
        await holder.close()
    await asyncio.sleep(float(busy.headers["retry-after"]))
    again = await http.post(f"{edge_url}/v1/jobs", headers=headers, json=job_body(asset))
    assert again.status_code == 200, again.text


# --- unknown body fields ----------------------------------------------------------------

SOME_ID = "6f1c1e2a-5b7d-4c3e-9a8b-0d1e2f3a4b5c"
BODY_ROUTES = [
    ("/v1/jobs", {"modelId": "stub-fast"}),
    ("/v1/uploads", {"purpose": "ASSET_PURPOSE_AI_INPUT"}),
    (f"/v1/jobs/{SOME_ID}:cancel", {}),
    (f"/v1/uploads/{SOME_ID}:complete", {}),
    ("/v1/devices", {"environment": "APNS_ENVIRONMENT_SANDBOX"}),
    (f"/v1/jobs/{SOME_ID}/liveActivities", {"pushToken": "ab"}),
]


@pytest.mark.parametrize(("path", "body"), BODY_ROUTES)
def test_an_unknown_body_field_is_400_naming_it(
    edge_url: str, token: str, path: str, body: dict[str, Any]
) -> None:
    headers = {"authorization": f"Bearer {token}"}
    answer = httpx.post(f"{edge_url}{path}", headers=headers, json={**body, "colour": "red"})
    status, reason, violations = error(answer)
    assert (status, reason) == (400, "MALFORMED_JSON"), answer.text
    assert answer.json()["code"] == 3
    assert [v["field"] for v in violations] == ["colour"]
    assert "colour" in answer.json()["message"]


def nested_cases() -> list[tuple[str, dict[str, Any], str]]:
    """For every message-typed field of SubmitJobRequest (a nested message, or the values
    of a map of messages): a body with an unknown field inside it, and its path."""
    index = Index.read(DESCRIPTOR.read_bytes())
    cases = []
    for field_ in index.messages["atelier.creation.v1.SubmitJobRequest"].field:
        if field_.type != field_.TYPE_MESSAGE or field_.type_name.lstrip(".") in WELL_KNOWN:
            continue
        if index.is_map_entry(field_):
            entry = index.message(field_.type_name)
            value = next(f for f in entry.field if f.name == "value")
            if value.type != value.TYPE_MESSAGE:
                continue
            body = {field_.json_name: {"steps": {"bogus": 1}}}
            cases.append((field_.json_name, body, f"{field_.json_name}.steps.bogus"))
        else:
            body = {field_.json_name: {"bogus": 1}}
            cases.append((field_.json_name, body, f"{field_.json_name}.bogus"))
    assert cases, "SubmitJobRequest has no nested message to check"
    return cases


@pytest.mark.parametrize(("name", "body", "field"), nested_cases())
async def test_an_unknown_field_inside_a_nested_message_is_400_naming_its_path(
    stack: Stack,
    edge_url: str,
    http: httpx.AsyncClient,
    name: str,
    body: dict[str, Any],
    field: str,
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    sent = {k: v for k, v in job_body(asset).items() if k != name}
    answer = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json={**sent, **body})
    status, reason, violations = error(answer)
    assert (status, reason) == (400, "MALFORMED_JSON"), answer.text
    assert [v["field"] for v in violations] == [field]


async def test_known_fields_by_either_name_reach_the_service(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    body = job_body(asset)
    body["model_id"] = body.pop("modelId")  # proto3 JSON takes the proto name too
    answer = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=body)
    assert answer.status_code == 200, answer.text


# --- 32-bit integers out of range --------------------------------------------------------

INT32_RANGE = "must be an integer from -2147483648 to 2147483647"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/jobs", {"modelId": "stub-fast", "numOutputs": 3_000_000_000}, "numOutputs"),
        ("/v1/jobs", {"modelId": "stub-fast", "num_outputs": -(2**31) - 1}, "num_outputs"),
        ("/v1/jobs", {"modelId": "stub-fast", "width": 1.5}, "width"),
        ("/v1/jobs", {"modelId": "stub-fast", "width": 1e400}, "width"),
        ("/v1/uploads", {"purpose": "ASSET_PURPOSE_AI_INPUT", "sizeBytes": 2**31}, "sizeBytes"),
    ],
)
def test_a_32_bit_integer_out_of_range_is_400_naming_it(
    edge_url: str, token: str, path: str, body: dict[str, Any], field: str
) -> None:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    # 1e400 as JSON text: Python's json would write it as Infinity, which is no JSON.
    content = json.dumps(body).replace("Infinity", "1e400").encode()
    answer = httpx.post(f"{edge_url}{path}", headers=headers, content=content)
    assert answer.headers["content-type"] == "application/json", answer.text
    status, reason, violations = error(answer)
    assert (status, reason) == (400, "MALFORMED_JSON"), answer.text
    assert answer.json()["code"] == 3
    assert [(v["field"], v["description"]) for v in violations] == [(field, INT32_RANGE)]
    assert answer.json()["message"] == f'"{field}" {INT32_RANGE}'


async def test_32_bit_integers_in_range_reach_the_service(
    stack: Stack, edge_url: str, http: httpx.AsyncClient
) -> None:
    user = User()
    asset = await put_input(stack, user.user_id)
    # The largest int32 passes the edge: the service judges it (too many outputs).
    answer = await http.post(
        f"{edge_url}/v1/jobs",
        headers=user.headers,
        json={**job_body(asset), "numOutputs": 2**31 - 1},
    )
    status, reason, violations = error(answer)
    assert status == 400 and reason != "MALFORMED_JSON", answer.text
    assert [v["field"] for v in violations] == ["num_outputs"]
    # An integral number written with a fraction is an integer to JSON Schema too: the
    # job is made. (As a string, proto3 JSON's other form, it is refused: the next test.)
    body = {**job_body(asset), "numOutputs": 1.0, "requestId": uuid.uuid4().hex}
    made = await http.post(f"{edge_url}/v1/jobs", headers=user.headers, json=body)
    assert made.status_code == 200, made.text
    job = made.json()["job"]
    assert job["numOutputs"] == 1
    cancel = f"{edge_url}/v1/jobs/{job['jobId']}:cancel"
    await http.post(cancel, headers=user.headers, json={})


@pytest.mark.parametrize(
    ("path", "body", "field", "says"),
    [
        # An enum by its number, null for a field, a 32-bit integer as a string (the
        # transcoder takes each as proto3 JSON allows; the document does not).
        ("/v1/devices", {"environment": 1}, "environment", "name"),
        ("/v1/devices", {"locale": None}, "locale", "null"),
        ("/v1/uploads", {"sizeBytes": "12"}, "sizeBytes", "JSON number"),
        ("/v1/uploads", {"purpose": 1}, "purpose", "name"),
        ("/v1/jobs", {"modelId": None}, "modelId", "null"),
        ("/v1/jobs", {"width": "512"}, "width", "JSON number"),
        ("/v1/jobs", {"height": "3000000000"}, "height", "JSON number"),
        ("/v1/jobs", {"numOutputs": "1"}, "numOutputs", "JSON number"),
    ],
)
def test_a_form_the_document_does_not_give_a_field_is_400_naming_it(
    edge_url: str, token: str, path: str, body: dict[str, Any], field: str, says: str
) -> None:
    headers = {"authorization": f"Bearer {token}"}
    answer = httpx.post(f"{edge_url}{path}", headers=headers, json=body)
    status, reason, violations = error(answer)
    assert (status, reason) == (400, "MALFORMED_JSON"), answer.text
    assert [v["field"] for v in violations] == [field]
    assert says in violations[0]["description"], violations


@pytest.mark.parametrize("query", ["mediaKind=1", "media_kind=0", "mediaKind=%2D1", "statuses=2"])
def test_an_enum_query_parameter_by_its_number_is_400_naming_it(
    edge_url: str, token: str, query: str
) -> None:
    path = "/v1/jobs" if query.startswith("statuses") else "/v1/catalog"
    headers = {"authorization": f"Bearer {token}"}
    answer = httpx.get(f"{edge_url}{path}?{query}", headers=headers)
    status, reason, violations = error(answer)
    assert (status, reason) == (400, "INVALID_QUERY_PARAMETER"), answer.text
    assert [v["field"] for v in violations] == [query.split("=")[0]]
    named = httpx.get(f"{edge_url}/v1/catalog?mediaKind=MEDIA_KIND_IMAGE", headers=headers)
    assert named.status_code == 200, named.text


def test_a_body_that_is_not_json_is_still_the_transcoders_to_refuse(
    edge_url: str, token: str
) -> None:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    answer = httpx.post(f"{edge_url}/v1/jobs", headers=headers, content=b'{"colour": ')
    assert error(answer)[:2] == (400, "MALFORMED_JSON")
    assert error(answer)[2] == []


# --- 405 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/catalog", "GET"),
        ("PUT", "/v1/jobs", "GET, POST"),
        ("GET", f"/v1/jobs/{SOME_ID}:cancel", "POST"),
        ("POST", f"/v1/jobs/{SOME_ID}", "DELETE, GET"),
        ("PATCH", "/v1/jobs:watch", "GET"),
        ("POST", "/v1/balance?x=1", "GET"),
    ],
)
def test_a_method_a_route_does_not_take_is_405_with_allow(
    edge_url: str, token: str, method: str, path: str, allow: str
) -> None:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    answer = httpx.request(method, f"{edge_url}{path}", headers=headers, content=b"{}")
    assert error(answer)[:2] == (405, "METHOD_NOT_ALLOWED"), answer.text
    assert answer.headers["allow"] == allow
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["code"] == 12


def test_an_unknown_path_is_still_404_and_native_grpc_is_untouched(
    edge_url: str, token: str
) -> None:
    headers = {"authorization": f"Bearer {token}"}
    assert error(httpx.get(f"{edge_url}/v1/nothing-here", headers=headers))[:2] == (
        404,
        "ROUTE_NOT_FOUND",
    )
    port = int(edge_url.rsplit(":", 1)[1])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        reply = stub.ListCatalog(
            creation_service_pb2.ListCatalogRequest(),
            metadata=[("authorization", f"Bearer {token}")],
            timeout=10,
        )
    assert reply.models


# --- CORS and rate-limit headers --------------------------------------------------------


@pytest.fixture(scope="module")
def cors_edges(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RunningEdge]]:
    """Two more edges in front of the stack: one allowing ALLOWED_ORIGIN, one any origin."""
    with (
        running_edge(_config(stack, (ALLOWED_ORIGIN,)), tmp_path_factory.mktemp("cors-one")) as one,
        running_edge(_config(stack, ("*",)), tmp_path_factory.mktemp("cors-any")) as anyone,
    ):
        yield {"one": one, "any": anyone}


def _config(stack: Stack, origins: tuple[str, ...]) -> dict[str, Any]:
    return edge.render(
        listen_port=free_port(),
        admin_port=free_port(),
        upstream_ports=stack.ports.upstreams(),
        options=edge.EdgeOptions(cors_origins=origins),
    )


def test_a_preflight_from_an_allowed_origin_is_204_without_credentials(
    cors_edges: dict[str, RunningEdge],
) -> None:
    answer = httpx.options(
        f"{cors_edges['one'].url}/v1/jobs",
        headers={
            "origin": ALLOWED_ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type, idempotency-key",
        },
    )
    assert answer.status_code == 204, answer.text
    assert answer.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "origin" in answer.headers["vary"]
    assert answer.headers["access-control-allow-methods"] == "GET, POST"
    assert "idempotency-key" in answer.headers["access-control-allow-headers"]
    assert "access-control-allow-credentials" not in answer.headers
    assert all(name in answer.headers for name in RATE_LIMIT_HEADERS)


def test_answers_to_an_allowed_origin_are_readable_and_others_are_not(
    cors_edges: dict[str, RunningEdge], token: str
) -> None:
    auth = {"authorization": f"Bearer {token}"}
    url = cors_edges["one"].url
    ok = httpx.get(f"{url}/v1/catalog", headers={**auth, "origin": ALLOWED_ORIGIN})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    exposed = ok.headers["access-control-expose-headers"]
    assert "retry-after" in exposed and "x-ratelimit-remaining" in exposed
    # An error, from the service and from the edge itself, is readable too.
    for path in ("/v1/jobs/not-a-uuid", "/v1/nothing-here"):
        refused = httpx.get(f"{url}{path}", headers={**auth, "origin": ALLOWED_ORIGIN})
        assert refused.status_code >= 400
        assert refused.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    elsewhere = httpx.get(f"{url}/v1/catalog", headers={**auth, "origin": "https://evil.example"})
    assert elsewhere.status_code == 200
    assert "access-control-allow-origin" not in elsewhere.headers
    preflight = httpx.options(
        f"{url}/v1/jobs",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 204
    assert "access-control-allow-origin" not in preflight.headers


def test_any_origin_is_star_and_never_with_credentials(
    cors_edges: dict[str, RunningEdge], token: str
) -> None:
    answer = httpx.get(
        f"{cors_edges['any'].url}/v1/catalog",
        headers={"authorization": f"Bearer {token}", "origin": "https://anywhere.example"},
    )
    assert answer.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in answer.headers


def test_the_default_edge_allows_no_other_origin(edge_url: str, token: str) -> None:
    answer = httpx.get(
        f"{edge_url}/v1/catalog",
        headers={"authorization": f"Bearer {token}", "origin": ALLOWED_ORIGIN},
    )
    assert answer.status_code == 200
    assert "access-control-allow-origin" not in answer.headers


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", "/v1/catalog", {}, 200),
        ("GET", "/openapi.json", {}, 200),
        ("GET", "/v1/jobs/not-a-uuid", {}, 400),
        ("GET", "/v1/nothing-here", {}, 404),
        ("DELETE", "/v1/catalog", {}, 405),
        ("GET", "/v1/catalog", {"x-big": "x" * 13000}, 431),
        ("GET", "/v1/catalog", {"authorization": "Bearer not.a.jwt"}, 401),
    ],
)
def test_every_answer_carries_the_rate_limit_headers(
    edge_url: str, token: str, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    answer = httpx.request(
        method, f"{edge_url}{path}", headers={"authorization": f"Bearer {token}", **headers}
    )
    assert answer.status_code == status, answer.text
    assert int(answer.headers["x-ratelimit-limit"]) == edge.DEV_RATE_LIMIT_BURST
    assert 0 <= int(answer.headers["x-ratelimit-remaining"]) <= edge.DEV_RATE_LIMIT_BURST
    assert int(answer.headers["x-ratelimit-reset"]) >= 0


def test_a_limited_client_sees_its_bucket_drain(stack: Stack, tmp_path: Path, token: str) -> None:
    config = edge.render(
        listen_port=free_port(),
        admin_port=free_port(),
        upstream_ports=stack.ports.upstreams(),
        options=edge.EdgeOptions(rate_limit_burst=3, rate_limit_per_second=1),
    )
    # One token a minute: no refill between the requests, however slow the machine.
    for http_filter in manager(config)["http_filters"]:
        if http_filter["name"] == edge.RATE_LIMIT:
            limit = http_filter["typed_config"]
            for bucket in (
                limit["token_bucket"],
                *(d["token_bucket"] for d in limit["descriptors"]),
            ):
                bucket["fill_interval"] = "60s"
    auth = {"authorization": f"Bearer {token}"}
    with running_edge(config, tmp_path) as limited:
        remaining = []
        for _ in range(4):
            answer = httpx.get(f"{limited.url}/v1/catalog", headers=auth)
            assert answer.headers["x-ratelimit-limit"] == "3"
            remaining.append((answer.status_code, answer.headers["x-ratelimit-remaining"]))
    assert remaining == [(200, "2"), (200, "1"), (200, "0"), (429, "0")]


def test_a_method_http_does_not_define_is_405_too(edge_url: str, token: str) -> None:
    answer = httpx.request(
        "QUERY", f"{edge_url}/v1/catalog", headers={"authorization": f"Bearer {token}"}
    )
    assert error(answer)[:2] == (405, "METHOD_NOT_ALLOWED"), answer.text
    # Envoy refuses a QUERY without content-type before the routes filter sees it.
    assert answer.headers["allow"] == "GET, POST, DELETE"
    sent = httpx.request(
        "QUERY",
        f"{edge_url}/v1/catalog",
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        content=b"{}",
    )
    assert error(sent)[:2] == (405, "METHOD_NOT_ALLOWED"), sent.text
    assert sent.headers["allow"] == "GET"


def test_a_watch_stream_is_served_as_ndjson(edge_url: str, token: str) -> None:
    headers = {"authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{edge_url}/v1/jobs:watch", headers=headers, timeout=10) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"] == "application/x-ndjson"
    # A refusal before the first line is an ordinary JSON error.
    refused = httpx.get(f"{edge_url}/v1/jobs/not-a-uuid:watch", headers=headers)
    assert refused.status_code == 400
    assert refused.headers["content-type"] == "application/json"
