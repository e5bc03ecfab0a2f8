"""google.api.http rules as OpenAPI operations, as the edge's transcoder applies them:
path variables bind request fields, `body: "*"` takes every field the path does not bind,
`body: "field"` that one field, and every other field (GET, DELETE) is a query parameter
named by its lowerCamelCase JSON path (`pageSize`, `filter.status`; repeated: the key
repeated)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from google.api import annotations_pb2, field_behavior_pb2, http_pb2
from google.protobuf import descriptor_pb2

from services.dev.openapi.descriptors import Index, behaviors
from services.dev.openapi.rules import REFUSALS, Refusal
from services.dev.openapi.schemas import (
    PROTO_REF,
    SCALAR_WELL_KNOWN,
    WELL_KNOWN,
    FieldProto,
    Schema,
    is_required,
    message_schema,
    ruled,
    value_schema,
)

HTTP_METHODS = ("get", "put", "post", "delete", "patch")
ERROR_RESPONSE = "#/components/responses/Error"
STATUS_REF = PROTO_REF + "google.rpc.Status"
# On an operation's 400: the refusals of requests its schema allows (rules.REFUSALS).
REFUSALS_EXTENSION = "x-schema-valid-refusals"
# How the edge answers a server-streaming RPC (deploy/envoy/envoy.yaml,
# print_options.stream_newline_delimited): one JSON object per line.
STREAM_CONTENT_TYPE = "application/x-ndjson"
STREAM_EXTENSION = "x-server-streaming"
_VARIABLE = re.compile(r"\{[^}]*\}")
# Request headers some operations read (services/kit/idempotency.py; RFC 7240 Prefer).
IDEMPOTENCY_KEY: Schema = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": (
        "The request's idempotency key, instead of (or equal to) `requestId` in the body: "
        "the same key with the same request answers what the first one made, for good; "
        "with another request, 409 `IDEMPOTENCY_KEY_REUSED` (never retried). Empty: no key."
    ),
    "schema": {"type": "string", "pattern": "^(?:[A-Za-z0-9._:\\-]{1,128})?$"},
}
PREFER: Schema = {
    "name": "Prefer",
    "in": "header",
    "required": False,
    "description": (
        "RFC 7240 preferences. `wait=N` (seconds, at most 60) asks for the answer once the "
        "job is finished or N seconds have passed; `Preference-Applied` in the answer says "
        "whether it was applied. Preferences the server does not apply are ignored."
    ),
    "schema": {"type": "string"},
}
REQUEST_HEADERS: dict[str, tuple[Schema, ...]] = {
    "CreationService_SubmitJob": (IDEMPOTENCY_KEY, PREFER),
    "MediaService_CreateUpload": (IDEMPOTENCY_KEY,),
}
# On every answer (deploy/envoy/envoy.yaml: the rate limit filter), docs/edge.md.
RATE_LIMIT_HEADERS: Schema = {
    "x-ratelimit-limit": {
        "description": "Requests this client may send at once (its token bucket's size).",
        "schema": {"type": "integer", "minimum": 0},
    },
    "x-ratelimit-remaining": {
        "description": "Requests left in the bucket now.",
        "schema": {"type": "integer", "minimum": 0},
    },
    "x-ratelimit-reset": {
        "description": "Seconds until the bucket is next refilled.",
        "schema": {"type": "integer", "minimum": 0},
    },
}


@dataclass(frozen=True)
class Binding:
    """One HTTP binding of one RPC (a rule, or one of its additional_bindings)."""

    service: str
    method: descriptor_pb2.MethodDescriptorProto
    verb: str
    template: str
    body: str
    response_body: str
    # 0 for the rule itself, n for its n-th additional binding.
    ordinal: int

    @property
    def service_name(self) -> str:
        return self.service.rsplit(".", 1)[-1]

    @property
    def operation_id(self) -> str:
        suffix = f"_{self.ordinal + 1}" if self.ordinal else ""
        return f"{self.service_name}_{self.method.name}{suffix}"


def bindings(index: Index, services: Sequence[str]) -> Iterator[Binding]:
    """Every HTTP binding of the services' methods, in declaration order; methods without
    a google.api.http rule have none."""
    for service in services:
        for method in index.services[service].method:
            if not method.options.HasExtension(annotations_pb2.http):
                continue
            rule = method.options.Extensions[annotations_pb2.http]
            for ordinal, each in enumerate((rule, *rule.additional_bindings)):
                verb, template = _pattern(each)
                yield Binding(
                    service, method, verb, template, each.body, each.response_body, ordinal
                )


def _pattern(rule: http_pb2.HttpRule) -> tuple[str, str]:
    kind = rule.WhichOneof("pattern")
    if kind in HTTP_METHODS:
        return kind, str(getattr(rule, kind))
    if kind == "custom" and rule.custom.kind.lower() in (*HTTP_METHODS, "head", "options"):
        return rule.custom.kind.lower(), rule.custom.path
    raise ValueError(f"HTTP rule {kind} {rule} cannot be written in OpenAPI")


@dataclass(frozen=True)
class Operation:
    path: str
    verb: str
    spec: Schema
    # A body schema of its own (the request without its path-bound fields), by name.
    body_component: tuple[str, Schema] | None


def operation(index: Index, binding: Binding) -> Operation:
    method = binding.method
    request = method.input_type.lstrip(".")
    bound = [_resolve(index, request, field_path) for field_path in _variables(binding.template)]
    parameters = [_path_parameter(index, fields, pattern) for fields, pattern in bound]
    bound_paths = {_proto_path(fields) for fields, _ in bound}
    body_component = None
    spec: Schema = {"operationId": binding.operation_id, "tags": [binding.service_name]}
    comment = index.comment(f"{binding.service}.{method.name}")
    if comment:
        spec["summary"] = _first_sentence(comment)
        spec["description"] = comment
    if binding.body == "*":
        omit = frozenset(fields[0][1].name for fields, _ in bound if len(fields) == 1)
        if omit:
            name = f"{binding.service_name}{method.name}Body"
            body_component = (name, message_schema(index, request, omit, closed=True))
            schema: Schema = {"$ref": f"#/components/schemas/{name}"}
            required = "required" in body_component[1]
        else:
            schema = {"$ref": PROTO_REF + request}
            required = any(is_required(f) for f in index.messages[request].field)
        spec["requestBody"] = _json_body(schema, required)
    else:
        if binding.body:
            _, body = _resolve(index, request, binding.body)[0][-1]
            spec["requestBody"] = _json_body(value_schema(index, body), is_required(body))
            bound_paths.add(binding.body)
        parameters.extend(_query_parameters(index, request, bound_paths))
    parameters.extend(dict(header) for header in REQUEST_HEADERS.get(binding.operation_id, ()))
    if parameters:
        spec["parameters"] = parameters
    spec["responses"] = _responses(index, binding)
    if method.server_streaming:
        spec[STREAM_EXTENSION] = True
    if method.client_streaming:
        # The transcoder takes a client stream as one JSON array of request messages.
        spec["x-client-streaming"] = True
        body = spec.get("requestBody", {}).get("content", {}).get("application/json", {})
        if "schema" in body:
            body["schema"] = {"type": "array", "items": body["schema"]}
    if method.options.deprecated:
        spec["deprecated"] = True
    names = iter(_json_path(fields) for fields, _ in bound)
    path = _VARIABLE.sub(lambda _: "{" + next(names) + "}", binding.template)
    return Operation(path, binding.verb, spec, body_component)


def _json_body(schema: Schema, required: bool) -> Schema:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _responses(index: Index, binding: Binding) -> Schema:
    method = binding.method
    response = method.output_type.lstrip(".")
    schema: Schema = {"$ref": PROTO_REF + response}
    if binding.response_body:
        _, field_ = _resolve(index, response, binding.response_body)[0][-1]
        schema = value_schema(index, field_)
    if method.server_streaming:
        ok: Schema = {
            "description": (
                "A stream, one JSON object per line (newline-delimited JSON), each of this "
                "schema, sent as they happen. The HTTP status is fixed before the first "
                "message: a later failure arrives as a message of its own."
            ),
            "content": {STREAM_CONTENT_TYPE: {"schema": schema}},
        }
    else:
        ok = {"description": "OK", "content": {"application/json": {"schema": schema}}}
    ok["headers"] = dict(RATE_LIMIT_HEADERS)
    answers: Schema = {"200": ok}
    refusals = REFUSALS.get(binding.operation_id, ())
    if refusals:
        answers["400"] = _refusals_response(refusals)
    return {**answers, "4XX": {"$ref": ERROR_RESPONSE}, "5XX": {"$ref": ERROR_RESPONSE}}


def _refusals_response(refusals: Sequence[Refusal]) -> Schema:
    """The operation's 400: a bad request, or one of ``refusals`` of a request that
    matches its schema, each listed for a reader and in :data:`REFUSALS_EXTENSION`."""
    lines = [
        f"- `{refusal.reason}`"
        + (f" ({', '.join(f'`{f}`' for f in refusal.fields)})" if refusal.fields else "")
        + f": {refusal.why}"
        for refusal in refusals
    ]
    return {
        "description": (
            "INVALID_ARGUMENT or FAILED_PRECONDITION, as google.rpc.Status JSON. Besides "
            "requests the schema refuses, these refuse requests it allows (the verdict "
            "rests on data, or compares fields), with the field violations named:\n\n"
            + "\n".join(lines)
        ),
        "headers": dict(RATE_LIMIT_HEADERS),
        "content": {"application/json": {"schema": {"$ref": STATUS_REF}}},
        REFUSALS_EXTENSION: [
            {"reason": refusal.reason, "fields": list(refusal.fields)} for refusal in refusals
        ],
    }


def _variables(template: str) -> list[str]:
    """A rule's path variables, each as ``field.path`` or ``field.path=pattern``."""
    return [m.group(0)[1:-1] for m in _VARIABLE.finditer(template)]


