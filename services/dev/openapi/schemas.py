"""Messages and enums as OpenAPI 3.0 schemas, following the proto3 JSON mapping as the
edge prints and parses it: lowerCamelCase names (the descriptor's json_name), 64-bit
integers as decimal strings, enums by name, well-known types in their JSON forms.

Schemas refer to a message or enum by its full proto name (``proto:pkg.Name``) while the
document is built; :func:`components` then makes a component of every type referred to
(and of what those refer to), names each and rewrites the references."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from google.api import field_behavior_pb2
from google.protobuf import descriptor_pb2

from services.dev.openapi.descriptors import Index, behaviors
from services.dev.openapi.rules import FIELD_RULES, MESSAGE_RULES

Schema = dict[str, Any]
FieldProto = descriptor_pb2.FieldDescriptorProto
PROTO_REF = "proto:"
COMPONENT_REF = "#/components/schemas/"

_INT64 = {"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"}
_UINT64 = {"type": "string", "format": "uint64", "pattern": "^[0-9]+$"}
_INT32 = {"type": "integer", "format": "int32"}
_UINT32 = {"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295}

_SCALARS: dict[int, Schema] = {
    FieldProto.TYPE_DOUBLE: {"type": "number", "format": "double"},
    FieldProto.TYPE_FLOAT: {"type": "number", "format": "float"},
    FieldProto.TYPE_INT64: _INT64,
    FieldProto.TYPE_SINT64: _INT64,
    FieldProto.TYPE_SFIXED64: _INT64,
    FieldProto.TYPE_UINT64: _UINT64,
    FieldProto.TYPE_FIXED64: _UINT64,
    FieldProto.TYPE_INT32: _INT32,
    FieldProto.TYPE_SINT32: _INT32,
    FieldProto.TYPE_SFIXED32: _INT32,
    FieldProto.TYPE_UINT32: _UINT32,
    FieldProto.TYPE_FIXED32: _UINT32,
    FieldProto.TYPE_BOOL: {"type": "boolean"},
    FieldProto.TYPE_STRING: {"type": "string"},
    FieldProto.TYPE_BYTES: {"type": "string", "format": "byte"},
}

# Well-known types have JSON forms of their own; they are written inline, never as
# components. Those that are one JSON string or scalar may also be query parameters.
SCALAR_WELL_KNOWN: dict[str, Schema] = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {
        "type": "string",
        "pattern": "^-?[0-9]+(\\.[0-9]{1,9})?s$",
        "description": "A duration in seconds with an `s` suffix, e.g. `1.5s`.",
    },
    "google.protobuf.FieldMask": {
        "type": "string",
        "description": "Comma-separated lowerCamelCase field paths.",
    },
    "google.protobuf.DoubleValue": {"type": "number", "format": "double", "nullable": True},
    "google.protobuf.FloatValue": {"type": "number", "format": "float", "nullable": True},
    "google.protobuf.Int64Value": {**_INT64, "nullable": True},
    "google.protobuf.UInt64Value": {**_UINT64, "nullable": True},
    "google.protobuf.Int32Value": {**_INT32, "nullable": True},
    "google.protobuf.UInt32Value": {**_UINT32, "nullable": True},
    "google.protobuf.BoolValue": {"type": "boolean", "nullable": True},
    "google.protobuf.StringValue": {"type": "string", "nullable": True},
    "google.protobuf.BytesValue": {"type": "string", "format": "byte", "nullable": True},
}
WELL_KNOWN: dict[str, Schema] = {
    **SCALAR_WELL_KNOWN,
    "google.protobuf.Struct": {"type": "object", "additionalProperties": True},
    # Any JSON value, null included.
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array", "items": {}},
    "google.protobuf.Empty": {"type": "object"},
    "google.protobuf.Any": {
        "type": "object",
        "description": "A message of the type `@type` names, its fields beside `@type`.",
        "required": ["@type"],
        "properties": {"@type": {"type": "string"}},
        "additionalProperties": True,
    },
}


def type_ref(field_: FieldProto) -> Schema:
    """The schema of one value of a message- or enum-typed field."""
    name = field_.type_name.lstrip(".")
    if name in WELL_KNOWN:
        return dict(WELL_KNOWN[name])
    return {"$ref": PROTO_REF + name}


def value_schema(index: Index, field_: FieldProto) -> Schema:
    """The field's JSON value: a scalar, a reference, an array or (maps) an object."""
    if index.is_map_entry(field_):
        entry = index.message(field_.type_name)
        value = next(f for f in entry.field if f.name == "value")
        return {"type": "object", "additionalProperties": single_value(index, value)}
    single = single_value(index, field_)
    if field_.label == field_.LABEL_REPEATED:
        return {"type": "array", "items": single}
    return single


