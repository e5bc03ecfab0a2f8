"""The edge fuzzed from its own OpenAPI document (gen/openapi.json, as the edge serves it
at /openapi.json) with schemathesis: seeded, a bounded number of valid and invalid
requests per operation and short sequences along the document's links, signed in as a
fresh user, with every check schemathesis has (`--checks all`). Every answer must be
documented (its status code, content type, headers and body schema), no answer a 5xx,
every error a JSON google.rpc.Status with a stable ErrorInfo reason, a schema-valid
request accepted (or refused only as its operation's 400 declares) and a schema-invalid
one refused. The watch streams are left out:
they stay open until their job ends (their edge behaviour is in
test_notify_streams_edge.py)."""

from __future__ import annotations

import json
import tomllib
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from schemathesis import BaseSchema, Case, CheckContext, Response
from schemathesis.checks import CHECKS, is_check_class

from services.kit.auth import issue_token
from services.kit.errors import DOMAIN
from services.kit.settings import DEV_JWT_SECRET

pytestmark = pytest.mark.acceptance

DOCUMENT = Path(__file__).resolve().parents[2] / "gen" / "openapi.json"
STREAMING = "x-server-streaming"
REFUSALS = "x-schema-valid-refusals"
# schemathesis's configuration for the document (made with it by `make proto`).
CONFIG = DOCUMENT.with_name("schemathesis.toml")
SEED = 14
EXAMPLES_PER_OPERATION = 12
STATEFUL_SEQUENCES, STATEFUL_STEPS = 20, 6


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


def _refusals(operation: dict[str, Any]) -> list[dict[str, Any]]:
    """The refusals of schema-valid requests the operation's 400 declares."""
    found: list[dict[str, Any]] = operation.get("responses", {}).get("400", {}).get(REFUSALS, [])
    return found


def _named(field: str, declared: list[str]) -> bool:
    return any(field == name or field.startswith((f"{name}.", f"{name}[")) for name in declared)


@schemathesis.check
def valid_data_is_refused_only_as_declared(
    ctx: CheckContext, response: Response, case: Case
) -> bool | None:
    """A request its schema allows that is answered 400 is one of the refusals the
    operation's 400 declares: its reason, and field violations on the fields it names
    (positive_data_acceptance lets these operations answer 400 at all)."""
    if response.status_code != 400 or case.meta is None:
        return None
    if not case.meta.generation.mode.is_positive:
        return None
    body: Any = response.json()
    infos = [d for d in body.get("details", []) if d.get("@type", "").endswith(".ErrorInfo")]
    reason = infos[0].get("reason") if infos else None
    fields = [
        v.get("field", "")
        for d in body.get("details", [])
        if d.get("@type", "").endswith(".BadRequest")
        for v in d.get("fieldViolations", [])
    ]
    declared = [r for r in _refusals(case.operation.definition.raw) if r["reason"] == reason]
    assert declared, f"a schema-valid request was refused {reason} (not declared): {body}"
    assert all(_named(f, declared[0]["fields"]) for f in fields), (
        f"{reason} named fields its declaration does not: {body}"
    )
    return True


def load_document(token: str) -> BaseSchema:
    """The document with gen/schemathesis.toml (what any run of it should use: the
    statuses positive_data_acceptance allows widened to 400 only where the operation
    declares its refusals of schema-valid requests, which the check above holds to; 413
    and 431 count as refusals; the streams off), seeded and signed in."""
    config = schemathesis.Config.from_dict(
        {
            **tomllib.loads(CONFIG.read_text()),
            "seed": SEED,
            "request-timeout": 10,
            "auth": {"openapi": {"bearerAuth": {"bearer": token}}},
            "generation": {
                "mode": "all",
                "max-examples": EXAMPLES_PER_OPERATION,
                "deterministic": True,
                "database": "none",
            },
            # Every distinct failure of an operation in one report.
            "continue-on-failure": True,
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
    assert content_type == "application/x-ndjson"
    token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", USER, 600)
    headers = {"authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{edge_url}/v1/jobs:watch", headers=headers, timeout=10) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"] == content_type
        # A user without jobs: the snapshot is empty, its end marker comes first.
        first = json.loads(next(stream.iter_lines()))
    assert set(first) == {"snapshotEnd", "cursor"}, first


def test_every_check_schemathesis_has_runs_on_every_operation() -> None:
    """`--checks all`: no check is turned off for any operation, ours included."""
    names = {check.__name__ for check in CHECKS.get_all() if not is_check_class(check)}
    assert {"positive_data_acceptance", "negative_data_rejection", "use_after_free"} <= names
    assert {"error_is_a_json_status", "valid_data_is_refused_only_as_declared"} <= names
    for result in schema.get_all_operations():
        operation = result.ok()
        checks = schema.config.checks_config_for(operation=operation, phase=None)
        assert [n for n in sorted(names) if not checks.get_by_name(name=n).enabled] == []


@schema.parametrize()
def test_the_edge_answers_as_its_document_says(case: Case, edge_url: str) -> None:
    case.call_and_validate(base_url=edge_url)


def test_sequences_along_the_links_answer_as_the_document_says(edge_url: str) -> None:
    """Stateful: calls chained along the document's links (upload, complete, submit, then
    the job's reads and writes), every check on each answer (use_after_free and
    ensure_resource_availability judge the sequence). Bounded: a few short sequences."""
    machine = schema.as_state_machine()

    class AgainstTheEdge(machine):  # type: ignore[misc,valid-type]
        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            return {"base_url": edge_url}

    run_state_machine_as_test(
        AgainstTheEdge,
        settings=settings(
            max_examples=STATEFUL_SEQUENCES,
            stateful_step_count=STATEFUL_STEPS,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        ),
    )
