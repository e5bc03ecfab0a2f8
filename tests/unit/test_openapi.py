"""The OpenAPI generator on a tiny descriptor set (tests/unit/openapi_tiny), compiled here
with the protoc of grpcio-tools, comments included, like gen/atelier.binpb."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from grpc_tools import protoc

from services.dev.openapi.__main__ import edge_services
from services.dev.openapi.descriptors import Index
from services.dev.openapi.document import Info, build

ROOT = Path(__file__).resolve().parents[2]
TINY = Path(__file__).resolve().parent / "openapi_tiny"
SCHEMAS = "#/components/schemas/"
INFO = Info(title="tiny", version="v1", description="A tiny API.")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Index:
    out = tmp_path_factory.mktemp("tiny") / "tiny.binpb"
    well_known = resources.files("grpc_tools") / "_proto"
    status = protoc.main(
        [
            "protoc",
            f"-I{TINY}",
            f"-I{ROOT / 'third_party'}",
            f"-I{well_known}",
            "--include_imports",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            "tiny/things.proto",
            "tiny/other.proto",
            "google/rpc/error_details.proto",
            "google/rpc/status.proto",
        ]
    )
    assert status == 0
    return Index.read(out.read_bytes())


@pytest.fixture(scope="module")
def doc(index: Index) -> dict[str, Any]:
    return build(index, ["tiny.v1.ThingService"], INFO)


def op(doc: dict[str, Any], path: str, verb: str) -> dict[str, Any]:
    found: dict[str, Any] = doc["paths"][path][verb]
    return found


def schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = doc["components"]["schemas"][name]
    return found


def params(operation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in operation.get("parameters", [])}


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for item in node for r in refs(item)]
    return []


def test_only_the_listed_services_rpcs_with_http_rules_are_operations(
    doc: dict[str, Any],
) -> None:
    operations = {o["operationId"] for path in doc["paths"].values() for o in path.values()}
    assert operations == {
        "ThingService_GetThing",
        "ThingService_ListThings",
        "ThingService_RenameThing",
        "ThingService_PutThing",
        "ThingService_PutThing_2",
        "ThingService_DeleteThing",
        "ThingService_WatchThings",
    }
    assert "/v1/secret" not in doc["paths"]
    assert doc["openapi"] == "3.0.3"
    assert doc["tags"] == [{"name": "ThingService", "description": "Things a user keeps."}]


def test_every_reference_resolves_and_every_schema_is_used(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    found = set(refs(doc))
    for ref in found:
        section, name = ref.removeprefix("#/components/").split("/")
        assert name in doc["components"][section], ref
    assert {SCHEMAS + name for name in schemas} <= found
    assert all(not r.startswith("proto:") for r in found)


def test_path_variables_are_required_path_parameters_named_in_json(doc: dict[str, Any]) -> None:
    get = op(doc, "/v1/shelves/{shelfId}/things/{thingId}", "get")
    assert get["summary"] == "Reads one thing."
    assert get["description"] == "Reads one thing. Only the owner's."
    assert params(get) == {
        "shelfId": {
            "name": "shelfId",
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
        },
        "thingId": {
            "name": "thingId",
            "in": "path",
            "required": True,
            "description": "Which thing.",
            # REQUIRED: not empty (the services refuse an empty one).
            "schema": {"type": "string", "minLength": 1},
        },
    }
    assert "requestBody" not in get
    assert get["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": SCHEMAS + "Thing"
    }


def test_a_get_takes_the_other_fields_as_query_parameters(doc: dict[str, Any]) -> None:
    listing = params(op(doc, "/v1/things", "get"))
    assert set(listing) == {"pageSize", "colors", "filter.namePrefix", "after"}
    assert listing["pageSize"]["required"] is True
    assert listing["pageSize"]["description"] == "At most this many."
    assert listing["pageSize"]["schema"] == {"type": "integer", "format": "int32"}
    assert listing["colors"]["schema"] == {"type": "array", "items": {"$ref": SCHEMAS + "Color"}}
    assert listing["filter.namePrefix"]["required"] is False
    assert listing["after"]["schema"] == {"type": "string", "format": "date-time"}


def test_body_star_leaves_out_the_fields_the_path_binds(doc: dict[str, Any]) -> None:
    rename = op(doc, "/v1/things/{thingId}:rename", "post")
    assert rename["requestBody"] == {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": SCHEMAS + "ThingServiceRenameThingBody"}}
        },
    }
    body = schema(doc, "ThingServiceRenameThingBody")
    assert set(body["properties"]) == {"newName"}
    assert body["required"] == ["newName"]
    assert "parameters" in rename and set(params(rename)) == {"thingId"}


def test_a_body_field_is_the_body_and_the_rest_are_query_parameters(
    doc: dict[str, Any],
) -> None:
    for verb in ("put", "patch"):
        put = op(doc, "/v1/things/{thing.thingId}", verb)
        assert put["requestBody"]["required"] is True
        assert put["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": SCHEMAS + "Thing"
        }
        assert set(params(put)) == {"thing.thingId", "validateOnly"}
    assert (
        op(doc, "/v1/things/{thing.thingId}", "patch")["operationId"] == "ThingService_PutThing_2"
    )


def test_response_body_picks_one_field_of_the_response(doc: dict[str, Any]) -> None:
    delete = op(doc, "/v1/things/{thingId}", "delete")
    assert delete["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": SCHEMAS + "Thing"
    }


def test_messages_follow_the_proto3_json_mapping(doc: dict[str, Any]) -> None:
    thing = schema(doc, "Thing")
    assert thing["description"].startswith("A thing.")
    assert "At most one of `maker`, `shop` is set (oneof `origin`)." in thing["description"]
    assert "rank" not in thing["description"]  # proto3 optional is no oneof to a client
    props = thing["properties"]
    assert props["thingId"] == {"type": "string", "description": "The id.", "readOnly": True}
    assert props["weight"] == {"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"}
    assert props["count"]["minimum"] == 0 and props["count"]["type"] == "integer"
    assert props["color"] == {"$ref": SCHEMAS + "Color"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["sizes"] == {
        "type": "object",
        "additionalProperties": {"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"},
    }
    assert props["createTime"] == {"type": "string", "format": "date-time"}
    assert props["extra"] == {"type": "object", "additionalProperties": True}
    assert props["ttl"]["pattern"].endswith("s$")
    assert props["mainPart"] == {
        "allOf": [{"$ref": SCHEMAS + "Thing.Part"}],
        "description": "The biggest part.",
    }
    assert props["blob"] == {"type": "string", "format": "byte"}
    assert props["score"] == {"type": "number", "format": "double"}
    assert props["rank"] == {"type": "integer", "format": "int32"}
    assert props["anything"] == {}
    assert schema(doc, "Thing.Part")["required"] == ["name"]


def test_enums_are_their_value_names_each_explained(doc: dict[str, Any]) -> None:
    color = schema(doc, "Color")
    assert color["type"] == "string"
    assert color["enum"] == ["COLOR_UNSPECIFIED", "COLOR_RED"]
    assert "- `COLOR_RED`: Like a tomato." in color["description"]


def test_types_sharing_a_name_keep_their_full_names(doc: dict[str, Any]) -> None:
    listing = schema(doc, "ListThingsResponse")["properties"]
    assert listing["note"] == {"$ref": SCHEMAS + "tiny.v1.Note"}
    assert listing["legacy"] == {"$ref": SCHEMAS + "tiny.other.Note"}
    assert "Note" not in doc["components"]["schemas"]


def test_a_server_stream_is_marked_and_described_as_json_lines(doc: dict[str, Any]) -> None:
    watch = op(doc, "/v1/things:watch", "get")
    assert watch["x-server-streaming"] is True
    ok = watch["responses"]["200"]
    assert "one JSON object per line" in ok["description"]
    assert ok["content"]["application/x-ndjson"]["schema"] == {
        "$ref": SCHEMAS + "WatchThingsResponse"
    }
    unary = op(doc, "/v1/things", "get")
    assert "x-server-streaming" not in unary


def test_every_operation_answers_errors_as_a_json_status(doc: dict[str, Any]) -> None:
    for path in doc["paths"].values():
        for operation in path.values():
            assert operation["responses"]["4XX"] == {"$ref": "#/components/responses/Error"}
            assert operation["responses"]["5XX"] == {"$ref": "#/components/responses/Error"}
    error = doc["components"]["responses"]["Error"]
    assert error["content"]["application/json"]["schema"] == {"$ref": SCHEMAS + "Status"}
    status = schema(doc, "Status")
    assert status["required"] == ["code", "message"]
    assert status["properties"]["details"]["items"] == {"$ref": SCHEMAS + "StatusDetail"}
    detail = schema(doc, "StatusDetail")
    assert detail["discriminator"]["mapping"] == {
        f"type.googleapis.com/google.rpc.{name}": f"{SCHEMAS}{name}Detail"
        for name in ("ErrorInfo", "BadRequest", "RetryInfo")
    }
    info = schema(doc, "ErrorInfoDetail")["allOf"]
    assert info[0]["properties"]["@type"]["enum"] == ["type.googleapis.com/google.rpc.ErrorInfo"]
    assert info[1] == {"$ref": SCHEMAS + "ErrorInfo"}
    assert schema(doc, "RetryInfo")["properties"]["retryDelay"]["type"] == "string"


def test_every_operation_needs_a_bearer_token(doc: dict[str, Any]) -> None:
    assert doc["security"] == [{"bearerAuth": []}]
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert doc["components"]["securitySchemes"]["bearerAuth"]["bearerFormat"] == "JWT"


def test_the_same_descriptor_makes_the_same_document(index: Index) -> None:
    assert build(index, ["tiny.v1.ThingService"], INFO) == build(
        index, ["tiny.v1.ThingService"], INFO
    )


def test_the_services_are_the_ones_the_edge_transcodes() -> None:
    config = {
        "static_resources": {
            "listeners": [
                {
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "typed_config": {
                                        "http_filters": [
                                            {"name": "envoy.filters.http.router"},
                                            {
                                                "name": "envoy.filters.http.grpc_json_transcoder",
                                                "typed_config": {"services": ["a.B", "c.D"]},
                                            },
                                        ]
                                    }
                                }
                            ]
                        }
                    ]
                }
            ]
        }
    }
    assert edge_services(config) == ["a.B", "c.D"]
    with pytest.raises(ValueError, match="one list of services"):
        edge_services({"static_resources": {"listeners": []}})


def test_answers_only_have_their_always_printed_fields_required(doc: dict[str, Any]) -> None:
    """The edge prints every scalar, enum, repeated field and map (always_print_primitive_
    fields): in a message only answers carry, those are required; messages and oneof
    members are not, and a message requests use too (Thing: PutThing's body) keeps only
    its REQUIRED fields."""
    assert schema(doc, "ListThingsResponse")["required"] == ["things"]
    assert schema(doc, "tiny.v1.Note")["required"] == ["text"]
    assert "required" not in schema(doc, "WatchThingsResponse")
    assert schema(doc, "Thing").get("required", []) == [
        f for f, p in schema(doc, "Thing")["properties"].items() if p.get("minLength")
    ] or "required" not in schema(doc, "Thing")


def test_a_stream_answer_is_exactly_one_of_its_events(doc: dict[str, Any]) -> None:
    assert schema(doc, "WatchThingsResponse")["oneOf"] == [
        {"required": ["thing"]},
        {"required": ["keepAlive"]},
    ]