def single_value(index: Index, field_: FieldProto) -> Schema:
    if field_.type in (field_.TYPE_MESSAGE, field_.TYPE_ENUM, field_.TYPE_GROUP):
        return type_ref(field_)
    return dict(_SCALARS[field_.type])


def ruled(message_name: str, field_: FieldProto, schema: Schema) -> Schema:
    """``schema`` with the rules the services check: a REQUIRED string is not empty, and
    what :data:`FIELD_RULES` says of the field (a UUID, a range, a length)."""
    rules = dict(FIELD_RULES.get(f"{message_name}.{field_.name}", {}))
    if (
        is_required(field_)
        and field_.type == field_.TYPE_STRING
        and field_.label != field_.LABEL_REPEATED
    ):
        rules.setdefault("minLength", 1)
    if "$ref" in schema and "enum" in rules:
        return rules
    if not rules or "$ref" in schema:
        return schema
    if schema.get("type") == "array":
        items = rules if "$ref" in schema["items"] and "enum" in rules else schema["items"]
        return {**schema, "items": {**items, **rules}}
    return {**schema, **rules}


def always_printed(field_: FieldProto) -> bool:
    """Whether the edge prints the field in every answer (print_options.
    always_print_primitive_fields): scalars, enums, repeated fields and maps, unless
    the field is in a oneof (proto3 `optional` included); messages only when set."""
    if field_.HasField("oneof_index"):
        return False
    return field_.label == field_.LABEL_REPEATED or field_.type not in (
        field_.TYPE_MESSAGE,
        field_.TYPE_GROUP,
    )


def field_schema(index: Index, message_name: str, field_: FieldProto) -> Schema:
    """The property a field becomes: its value with its comment and behaviours."""
    schema = ruled(message_name, field_, value_schema(index, field_))
    notes: Schema = {}
    description = index.comment(f"{message_name}.{field_.name}")
    if description:
        notes["description"] = description
    found = behaviors(field_)
    if field_behavior_pb2.OUTPUT_ONLY in found:
        notes["readOnly"] = True
    if field_behavior_pb2.INPUT_ONLY in found:
        notes["writeOnly"] = True
    if field_.options.deprecated:
        notes["deprecated"] = True
    return decorate(schema, notes)


def decorate(schema: Schema, notes: Schema) -> Schema:
    """``schema`` with ``notes`` beside it. OpenAPI 3.0 ignores keywords next to a
    ``$ref``, so a reference is wrapped in a one-element allOf first."""
    if not notes:
        return schema
    if "$ref" in schema:
        return {"allOf": [schema], **notes}
    return {**schema, **notes}


def is_required(field_: FieldProto) -> bool:
    return field_behavior_pb2.REQUIRED in behaviors(field_)


def message_schema(
    index: Index,
    name: str,
    omit: frozenset[str] = frozenset(),
    answer_only: bool = False,
    closed: bool = False,
) -> Schema:
    """A message as an object schema, without the fields named in ``omit``. A message
    only answers carry (``answer_only``) has every field the edge always prints required,
    and, for a oneof all of whose members are messages (a stream's events), exactly one
    of its members (oneOf). A ``closed`` message (one a request carries) holds no other
    property: the edge answers 400 naming a field its message does not have."""
    message = index.messages[name]
    fields = [f for f in message.field if f.name not in omit]
    schema: Schema = {"type": "object"}
    description = _join(index.comment(name), _oneof_note(message, omit))
    if description:
        schema["description"] = description
    if message.options.deprecated:
        schema["deprecated"] = True
    required = [
        f.json_name for f in fields if is_required(f) or (answer_only and always_printed(f))
    ]
    if required:
        schema["required"] = required
    schema["properties"] = {f.json_name: field_schema(index, name, f) for f in fields}
    if closed:
        schema["additionalProperties"] = False
    schema.update(MESSAGE_RULES.get(name, {}))
    if answer_only:
        events = _event_oneof(message)
        if events:
            schema["oneOf"] = [{"required": [member]} for member in events]
    return schema