Resolved = list[tuple[str, FieldProto]]


def _resolve(index: Index, message: str, variable: str) -> tuple[Resolved, str]:
    """The fields along a variable's dotted field path (each with the message that holds
    it), and the variable's pattern (`*` unless it says otherwise)."""
    field_path, _, pattern = variable.partition("=")
    fields: Resolved = []
    for part in field_path.strip().split("."):
        found = [f for f in index.messages[message].field if f.name == part]
        if not found:
            raise ValueError(f"{message} has no field {part} (in {field_path})")
        fields.append((message, found[0]))
        message = found[0].type_name.lstrip(".")
    return fields, pattern.strip() or "*"


def _proto_path(fields: Resolved) -> str:
    return ".".join(f.name for _, f in fields)


def _json_path(fields: Resolved) -> str:
    return ".".join(f.json_name for _, f in fields)


def _path_parameter(index: Index, fields: Resolved, pattern: str) -> Schema:
    """A path variable, named by its JSON path like a query parameter. OpenAPI cannot say
    that a variable like `{name=jobs/*}` spans segments: its pattern goes into the text."""
    message, leaf = fields[-1]
    description = index.comment(f"{message}.{leaf.name}")
    if pattern != "*":
        description += f" The path segments must match `{pattern}`."
    parameter: Schema = {"name": _json_path(fields), "in": "path", "required": True}
    if description.strip():
        parameter["description"] = description.strip()
    parameter["schema"] = ruled(message, leaf, value_schema(index, leaf))
    return parameter


