"""Points deploy/envoy/envoy.yaml at a deployment's upstreams: ``atelier edge-config``.

The file in the repository is the edge's whole configuration with local addresses. A
deployment keeps every route, filter and limit as they are and changes only where each
cluster's endpoints are, where the transcoder's descriptor set lives and where the admin
listener binds. In Kubernetes an init container of the Envoy pod runs this over the
ConfigMap made from that file (deploy/k8s/base/edge.yaml).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from services import edge_static

TRANSCODER = "envoy.filters.http.grpc_json_transcoder"


class EdgeConfigError(Exception):
    """The template and the upstreams given do not fit together."""


def host_port(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EdgeConfigError(f"{what} must be HOST:PORT (got {value!r})")
    return host, int(port)


def point(
    config: dict[str, Any],
    upstreams: Mapping[str, tuple[str, int]],
    descriptor: str,
    admin: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """``config`` with every cluster's endpoints at ``upstreams[cluster]`` (one address
    each: a DNS name that resolves to the replicas), the transcoder reading ``descriptor``
    and, when given, the admin listener at ``admin``. Every cluster must be named, and
    only those: a cluster left at its local address would send traffic nowhere."""
    clusters = [c["name"] for c in config["static_resources"]["clusters"]]
    missing = sorted(set(clusters) - set(upstreams))
    unknown = sorted(set(upstreams) - set(clusters))
    if missing or unknown:
        raise EdgeConfigError(
            "every cluster needs exactly one --upstream: "
            + "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"no such cluster {', '.join(unknown)}" if unknown else "",
                )
                if part
            )
        )
    for cluster in config["static_resources"]["clusters"]:
        host, port = upstreams[cluster["name"]]
        cluster["load_assignment"]["endpoints"] = [
            {
                "lb_endpoints": [
                    {
                        "endpoint": {
                            "address": {"socket_address": {"address": host, "port_value": port}}
                        }
                    }
                ]
            }
        ]
    transcoders = 0
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                for http_filter in network_filter["typed_config"].get("http_filters", []):
                    if http_filter["name"] == TRANSCODER:
                        http_filter["typed_config"]["proto_descriptor"] = descriptor
                        transcoders += 1
    if transcoders == 0:
        raise EdgeConfigError(f"the template has no {TRANSCODER} filter")
    if admin is not None:
        config["admin"]["address"]["socket_address"] = {
            "address": admin[0],
            "port_value": admin[1],
        }
    return config


class _Unaliased(yaml.SafeDumper):
    """Writes shared parts in full: the template's YAML anchors are for its readers."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(
    template: Path,
    upstreams: Mapping[str, tuple[str, int]],
    descriptor: str,
    admin: tuple[str, int] | None = None,
    web: Path | None = None,
) -> str:
    """The template pointed at ``upstreams``; with ``web``, the edge also serves the
    playground's files from that folder (services/edge_static.py)."""
    config = point(yaml.safe_load(template.read_text()), upstreams, descriptor, admin)
    if web is not None:
        try:
            edge_static.add_static_routes(config, edge_static.playground(web))
        except edge_static.StaticFileError as error:
            raise EdgeConfigError(str(error)) from error
    return yaml.dump(config, Dumper=_Unaliased, sort_keys=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--template", type=Path, required=True, help="deploy/envoy/envoy.yaml")
    parser.add_argument("--out", type=Path, required=True, help="the file Envoy loads")
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="CLUSTER=HOST:PORT",
        help="where one cluster's replicas are (repeat for every cluster)",
    )
    parser.add_argument(
        "--descriptor", required=True, help="the descriptor set (gen/atelier.binpb) in the image"
    )
    parser.add_argument("--admin", metavar="HOST:PORT", help="the admin listener's address")
    parser.add_argument(
        "--web",
        type=Path,
        metavar="DIR",
        help=f"serve the web playground at / from DIR/playground (image: {edge_static.IMAGE_WEB})",
    )


def run(args: argparse.Namespace) -> None:
    upstreams: dict[str, tuple[str, int]] = {}
    for spec in args.upstream:
        name, sep, address = str(spec).partition("=")
        if not sep or not name:
            raise EdgeConfigError(f"--upstream must be CLUSTER=HOST:PORT (got {spec!r})")
        if name in upstreams:
            raise EdgeConfigError(f"--upstream {name} is given twice")
        upstreams[name] = host_port(address, f"--upstream {name}")
    admin = host_port(args.admin, "--admin") if args.admin else None
    text = render(args.template, upstreams, args.descriptor, admin, args.web)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
