"""The edge fuzzed from its own OpenAPI document (gen/openapi.json, as the edge serves it
at /openapi.json) with schemathesis: seeded, a bounded number of valid and invalid
requests per operation, signed in as a fresh user. Every answer must be documented (its
status code, content type, headers and body schema), no answer a 5xx, and every error a
JSON google.rpc.Status with a stable ErrorInfo reason. The watch streams are left out:
they stay open until their job ends (their edge behaviour is in
test_notify_streams_edge.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis import BaseSchema, Case, CheckContext, Response

from services.kit.auth import issue_token
from services.kit.errors import DOMAIN
from services.kit.settings import DEV_JWT_SECRET

pytestmark = pytest.mark.acceptance

DOCUMENT = Path(__file__).resolve().parents[2] / "gen" / "openapi.json"
STREAMING = "x-server-streaming"
SEED = 14
EXAMPLES_PER_OPERATION = 12


@schemathesis.check
def error_is_a_json_status(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """An error answer is a google.rpc.Status as JSON with an ErrorInfo that names a reason
    in atelier's domain."""
    if response.status_code < 400:
        return None
    assert response.headers.get("content-type", [""])[0].startswith("application/json")
    body: Any = response.json()
    assert isinstance(body, dict), body
    assert isinstance(body.get("code"), int) and body["code"] > 0, body
    assert isinstance(body.get("message"), str), body
    infos = [
        d for d in body.get("details", []) if d.get("@type", "").endswith("/google.rpc.ErrorInfo")
    ]
    assert infos and infos[0].get("reason") and infos[0].get("domain") == DOMAIN, body
    return True


def load_document(token: str) -> BaseSchema:
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "request-timeout": 10,
            "auth": {"openapi": {"bearerAuth": {"bearer": token}}},
            "generation": {
                "mode": "all",
                "max-examples": EXAMPLES_PER_OPERATION,
                "deterministic": True,
                "database": "none",
            },
            "phases": {"stateful": {"enabled": False}},
            "checks": {
                # Most valid-looking requests name things that do not exist: 404 is right.
                "positive_data_acceptance": {"enabled": False},
                # Proto3 JSON parsing is lenient on purpose: an enum may be sent as its
                # number, a 64-bit integer as a JSON number. The document shows only the
                # canonical forms, so such "invalid" requests are rightly accepted.
                "negative_data_rejection": {"enabled": False},
                # The edge answers a method no route has like an unknown path: 404
                # ROUTE_NOT_FOUND (the transcoder's reject_unknown_method), not 405.
                "unsupported_method": {"enabled": False},
            },
        }
    )
    loaded = schemathesis.openapi.from_path(DOCUMENT, config=config)
    return loaded.exclude(func=lambda ctx: bool(ctx.operation.definition.raw.get(STREAMING)))


# A user of its own (no stack needed to sign a development token), so nothing the fuzzing
# creates shows up for another test's user.
USER = f"fuzz-{uuid.uuid4().hex[:12]}"
schema = load_document(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", USER, 3600))


def test_the_edge_serves_the_document_to_anyone_as_cacheable_json(edge_url: str) -> None:
    served = httpx.get(f"{edge_url}/openapi.json")
    assert served.status_code == 200
    assert served.headers["content-type"] == "application/json"
    assert "max-age" in served.headers["cache-control"]
    assert served.content == DOCUMENT.read_bytes()


def test_a_header_grpc_cannot_carry_is_dropped_at_the_edge(edge_url: str) -> None:
    """The fuzzer's first find: a header name outside gRPC's metadata alphabet (legal in
    HTTP) made the service refuse the call, a 500 without an ErrorInfo."""
    token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", USER, 600)
    answer = httpx.get(
        f"{edge_url}/v1/balance", headers={"authorization": f"Bearer {token}", "rs+x$0f": "1"}
    )
    assert answer.status_code == 200, answer.text


def test_a_watch_stream_is_json_lines_as_documented(edge_url: str) -> None:
    """The streams are not fuzzed (they stay open); what the document says of them holds:
    the content type, one JSON object per line, the message's fields."""
    watch = json.loads(DOCUMENT.read_text())["paths"]["/v1/jobs:watch"]["get"]
    assert watch[STREAMING] is True
    [content_type] = watch["responses"]["200"]["content"]
    token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", USER, 600)
    headers = {"authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{edge_url}/v1/jobs:watch", headers=headers, timeout=10) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"] == content_type
        # A user without jobs: the snapshot is empty, its end marker comes first.
        first = json.loads(next(stream.iter_lines()))
    assert set(first) == {"snapshotEnd", "cursor"}, first


@schema.parametrize()
def test_the_edge_answers_as_its_document_says(case: Case, edge_url: str) -> None:
    case.call_and_validate(base_url=edge_url)
