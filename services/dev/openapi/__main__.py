"""`python -m services.dev.openapi --descriptor gen/atelier.binpb --edge
deploy/envoy/envoy.yaml --out gen/openapi.json --routes-out gen/edge_routes.lua
--fuzzing-out gen/schemathesis.toml`: the document of the services the edge's transcoder
serves (its `services` list), from the descriptor set it transcodes with, the edge's route
table for its routes filter, and schemathesis's configuration for the document."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from services.dev.openapi import edge_routes, fuzzing
from services.dev.openapi.descriptors import Index
from services.dev.openapi.document import Info, build

TRANSCODER = "envoy.filters.http.grpc_json_transcoder"
INFO = Info(
    title="atelier",
    version="v1",
    description=(
        "The JSON edge of atelier: durable AI generation jobs. Generated from protos/ by "
        "`make proto` (scripts/gen-protos.sh); do not edit. Requests and responses follow "
        "the proto3 JSON mapping: lowerCamelCase names, 64-bit integers as strings, enums "
        "by name, timestamps as RFC 3339 strings. Errors are JSON google.rpc.Status."
    ),
)


def edge_services(config: dict[str, Any]) -> list[str]:
    """The services the edge's JSON transcoder serves, in its order (every listener's
    transcoder must list the same)."""
    found: list[list[str]] = []
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                for http_filter in network_filter["typed_config"].get("http_filters", []):
                    if http_filter["name"] == TRANSCODER:
                        found.append(list(http_filter["typed_config"]["services"]))
    if not found or any(services != found[0] for services in found):
        raise ValueError(f"expected one list of services over every {TRANSCODER}: {found}")
    return found[0]


def render(descriptor: Path, edge_config: Path) -> str:
    index = Index.read(descriptor.read_bytes())
    services = edge_services(yaml.safe_load(edge_config.read_text()))
    return json.dumps(build(index, services, INFO), indent=2, ensure_ascii=False) + "\n"


def render_routes(descriptor: Path, edge_config: Path) -> str:
    index = Index.read(descriptor.read_bytes())
    return edge_routes.render(index, edge_services(yaml.safe_load(edge_config.read_text())))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.dev.openapi", description=__doc__)
    parser.add_argument("--descriptor", type=Path, required=True, help="gen/atelier.binpb")
    parser.add_argument("--edge", type=Path, required=True, help="deploy/envoy/envoy.yaml")
    parser.add_argument("--out", type=Path, required=True, help="gen/openapi.json")
    parser.add_argument("--routes-out", type=Path, help="gen/edge_routes.lua")
    parser.add_argument("--fuzzing-out", type=Path, help="gen/schemathesis.toml")
    args = parser.parse_args(argv)
    document = render(args.descriptor, args.edge)
    args.out.write_text(document)
    if args.fuzzing_out:
        args.fuzzing_out.write_text(fuzzing.render(json.loads(document)))
    if args.routes_out:
        args.routes_out.write_text(render_routes(args.descriptor, args.edge))


if __name__ == "__main__":
    main()