def _query_parameters(
    index: Index,
    message: str,
    bound: set[str],
    proto_prefix: str = "",
    json_prefix: str = "",
    seen: tuple[str, ...] = (),
) -> list[Schema]:
    """A parameter for every scalar, enum or scalar-like well-known field that neither the
    path nor the body binds, nested messages flattened into dotted names. Maps, repeated
    messages and free-form types cannot be written in a query."""
    parameters: list[Schema] = []
    for field_ in index.messages[message].field:
        proto_path = proto_prefix + field_.name
        json_path = json_prefix + field_.json_name
        if (
            proto_path in bound
            or index.is_map_entry(field_)
            or field_behavior_pb2.OUTPUT_ONLY in behaviors(field_)
        ):
            continue
        if field_.type == field_.TYPE_MESSAGE:
            type_name = field_.type_name.lstrip(".")
            if type_name not in SCALAR_WELL_KNOWN:
                if not (
                    type_name in WELL_KNOWN
                    or field_.label == field_.LABEL_REPEATED
                    or type_name in seen
                ):
                    parameters.extend(
                        _query_parameters(
                            index,
                            type_name,
                            bound,
                            f"{proto_path}.",
                            f"{json_path}.",
                            (*seen, message),
                        )
                    )
                continue
        parameter: Schema = {"name": json_path, "in": "query"}
        description = index.comment(f"{message}.{field_.name}")
        if description:
            parameter["description"] = description
        parameter["required"] = not proto_prefix and is_required(field_)
        parameter["schema"] = ruled(message, field_, value_schema(index, field_))
        if field_.options.deprecated:
            parameter["deprecated"] = True
        parameters.append(parameter)
    return parameters


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    return match.group(1) if match else flat
