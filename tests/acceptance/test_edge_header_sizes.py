"""A request's headers, at every size, through the real edge in front of the real services:
either the service answers it, or the edge refuses it as 431 HEADERS_TOO_LARGE (native gRPC:
INVALID_ARGUMENT with that reason). Never RESOURCE_EXHAUSTED / 429, which clients retry:
the services' own metadata limit (16 KiB) must lie beyond anything the edge lets through."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from services.dev.stack import Stack

KiB = 1024
# The sweep, and finer steps where the edge's limit (12 KiB in all) lies.
SIZES = sorted({4, 8, 12, 16, 32, 60, 100} | {11 + step / 8 for step in range(17)})
# Header values this long are over the edge's limit whatever else the request carries;
# values up to this one are under it, with room for the client's own headers.
OVERSIZED = 12 * KiB
UNDER = 10 * KiB
# Over HTTP/2 one header over 64 KiB closes the connection in Envoy's HPACK decoder, before
# any filter sees the request: native gRPC is swept up to there (docs/edge.md says so).
HPACK_FIELD_LIMIT = 64 * KiB

Headers = Callable[[int], dict[str, str]]


def padded_authorization(size: int) -> dict[str, str]:
    return {"authorization": "Bearer " + "a" * (size - len("Bearer "))}


def padded_other(token: str) -> Headers:
    return lambda size: {"authorization": f"Bearer {token}", "x-padding": "p" * size}


@pytest.fixture(params=["authorization", "x-padding"])
def headers_of_size(request: pytest.FixtureRequest, token: str) -> Headers:
    return padded_authorization if request.param == "authorization" else padded_other(token)


def served_status(headers_of_size: Headers) -> int:
    """What the service answers when the request reaches it: a padded authorization is
    not a JWT (401 TOKEN_MALFORMED), a padded other header changes nothing (200)."""
    return 401 if headers_of_size is padded_authorization else 200


def assert_headers_too_large(response: httpx.Response) -> None:
    assert response.status_code == 431, (response.status_code, response.text[:300])
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["code"] == 3
    assert "12 KiB" in body["message"]
    assert body["details"] == [
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "HEADERS_TOO_LARGE",
            "domain": "atelier.dev",
        }
    ]


def assert_refused_past_one_size(answers: dict[float, str], served: str, refused: str) -> None:
    """Every size up to some point between UNDER and OVERSIZED is served, every larger one
    refused (``answers``: KiB → what came back)."""
    assert not [k for k, a in answers.items() if a not in (served, refused)], answers
    first = min(k for k, a in answers.items() if a == refused)
    assert UNDER < first * KiB <= OVERSIZED, answers
    assert all((a == refused) == (k >= first) for k, a in answers.items()), answers


def test_json_requests_get_the_service_or_431_at_every_size(
    edge_url: str, headers_of_size: Headers
) -> None:
    answers: dict[float, str] = {}
    with httpx.Client(timeout=30) as client:
        for kib in SIZES:
            response = client.get(f"{edge_url}/v1/catalog", headers=headers_of_size(int(kib * KiB)))
            answers[kib] = str(response.status_code)
            if response.status_code == 431:
                assert_headers_too_large(response)
    assert "429" not in answers.values(), answers
    assert_refused_past_one_size(answers, str(served_status(headers_of_size)), "431")


def test_a_long_query_string_counts_too(edge_url: str, token: str) -> None:
    # The path is a header too (and the transcoder copies a JSON request's path into
    # another): under the limit the service judges the page token, over it the edge refuses.
    headers = {"authorization": f"Bearer {token}"}
    # (httpx refuses a URL over 64 KiB.)
    for kib in (2, 4, 5, 5.5, 6, 8, 16, 32, 60):
        query = "pageToken=" + "t" * int(kib * KiB)
        response = httpx.get(f"{edge_url}/v1/jobs?{query}", headers=headers, timeout=30)
        assert response.status_code in (400, 431), (kib, response.text[:300])
        if response.status_code == 400:
            assert kib <= 6, kib
            assert response.json()["details"][0]["reason"] == "INVALID_PAGE_TOKEN"
        else:
            assert kib >= 5, kib
            assert_headers_too_large(response)


@pytest.fixture
def catalog(stack: Stack) -> Iterator[creation_service_pb2_grpc.CreationServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{stack.ports.envoy}") as channel:
        yield creation_service_pb2_grpc.CreationServiceStub(channel)


def list_catalog(
    stub: creation_service_pb2_grpc.CreationServiceStub, headers: dict[str, str]
) -> tuple[str, status_pb2.Status | None]:
    """The call's status code name, and its google.rpc.Status when it carries one."""
    try:
        stub.ListCatalog(
            creation_service_pb2.ListCatalogRequest(), metadata=list(headers.items()), timeout=30
        )
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
        return code.name, rpc_status.from_call(error)  # type: ignore[arg-type]
    return "OK", None


def test_native_grpc_gets_the_service_or_invalid_argument_at_every_size(
    catalog: creation_service_pb2_grpc.CreationServiceStub, headers_of_size: Headers
) -> None:
    answers: dict[float, str] = {}
    for kib in [k for k in SIZES if k * KiB < HPACK_FIELD_LIMIT]:
        answers[kib], status = list_catalog(catalog, headers_of_size(int(kib * KiB)))
        if answers[kib] == "INVALID_ARGUMENT":
            assert status is not None, kib
            info = error_details_pb2.ErrorInfo()
            assert status.details[0].Unpack(info)
            assert (info.reason, info.domain) == ("HEADERS_TOO_LARGE", "atelier.dev")
            assert "12 KiB" in status.message
    assert "RESOURCE_EXHAUSTED" not in answers.values(), answers
    served = "UNAUTHENTICATED" if headers_of_size is padded_authorization else "OK"
    assert_refused_past_one_size(answers, served, "INVALID_ARGUMENT")
