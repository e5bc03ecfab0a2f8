"""The edge's header limits and the services' metadata limit meet where they should: the
edge refuses headers well before a service would (RESOURCE_EXHAUSTED, which clients
retry), and says so the same way to JSON and native gRPC callers
(tests/acceptance/test_edge_header_sizes.py sweeps the sizes through a real Envoy)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import yaml
from google.rpc import error_details_pb2, status_pb2

from services.kit.server import SERVER_OPTIONS

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "envoy" / "envoy.yaml"
# Room for what the edge adds to a request before it reaches a service (x-request-id,
# x-forwarded-for, x-forwarded-proto, te, grpc-timeout, content-type, ...): about 600 bytes.
EDGE_ADDS = 4 * 1024


def manager() -> dict[str, Any]:
    config = yaml.safe_load(TEMPLATE.read_text())
    typed: dict[str, Any] = config["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"
    ][0]["typed_config"]
    return typed


def lua_source() -> str:
    lua = next(f for f in manager()["http_filters"] if f["name"] == "envoy.filters.http.lua")
    source: str = lua["typed_config"]["default_source_code"]["inline_string"]
    return source


def lua_limit() -> int:
    found = re.search(r"local LIMIT = (\d+)", lua_source())
    assert found, "the lua filter names its LIMIT"
    return int(found.group(1))


def lua_message() -> str:
    found = re.search(r'request:respond\(\{\[":status"\] = "431"\}, "([^"]+)"\)', lua_source())
    assert found, "the lua filter answers 431 with a message"
    return found.group(1)


def mappers_for_431() -> list[dict[str, Any]]:
    found = []
    for mapper in manager()["local_reply_config"]["mappers"]:
        for part in mapper["filter"].get("and_filter", {}).get("filters", []):
            comparison = part.get("status_code_filter", {}).get("comparison", {})
            if comparison.get("value", {}).get("default_value") == 431:
                found.append(mapper)
    return found


def test_the_edge_refuses_headers_below_the_services_metadata_limit() -> None:
    options = dict(SERVER_OPTIONS)
    # One limit, not a soft one under a hard one (between those gRPC refuses at random).
    assert options["grpc.max_metadata_size"] == options["grpc.absolute_max_metadata_size"]
    assert lua_limit() + EDGE_ADDS <= options["grpc.max_metadata_size"]
    # The filter sees every size up to the codec's bound, which lies well beyond it.
    assert lua_limit() * 4 <= manager()["max_request_headers_kb"] * 1024


def test_json_and_grpc_callers_hear_the_same_status() -> None:
    message = lua_message()
    assert f"{lua_limit() // 1024} KiB" in message
    json_mapper, grpc_mapper = mappers_for_431()
    body = json_mapper["body_format_override"]["json_format"]
    assert (body["code"], body["message"]) == (3, message)
    assert [d["reason"] for d in body["details"]] == ["HEADERS_TOO_LARGE"]
    added = {h["header"]["key"]: h["header"]["value"] for h in grpc_mapper["headers_to_add"]}
    assert added["grpc-status"] == "3"
    status = status_pb2.Status.FromString(base64.b64decode(added["grpc-status-details-bin"]))
    assert (status.code, status.message) == (3, message)
    info = error_details_pb2.ErrorInfo()
    assert len(status.details) == 1 and status.details[0].Unpack(info)
    assert (info.reason, info.domain) == ("HEADERS_TOO_LARGE", "atelier.dev")
