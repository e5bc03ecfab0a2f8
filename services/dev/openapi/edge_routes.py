"""The edge's route table as Lua (gen/edge_routes.lua), generated beside the OpenAPI
document from the same descriptor set: every JSON route's path pattern, the HTTP methods
it takes and, for a method with a body, the fields that body may hold. The edge's
`routes` Lua filter (the hand-written walker in edge_routes_filter.lua, appended to the
table) answers a method a route does not take with 405 and `allow`, and a body field the
message does not have, a 32-bit integer field's value out of its range, or a value in a
form the OpenAPI document does not give it, with 400 naming it: the transcoder drops
unknown body fields silently, its own answer to a number out of range names the field
only in its message, and it takes every form proto3 JSON allows."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from services.dev.openapi.descriptors import Index
from services.dev.openapi.operations import Binding, bindings
from services.dev.openapi.schemas import WELL_KNOWN, FieldProto

FILTER_SOURCE = Path(__file__).with_name("edge_routes_filter.lua")
_VARIABLE = re.compile(r"\{[^}]*\}")
_LUA_MAGIC = re.compile(r"([\^$()%.\[\]*+\-?])")
# The 32-bit integer types by the node the filter checks their values with.
_INT32_NODES = {
    FieldProto.TYPE_INT32: '"int32"',
    FieldProto.TYPE_SINT32: '"int32"',
    FieldProto.TYPE_SFIXED32: '"int32"',
    FieldProto.TYPE_UINT32: '"uint32"',
    FieldProto.TYPE_FIXED32: '"uint32"',
}


def path_pattern(template: str) -> str:
    """A Lua pattern matching the paths of ``template`` as the transcoder does: a
    variable is one segment without `/` or `:` (a custom verb after `:` is part of the
    route), `{x=**}` any rest."""
    parts = []
    position = 0
    for match in _VARIABLE.finditer(template):
        parts.append(_LUA_MAGIC.sub(r"%\1", template[position : match.start()]))
        variable = match.group(0)[1:-1]
        parts.append(".+" if variable.endswith("**") else "[^/:]+")
        position = match.end()
    parts.append(_LUA_MAGIC.sub(r"%\1", template[position:]))
    return "^" + "".join(parts) + "$"


def _body_node(index: Index, binding: Binding) -> str | None:
    """The Lua expression checking the method's JSON body, or None (no body)."""
    request = binding.method.input_type.lstrip(".")
    if binding.body == "*":
        return _lua_string(request)
    if binding.body:
        field_ = next(f for f in index.messages[request].field if f.name == binding.body)
        return _field_node(index, field_)
    return None


# The JSON the other scalar fields take as the document spells them (the proto3 JSON
# mapping's canonical form): the transcoder also takes an enum's number, a 64-bit integer
# as a number, a float as a string, and null for any field; the filter refuses those.
_KINDS: dict[int, str] = {
    FieldProto.TYPE_STRING: "string",
    FieldProto.TYPE_BYTES: "string",
    FieldProto.TYPE_ENUM: "enum",
    FieldProto.TYPE_BOOL: "bool",
    FieldProto.TYPE_DOUBLE: "number",
    FieldProto.TYPE_FLOAT: "number",
    **dict.fromkeys(
        (
            FieldProto.TYPE_INT64,
            FieldProto.TYPE_SINT64,
            FieldProto.TYPE_SFIXED64,
            FieldProto.TYPE_UINT64,
            FieldProto.TYPE_FIXED64,
        ),
        "int64",
    ),
}


def _field_node(index: Index, field_: FieldProto) -> str:
    """``"*"``: anything (a well-known type); ``"int32"`` / ``"uint32"``: a JSON number
    that must be an integer in that type's range; ``{kind = k}``: another scalar, a JSON
    value of that kind (``_KINDS``); none of them null; a message name: an object of that
    message's fields (each element, for a repeated field); ``{map = node}``: an object
    whose keys are free and whose values are ``node``."""
    if index.is_map_entry(field_):
        entry = index.message(field_.type_name)
        value = next(f for f in entry.field if f.name == "value")
        return "{map = " + _field_node(index, value) + "}"
    if field_.type == field_.TYPE_MESSAGE:
        name = field_.type_name.lstrip(".")
        if name not in WELL_KNOWN:
            return _lua_string(name)
        return '"*"'
    if field_.type in _INT32_NODES:
        return _INT32_NODES[field_.type]
    kind = _KINDS.get(field_.type)
    return '"*"' if kind is None else "{kind = " + _lua_string(kind) + "}"


