"""Renders deploy/envoy/envoy.yaml for a local run: same routes and filters, local
addresses, ports, descriptor path and JSON body limit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from services.kit.settings import EnvReader

ROOT = Path(__file__).resolve().parents[2]
ENVOY_TEMPLATE = ROOT / "deploy" / "envoy" / "envoy.yaml"
DESCRIPTOR = ROOT / "gen" / "atelier.binpb"
TRANSCODER = "envoy.filters.http.grpc_json_transcoder"
BUFFER = "envoy.filters.http.buffer"
# Clusters that reach the same service as another (its client streams, own limits).
STREAM_CLUSTERS = {"notify_streams": "notify"}
# The largest JSON request body the edge accepts (deploy/envoy/envoy.yaml says the same).
DEFAULT_MAX_JSON_BODY = 64 * 1024


def max_json_body(reader: EnvReader) -> int:
    """ATELIER_EDGE_MAX_JSON_BODY: bytes; a JSON API request over it is answered 413."""
    return reader.integer(
        "EDGE_MAX_JSON_BODY", DEFAULT_MAX_JSON_BODY, minimum=1024, maximum=16 * 1024 * 1024
    )


def render(
    *,
    listen_port: int,
    admin_port: int,
    upstream_ports: Mapping[str, int | Sequence[int]],
    host: str = "127.0.0.1",
    descriptor: Path = DESCRIPTOR,
    max_json_body: int = DEFAULT_MAX_JSON_BODY,
) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(ENVOY_TEMPLATE.read_text())
    config["admin"]["address"]["socket_address"] = {"address": host, "port_value": admin_port}
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"] = {"address": host, "port_value": listen_port}
    for chain_filter in listener["filter_chains"][0]["filters"]:
        for http_filter in chain_filter["typed_config"]["http_filters"]:
            if http_filter["name"] == TRANSCODER:
                http_filter["typed_config"]["proto_descriptor"] = str(descriptor)
            if http_filter["name"] == BUFFER:
                http_filter["typed_config"]["max_request_bytes"] = max_json_body
    for cluster in config["static_resources"]["clusters"]:
        ports = upstream_ports[STREAM_CLUSTERS.get(cluster["name"], cluster["name"])]
        # Several ports: replicas of one service, one endpoint each (the cluster balances).
        replicas = [ports] if isinstance(ports, int) else list(ports)
        for group in cluster["load_assignment"]["endpoints"]:
            template = group["lb_endpoints"][0]
            group["lb_endpoints"] = [
                {
                    **template,
                    "endpoint": {
                        **template["endpoint"],
                        "address": {"socket_address": {"address": host, "port_value": port}},
                    },
                }
                for port in replicas
            ]
    return config


def write(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
