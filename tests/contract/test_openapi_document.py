"""gen/openapi.json as committed (the drift check in test_contract.py regenerates it with
the rest of gen/): valid OpenAPI, the public services only, streams marked; and the
static files the edge serves fit Envoy's body limit and are in the image."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from google.api import annotations_pb2
from openapi_spec_validator import validate

from services import edge_static
from services.dev import edge
from services.dev.openapi.descriptors import Index
from services.notify.pushes import tokens

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"CreationService", "MediaService", "NotifyService"}


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ROOT / "gen" / "openapi.json").read_text())
    return loaded


def operations() -> dict[str, dict[str, Any]]:
    return {o["operationId"]: o for path in document()["paths"].values() for o in path.values()}


def test_the_document_is_valid_openapi_3_0() -> None:
    validate(document())
    assert document()["openapi"] == "3.0.3"


def test_every_http_rule_of_the_public_services_and_nothing_else_is_an_operation() -> None:
    index = Index.read((ROOT / "gen" / "atelier.binpb").read_bytes())
    expected = set()
    streams = set()
    for name, service in index.services.items():
        short = name.rsplit(".", 1)[-1]
        for method in service.method:
            if short in PUBLIC and method.options.HasExtension(annotations_pb2.http):
                expected.add(f"{short}_{method.name}")
                if method.server_streaming:
                    streams.add(f"{short}_{method.name}")
    found = operations()
    assert {re.sub(r"_\d+$", "", op) for op in found} == expected
    assert {t["name"] for t in document()["tags"]} == PUBLIC
    marked = {name for name, op in found.items() if op.get("x-server-streaming")}
    assert marked == streams and {"NotifyService_WatchJob", "NotifyService_WatchJobs"} <= marked


def test_every_static_file_fits_the_edges_body_limit() -> None:
    limit = edge_static.body_limit(yaml.safe_load(edge.ENVOY_TEMPLATE.read_text()))
    for static in edge_static.STATIC_FILES:
        size = (ROOT / static.file).stat().st_size
        assert size <= limit, f"{static.file} is {size} bytes; Envoy serves at most {limit}"


def test_the_image_holds_every_static_file_where_the_edge_pod_reads_it() -> None:
    dockerfile = (ROOT / "deploy" / "image" / "Dockerfile").read_text()
    copies = re.findall(r"^COPY\s+(?!--from)(\S+)\s+(\S+)\s*$", dockerfile, re.MULTILINE)
    for static in edge_static.STATIC_FILES:
        assert any(
            static.file.startswith(source.rstrip("/"))
            and target.rstrip("/") == f"{edge_static.IMAGE_ROOT}/{source.rstrip('/')}"
            for source, target in copies
        ), f"deploy/image/Dockerfile must COPY {static.file} to {edge_static.IMAGE_ROOT}/"
    pod = (ROOT / "deploy" / "k8s" / "base" / "edge.yaml").read_text()
    assert f"--static-root={edge_static.IMAGE_ROOT}" in pod


def test_request_messages_take_no_other_property_and_answers_stay_open() -> None:
    """The edge answers 400 naming a body field its message does not have, so every
    message a request carries is closed; answer-only messages stay open (a field added
    later must not break a client that validates)."""
    schemas = document()["components"]["schemas"]
    for name in ("SubmitJobRequest", "CreateUploadRequest", "RegisterDeviceRequest"):
        assert schemas[name]["additionalProperties"] is False, name
    for name in ("CreationServiceCancelJobBody", "NotifyServiceRegisterLiveActivityBody"):
        assert schemas[name]["additionalProperties"] is False, name
    for name in ("Job", "Asset", "Device", "SubmitJobResponse"):
        assert "additionalProperties" not in schemas[name], name


def test_the_patterns_say_what_notify_checks() -> None:
    """Each pattern accepts what the service accepts and refuses what it refuses (a few
    values each way, at and past the bounds)."""
    device = document()["components"]["schemas"]["RegisterDeviceRequest"]["properties"]
    token = re.compile(device["deviceToken"]["pattern"])
    for value in ("ab" * 32, "AB" * 100, "ab" * 31, "ab" * 101, "a" * 65, "zz" * 32, ""):
        assert bool(token.search(value)) == (tokens.token_problem(value) is None), value
    bundle = re.compile(device["bundleId"]["pattern"])
    for value in ("com.example.app", "a.b", "app", "com..app", "com.ex ample", ".a.b"):
        assert bool(bundle.search(value)) == (tokens.bundle_id_problem(value) is None), value
    locale = re.compile(device["locale"]["pattern"])
    for value in ("", "en", "fr-FR", "zh_Hant_TW", "e", "english", "en-"):
        assert bool(locale.search(value)) == (tokens.locale_problem(value) is None), value


def test_each_refusal_of_a_schema_valid_request_is_a_reason_of_the_contract() -> None:
    """An operation's 400 lists its refusals of schema-valid requests; each names an
    ErrorReason the contract lists."""
    reasons = set(document()["components"]["schemas"]["ErrorReason"]["enum"])
    declared = {
        name: op["responses"]["400"]["x-schema-valid-refusals"]
        for name, op in operations().items()
        if "400" in op["responses"]
    }
    assert {"CreationService_SubmitJob", "CreationService_ListJobs"} <= set(declared)
    for name, refusals in declared.items():
        for refusal in refusals:
            assert refusal["reason"] in reasons, (name, refusal)
            assert refusal["reason"] in operations()[name]["responses"]["400"]["description"]
