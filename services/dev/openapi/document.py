"""The whole document: the operations of the services the edge transcodes, the schemas
they need, the error every operation may answer (a JSON google.rpc.Status) and bearer
JWT authentication."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.dev.openapi.descriptors import Index
from services.dev.openapi.operations import ERROR_RESPONSE, bindings, operation
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


@dataclass(frozen=True)
class Info:
    title: str
    version: str
    description: str


def build(index: Index, services: Sequence[str], info: Info) -> dict[str, Any]:
    """The OpenAPI document of ``services`` (full names) as ``index`` defines them."""
    paths: dict[str, dict[str, Schema]] = {}
    extra: dict[str, Schema] = dict(_error_detail_components(index))
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
    schemas = components(
        index, paths, responses, overrides={STATUS: _status_schema(index)}, extra=extra
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
                "description": "Seconds to wait before retrying (429, 503).",
                "schema": {"type": "integer"},
            }
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


def _error_detail_components(index: Index) -> dict[str, Schema]:
    """``StatusDetail``: one of the detail messages as an Any (its fields beside `@type`),
    told apart by `@type`; and a component for each such packed detail."""
    made: dict[str, Schema] = {}
    mapping = {}
    for detail in ERROR_DETAILS:
        if detail not in index.messages:
            raise ValueError(f"the descriptor set lacks {detail} (google/rpc/error_details)")
        name = detail.rsplit(".", 1)[-1] + "Detail"
        type_url = TYPE_URL_PREFIX + detail
        made[name] = {
            "allOf": [
                {
                    "type": "object",
                    "required": ["@type"],
                    "properties": {"@type": {"type": "string", "enum": [type_url]}},
                },
                {"$ref": PROTO_REF + detail},
            ]
        }
        mapping[type_url] = COMPONENT_REF + name
    made["StatusDetail"] = {
        "description": "An error detail as a google.protobuf.Any: `@type` says which.",
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "@type", "mapping": mapping},
    }
    return made
