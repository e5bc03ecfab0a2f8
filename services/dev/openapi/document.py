"""The whole document: the operations of the services the edge transcodes, the schemas
they need, the error every operation may answer (a JSON google.rpc.Status) and bearer
JWT authentication."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.dev.openapi.descriptors import Index
from services.dev.openapi.operations import (
    ERROR_RESPONSE,
    RATE_LIMIT_HEADERS,
    bindings,
    operation,
)
from services.dev.openapi.schemas import (
    COMPONENT_REF,
    PROTO_REF,
    Schema,
    components,
    message_schema,
)

OPENAPI_VERSION = "3.0.3"
STATUS = "google.rpc.Status"
# The details an error carries (services/kit/errors.py, the edge's own replies).
ERROR_DETAILS = ("google.rpc.ErrorInfo", "google.rpc.BadRequest", "google.rpc.RetryInfo")
TYPE_URL_PREFIX = "type.googleapis.com/"
SECURITY_SCHEME = "bearerAuth"
ERROR_REASON = "ErrorReason"
REASON_PREFIX = "ERROR_REASON_"


@dataclass(frozen=True)
class Info:
    title: str
    version: str
    description: str


def build(index: Index, services: Sequence[str], info: Info) -> dict[str, Any]:
    """The OpenAPI document of ``services`` (full names) as ``index`` defines them."""
    paths: dict[str, dict[str, Schema]] = {}
    reasons = _error_reasons(index, services)
    extra: dict[str, Schema] = dict(_error_detail_components(index, reasons is not None))
    if reasons is not None:
        extra[ERROR_REASON] = reasons
    tags = []
    for service in services:
        tag: Schema = {"name": service.rsplit(".", 1)[-1]}
        if index.comment(service):
            tag["description"] = index.comment(service)
        tags.append(tag)
    for binding in bindings(index, services):
        made = operation(index, binding)
        on_path = paths.setdefault(made.path, {})
        if made.verb in on_path:
            raise ValueError(f"two operations for {made.verb.upper()} {made.path}")
        on_path[made.verb] = made.spec
        if made.body_component:
            extra[made.body_component[0]] = made.body_component[1]
    responses = {"Error": _error_response()}
    _add_links(paths)
    schemas = components(
        index,
        paths,
        responses,
        overrides={STATUS: _status_schema(index)},
        extra=extra,
        answer_only=_answer_only(index, services),
        closed=_in_requests(index, services),
    )
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": info.title, "version": info.version, "description": info.description},
        "servers": [{"url": "/", "description": "the edge that serves this document"}],
        "security": [{SECURITY_SCHEME: []}],
        "tags": tags,
        "paths": {path: paths[path] for path in sorted(paths)},
        "components": {
            "schemas": schemas,
            "responses": responses,
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "Authorization: Bearer <JWT>; every operation needs one.",
                }
            },
        },
    }


# How a client goes on from one answer (OpenAPI links): upload, complete, submit, then
# read, wait for, watch, cancel or delete the job. (operation, link, target operation,
# the target's parameters as runtime expressions, its body.)
LINKS: tuple[tuple[str, str, str, dict[str, str], Any], ...] = (
    (
        "MediaService_CreateUpload",
        "CompleteUpload",
        "MediaService_CompleteUpload",
        {"assetId": "$response.body#/asset/assetId"},
        None,
    ),
    (
        "MediaService_CompleteUpload",
        "GetAsset",
        "MediaService_GetAsset",
        {"assetId": "$response.body#/asset/assetId"},
        None,
    ),
    (
        "MediaService_CompleteUpload",
        "SubmitJob",
        "CreationService_SubmitJob",
        {},
        {"inputAssetId": "$response.body#/asset/assetId"},
    ),
    *(
        (
            "CreationService_SubmitJob",
            target.split("_", 1)[1],
            target,
            {"jobId": "$response.body#/job/jobId"},
            None,
        )
        for target in (
            "CreationService_GetJob",
            "CreationService_WaitJob",
            "CreationService_CancelJob",
            "CreationService_DeleteJob",
            "NotifyService_WatchJob",
        )
    ),
)


def _add_links(paths: dict[str, dict[str, Schema]]) -> None:
    """The links of :data:`LINKS` whose operations are both in the document."""
    by_id = {op["operationId"]: op for verbs in paths.values() for op in verbs.values()}
    for source, name, target, parameters, body in LINKS:
        if source not in by_id or target not in by_id:
            continue
        link: Schema = {"operationId": target}
        if parameters:
            link["parameters"] = parameters
        if body is not None:
            link["requestBody"] = body
        by_id[source]["responses"]["200"].setdefault("links", {})[name] = link


def _answer_only(index: Index, services: Sequence[str]) -> frozenset[str]:
    """The messages only answers carry (never a request, nor inside one): the edge
    prints their primitive fields always, so those are required."""
    answers: set[str] = set()
    for service in services:
        for method in index.services[service].method:
            _reach(index, method.output_type.lstrip("."), answers)
    return frozenset(answers - _in_requests(index, services))


def _in_requests(index: Index, services: Sequence[str]) -> frozenset[str]:
    """The messages a request carries (or is)."""
    requests: set[str] = set()
    for service in services:
        for method in index.services[service].method:
            _reach(index, method.input_type.lstrip("."), requests)
    return frozenset(requests)


def _reach(index: Index, name: str, seen: set[str]) -> None:
    if name in seen or name not in index.messages:
        return
    seen.add(name)
    for field_ in index.messages[name].field:
        if field_.type == field_.TYPE_MESSAGE:
            _reach(index, field_.type_name.lstrip("."), seen)


def _error_response() -> Schema:
    assert ERROR_RESPONSE.endswith("/Error")
    return {
        "description": (
            "A google.rpc.Status as JSON: `code` (the gRPC code), `message` and `details`, "
            "which carry an ErrorInfo with a stable `reason` (domain `atelier.dev`), field "
            "violations (BadRequest) for bad input, and a RetryInfo when a retry may help."
        ),
        "headers": {
            "retry-after": {
                "description": (
                    "Seconds to wait before sending the same request again (0: at once). "
                    "Always on 409 ABORTED (retry with the same key), never on 409 "
                    "ALREADY_EXISTS (do not retry); on 429 and 503."
                ),
                "schema": {"type": "integer", "minimum": 0},
            },
            "allow": {
                "description": "On 405: the methods the path takes.",
                "schema": {"type": "string"},
            },
            **RATE_LIMIT_HEADERS,
        },
        "content": {"application/json": {"schema": {"$ref": PROTO_REF + STATUS}}},
    }


def _status_schema(index: Index) -> Schema:
    """google.rpc.Status, its details typed: each is one of the known error details."""
    schema = message_schema(index, STATUS)
    schema["required"] = ["code", "message"]
    details = schema["properties"]["details"]
    details["items"] = {"$ref": COMPONENT_REF + "StatusDetail"}
    return schema


def _error_reasons(index: Index, services: Sequence[str]) -> Schema | None:
    """Every ErrorInfo.reason the services' packages list (their ``ErrorReason`` enums,
    the wire string being the value's name without ``ERROR_REASON_``), each explained;
    None when no package has one."""
    said: dict[str, list[str]] = {}
    found = False
    for package in dict.fromkeys(index.packages[s] for s in services):
        name = f"{package}.ErrorReason" if package else "ErrorReason"
        if name not in index.enums:
            continue
        found = True
        for value in index.enums[name].value:
            if value.number == 0 or value.options.deprecated:
                continue
            comment = " ".join(index.comment(f"{name}.{value.name}").split())
            wire = value.name.removeprefix(REASON_PREFIX)
            notes = said.setdefault(wire, [])
            short = package.split(".")[-2] if package.count(".") else package
            if comment and comment not in [n.split(": ", 1)[-1] for n in notes]:
                notes.append(f"{short}: {comment}")
    if not found:
        return None
    lines = [
        f"- `{wire}`" + (" — " + " / ".join(notes) if notes else "")
        for wire, notes in sorted(said.items())
    ]
    return {
        "type": "string",
        "description": (
            "ErrorInfo.reason: a stable string per failure (domain `atelier.dev`), with "
            "what a client should do.\n\n" + "\n".join(lines)
        ),
        "enum": sorted(said),
    }


def _error_detail_components(index: Index, typed_reason: bool = False) -> dict[str, Schema]:
    """``StatusDetail``: one of the detail messages as an Any (its fields beside `@type`),
    told apart by `@type`; and a component for each such packed detail. With
    ``typed_reason``, ErrorInfo's `reason` is one of the ``ErrorReason`` component."""
    made: dict[str, Schema] = {}
    mapping = {}
    for detail in ERROR_DETAILS:
        if detail not in index.messages:
            raise ValueError(f"the descriptor set lacks {detail} (google/rpc/error_details)")
        name = detail.rsplit(".", 1)[-1] + "Detail"
        type_url = TYPE_URL_PREFIX + detail
        packed: Schema = {
            "type": "object",
            "required": ["@type"],
            "properties": {"@type": {"type": "string", "enum": [type_url]}},
        }
        if typed_reason and detail == "google.rpc.ErrorInfo":
            packed["required"] = ["@type", "reason", "domain"]
            packed["properties"]["reason"] = {"$ref": COMPONENT_REF + ERROR_REASON}
        made[name] = {"allOf": [packed, {"$ref": PROTO_REF + detail}]}
        mapping[type_url] = COMPONENT_REF + name
    made["StatusDetail"] = {
        "description": "An error detail as a google.protobuf.Any: `@type` says which.",
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "@type", "mapping": mapping},
    }
    return made