def _event_oneof(message: descriptor_pb2.DescriptorProto) -> list[str]:
    """The JSON names of the members of the message's one real oneof whose members are all
    messages (each answer sets exactly one), or none."""
    found = []
    for number, _ in enumerate(message.oneof_decl):
        members = [
            f
            for f in message.field
            if f.HasField("oneof_index") and f.oneof_index == number and not f.proto3_optional
        ]
        if members and all(f.type == f.TYPE_MESSAGE for f in members):
            found.append([f.json_name for f in members])
    return found[0] if len(found) == 1 else []


def _oneof_note(message: descriptor_pb2.DescriptorProto, omit: frozenset[str]) -> str:
    """Proto3 JSON has no wrapper for a oneof: its members are plain fields, of which at
    most one is present. Say so (proto3 `optional` fields are oneofs of their own: skipped)."""
    notes = []
    for number, oneof in enumerate(message.oneof_decl):
        members = [
            f"`{f.json_name}`"
            for f in message.field
            if f.HasField("oneof_index")
            and f.oneof_index == number
            and not f.proto3_optional
            and f.name not in omit
        ]
        if members:
            notes.append(f"At most one of {', '.join(members)} is set (oneof `{oneof.name}`).")
    return " ".join(notes)


def enum_schema(index: Index, name: str) -> Schema:
    """An enum as the strings of its value names, each value's comment in the text."""
    enum = index.enums[name]
    lines = []
    for value in enum.value:
        comment = " ".join(index.comment(f"{name}.{value.name}").split())
        lines.append(f"- `{value.name}`" + (f": {comment}" if comment else ""))
    schema: Schema = {
        "type": "string",
        "description": _join(index.comment(name), "\n".join(lines)),
        "enum": [value.name for value in enum.value],
    }
    if enum.options.deprecated:
        schema["deprecated"] = True
    return schema


def _join(*parts: str) -> str:
    return "\n\n".join(part for part in parts if part)


def proto_refs(node: Any) -> Iterator[str]:
    """Every type named by a ``proto:`` reference inside ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(PROTO_REF):
                yield value.removeprefix(PROTO_REF)
            else:
                yield from proto_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from proto_refs(item)


def components(
    index: Index,
    *roots: Any,
    overrides: Mapping[str, Schema],
    extra: Mapping[str, Schema],
    answer_only: frozenset[str] = frozenset(),
    closed: frozenset[str] = frozenset(),
) -> dict[str, Schema]:
    """A component for every message and enum referred to from ``roots`` and ``extra``
    (and from those components in turn), named by its name inside its package, or by its
    full name where two types would share one. ``closed`` messages take no other property
    (:func:`message_schema`). ``overrides`` replace the schemas of the types they name;
    ``extra`` are components that are no proto type, kept by their names. Every
    ``proto:`` reference is rewritten in place."""
    made: dict[str, Schema] = {}
    pending = sorted({name for root in (*roots, extra) for name in proto_refs(root)})
    while pending:
        name = pending.pop()
        if name in made:
            continue
        if name in overrides:
            made[name] = overrides[name]
        elif name in index.enums:
            made[name] = enum_schema(index, name)
        else:
            made[name] = message_schema(
                index, name, answer_only=name in answer_only, closed=name in closed
            )
        pending.extend(sorted(set(proto_refs(made[name])) - set(made)))
    names = _component_names(index, made, set(extra))
    result = {names[name]: schema for name, schema in made.items()}
    result.update(extra)
    for node in (*roots, result):
        _rewrite(node, names)
    return dict(sorted(result.items()))


def _component_names(index: Index, types: Mapping[str, Schema], taken: set[str]) -> dict[str, str]:
    def short(name: str) -> str:
        package = index.packages[name]
        return name.removeprefix(f"{package}.") if package else name

    counts: dict[str, int] = {}
    for name in types:
        counts[short(name)] = counts.get(short(name), 0) + 1
    names = {}
    for name in types:
        chosen = short(name) if counts[short(name)] == 1 and short(name) not in taken else name
        if chosen in taken or not re.fullmatch(r"[A-Za-z0-9._-]+", chosen):
            raise ValueError(f"no usable component name for {name}")
        names[name] = chosen
    return names


def _rewrite(node: Any, names: Mapping[str, str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(PROTO_REF):
            node["$ref"] = COMPONENT_REF + names[ref.removeprefix(PROTO_REF)]
        for value in node.values():
            _rewrite(value, names)
    elif isinstance(node, list):
        for item in node:
            _rewrite(item, names)
