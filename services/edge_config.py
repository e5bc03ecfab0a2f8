"""Points deploy/envoy/envoy.yaml at a deployment's upstreams: ``atelier edge-config``.

The file in the repository is the edge's whole configuration with local addresses. A
deployment keeps every listener, route, filter and limit as they are and changes only
where each cluster's endpoints are, where the transcoder's descriptor set lives and where
the admin interface binds (a loopback address: the monitoring listener passes on the two
paths it exposes); it adds the routes of the files the edge serves itself
(services/edge_static.py), read from where the image keeps them, and the check of the
trusted issuers' tokens (services/edge_jwt.py, from ATELIER_JWT_ISSUERS in its
environment). In Kubernetes an init container of the Envoy pod runs this over the
ConfigMap made from that file (deploy/k8s/base/edge.yaml).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from services import edge_jwt, edge_static
from services.kit.issuers import JwksBounds, read_issuers
from services.kit.settings import EnvReader, SettingsError

TRANSCODER = "envoy.filters.http.grpc_json_transcoder"
# The cluster that reaches Envoy's own admin interface (for the monitoring listener): it
# follows the admin address, it is not an upstream a deployment names.
ADMIN_CLUSTER = "envoy_admin"


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
    static_root: str = edge_static.IMAGE_ROOT,
    cors_origins: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``config`` with every cluster's endpoints at ``upstreams[cluster]`` (one address
    each: a DNS name that resolves to the replicas), the transcoder reading ``descriptor``,
    the static files' routes reading under ``static_root`` and, when given, the admin
    interface at ``admin`` (a loopback address; the admin cluster follows it), the CORS
    filter allowing ``cors_origins``. Every upstream cluster must be named, and only
    those: a cluster left at its local address would send traffic nowhere."""
    if admin is not None and not is_loopback(admin[0]):
        raise EdgeConfigError(
            f"--admin must be a loopback address (got {admin[0]}): the admin interface can "
            "stop Envoy; the monitoring listener exposes /stats/prometheus and /ready"
        )
    clusters = [
        c["name"] for c in config["static_resources"]["clusters"] if c["name"] != ADMIN_CLUSTER
    ]
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
        if cluster["name"] == ADMIN_CLUSTER:
            if admin is not None:
                set_endpoint(cluster, *admin)
            continue
        set_endpoint(cluster, *upstreams[cluster["name"]])
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
    edge_static.add_routes(config, static_root)
    edge_static.set_cors_origins(config, cors_origins)
    if admin is not None:
        config["admin"]["address"]["socket_address"] = {
            "address": admin[0],
            "port_value": admin[1],
        }
    return config


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def set_endpoint(cluster: dict[str, Any], host: str, port: int) -> None:
    """``cluster`` has one endpoint, at ``host:port``."""
    cluster["load_assignment"]["endpoints"] = [
        {
            "lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
            ]
        }
    ]


class _Unaliased(yaml.SafeDumper):
    """Writes shared parts in full: the template's YAML anchors are for its readers."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(
    template: Path,
    upstreams: Mapping[str, tuple[str, int]],
    descriptor: str,
    admin: tuple[str, int] | None = None,
    static_root: str = edge_static.IMAGE_ROOT,
    cors_origins: tuple[str, ...] = (),
    issuers: Sequence[edge_jwt.EdgeIssuer] = (),
    bounds: JwksBounds | None = None,
) -> str:
    config = yaml.safe_load(template.read_text())
    point(config, upstreams, descriptor, admin, static_root, cors_origins)
    edge_jwt.add_jwt_authn(config, issuers, bounds or JwksBounds())
    return yaml.dump(
        config,
        Dumper=_Unaliased,
        sort_keys=False,
    )


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
    parser.add_argument(
        "--admin", metavar="HOST:PORT", help="the admin interface's address (a loopback one)"
    )
    parser.add_argument(
        "--static-root",
        default=edge_static.IMAGE_ROOT,
        help="where the files the edge serves itself are, each under its repository path",
    )
    parser.add_argument(
        "--cors-origins",
        default="",
        help="origins browser pages may call the API from, comma-separated, or * for any "
        "(as ATELIER_EDGE_CORS_ORIGINS); empty: none",
    )


def jwt_issuers(
    environ: Mapping[str, str], warn: Callable[[str], None]
) -> tuple[list[edge_jwt.EdgeIssuer], JwksBounds]:
    """The trusted issuers the services read (ATELIER_JWT_ISSUERS, ATELIER_JWKS_*), with
    their key sets' addresses, for the edge's own token check."""
    reader = EnvReader(environ)
    issuers = read_issuers(reader, reader.string("JWT_ISSUER", "atelier"))
    bounds = JwksBounds.read(reader)
    # Off for an issuer that signs with a new key the moment it publishes it: the edge
    # sees a new key only at its next fetch (ATELIER_JWKS_DEFAULT_TTL), the services at once.
    checked = reader.string("EDGE_CHECK_TOKENS", "true", choices=("true", "false")) == "true"
    try:
        reader.finish()
    except SettingsError as error:
        raise EdgeConfigError(str(error)) from None
    if not checked:
        return [], bounds
    return edge_jwt.edge_issuers(issuers, bounds, warn), bounds


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
    try:
        origins = edge_static.cors_origins(args.cors_origins)
    except ValueError as error:
        raise EdgeConfigError(f"--cors-origins: {error}") from None
    issuers, bounds = jwt_issuers(
        os.environ, lambda message: print(f"atelier edge-config: {message}", file=sys.stderr)
    )
    text = render(
        args.template,
        upstreams,
        args.descriptor,
        admin,
        args.static_root,
        origins,
        issuers,
        bounds,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
