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