def _enum_queries(index: Index, binding: Binding) -> list[str]:
    """The query parameters (every name the transcoder reads: the JSON and the proto name)
    of the request's top-level enum fields: the filter refuses a number there."""
    if binding.body == "*":
        return []
    found: list[str] = []
    request = binding.method.input_type.lstrip(".")
    for field_ in index.messages[request].field:
        if field_.type == field_.TYPE_ENUM and field_.name != binding.body:
            found.extend(dict.fromkeys((field_.json_name, field_.name)))
    return found


def _messages_reached(index: Index, roots: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in seen or name in WELL_KNOWN:
            continue
        seen.add(name)
        for field_ in index.messages[name].field:
            if field_.type == field_.TYPE_MESSAGE:
                pending.append(field_.type_name.lstrip("."))
    return sorted(seen - {n for n in seen if index.messages[n].options.map_entry})


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(index: Index, services: Sequence[str]) -> str:
    """The whole Lua source of the edge's routes filter."""
    routes: dict[str, dict[str, str | None]] = {}
    streams: dict[str, set[str]] = {}
    enums: dict[str, dict[str, list[str]]] = {}
    roots: list[str] = []
    for binding in bindings(index, services):
        methods = routes.setdefault(path_pattern(binding.template), {})
        node = _body_node(index, binding)
        methods[binding.verb.upper()] = node
        queries = _enum_queries(index, binding)
        if queries:
            enums.setdefault(path_pattern(binding.template), {})[binding.verb.upper()] = queries
        if binding.method.server_streaming:
            streams.setdefault(path_pattern(binding.template), set()).add(binding.verb.upper())
        if node is not None:
            roots.append(binding.method.input_type.lstrip("."))
    lines = [
        "-- Generated by `make proto` (services/dev/openapi/edge_routes.py) from protos/:",
        "-- do not edit. The JSON routes of the edge, then the filter that checks them.",
        "",
        "-- Each message's fields by every name a JSON body may use (the lowerCamelCase",
        "-- JSON name and the proto name), each with what its value may hold.",
        "local MESSAGES = {",
    ]
    for name in _messages_reached(index, roots):
        entries = []
        for field_ in index.messages[name].field:
            node = _field_node(index, field_)
            for key in dict.fromkeys((field_.json_name, field_.name)):
                entries.append(f"[{_lua_string(key)}] = {node}")
        lines.append(f"  [{_lua_string(name)}] = {{" + ", ".join(entries) + "},")
    lines += [
        "}",
        "",
        "-- Each route's path pattern and methods; a method's value checks its body",
        "-- (false: no body); `streams`: the methods that answer a stream (NDJSON);",
        "-- `enums`: each method's query parameters that name an enum value.",
        "local ROUTES = {",
    ]
    for pattern in sorted(routes):
        listed = ", ".join(
            f"{verb} = {node if node is not None else 'false'}"
            for verb, node in sorted(routes[pattern].items())
        )
        streamed = ""
        if pattern in streams:
            streamed = (
                ", streams = {" + ", ".join(f"{v} = true" for v in sorted(streams[pattern])) + "}"
            )
        if pattern in enums:
            streamed += (
                ", enums = {"
                + ", ".join(
                    f"{verb} = {{" + ", ".join(f"[{_lua_string(q)}] = true" for q in names) + "}"
                    for verb, names in sorted(enums[pattern].items())
                )
                + "}"
            )
        lines.append(f"  {{pattern = {_lua_string(pattern)}, methods = {{{listed}}}{streamed}}},")
    lines += ["}", "", ""]
    return "\n".join(lines) + FILTER_SOURCE.read_text()
