"""Renders deploy/envoy/envoy.yaml for a local run: the API listener's routes and filters
served in plain HTTP (and over TLS too when a certificate is set), with local addresses,
ports, descriptor path, the settings of :class:`EdgeOptions` (body limit aside, which has
its own parameter), and the static files' routes (services/edge_static.py) serving the
repository's files. The production-only listeners (the plaintext one that redirects to
HTTPS, the monitoring one in front of the admin interface) are left out: a local run
reads the admin interface directly."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services import edge_static
from services.dev.processes import venv_binary
from services.edge_config import ADMIN_CLUSTER
from services.kit.settings import EnvReader, port

ROOT = Path(__file__).resolve().parents[2]
ENVOY_TEMPLATE = ROOT / "deploy" / "envoy" / "envoy.yaml"
DESCRIPTOR = ROOT / "gen" / "atelier.binpb"
TRANSCODER = "envoy.filters.http.grpc_json_transcoder"
BUFFER = "envoy.filters.http.buffer"
RATE_LIMIT = "envoy.filters.http.local_ratelimit"
HTTP_MANAGER = "envoy.filters.network.http_connection_manager"
TLS_LISTENER = "edge_tls"
PLAINTEXT_LISTENER = "edge"
HSTS = "strict-transport-security"
HEADER_MUTATION = "envoy.filters.http.header_mutation"
CONNECTIONS_MONITOR = "envoy.resource_monitors.global_downstream_max_connections"
# Clusters that reach the same service as another (its client streams, own limits).
STREAM_CLUSTERS = {"notify_streams": "notify"}
# The largest JSON request body the edge accepts (deploy/envoy/envoy.yaml says the same).
DEFAULT_MAX_JSON_BODY = 64 * 1024
DEFAULT_TLS_PORT = 8443
# A local run (and every test through it) sends all its requests from one address: the
# per-client bucket there is far above anything a test or bench sends. deploy/envoy/
# envoy.yaml has the production figures.
DEV_RATE_LIMIT_BURST = 100_000
DEV_RATE_LIMIT_PER_SECOND = 100_000


def max_json_body(reader: EnvReader) -> int:
    """ATELIER_EDGE_MAX_JSON_BODY: bytes; a JSON API request over it is answered 413."""
    return reader.integer(
        "EDGE_MAX_JSON_BODY", DEFAULT_MAX_JSON_BODY, minimum=1024, maximum=16 * 1024 * 1024
    )


@dataclass(frozen=True)
class EdgeOptions:
    """What a local run may change in the edge besides addresses and the body limit."""

    # Proxies in front of the edge trusted to append the client's address to
    # x-forwarded-for; 0: the client is the connection's peer.
    xff_num_trusted_hops: int = 0
    # Per client address: requests at once, then requests a second.
    rate_limit_burst: int = DEV_RATE_LIMIT_BURST
    rate_limit_per_second: int = DEV_RATE_LIMIT_PER_SECOND
    # Where the JSON access log goes (stdout: the edge's log in `atelier dev`).
    access_log_path: str = "/dev/stdout"
    # Both set: the TLS listener on tls_port with this certificate chain and key.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_port: int = DEFAULT_TLS_PORT
    # Open client connections over every listener (the overload manager's limit).
    max_connections: int = 50_000
    # Origins a browser page may call the API from (("*",): any); none: same origin only.
    cors_origins: tuple[str, ...] = ()

    @classmethod
    def read(cls, reader: EnvReader) -> EdgeOptions:
        """ATELIER_EDGE_XFF_TRUSTED_HOPS, ATELIER_EDGE_RATE_LIMIT_BURST,
        ATELIER_EDGE_RATE_LIMIT_PER_SECOND, ATELIER_EDGE_ACCESS_LOG,
        ATELIER_EDGE_TLS_CERT and ATELIER_EDGE_TLS_KEY (together or not at all),
        ATELIER_EDGE_TLS_PORT, ATELIER_EDGE_MAX_CONNECTIONS, ATELIER_EDGE_CORS_ORIGINS."""
        cert = reader.string("EDGE_TLS_CERT", "")
        key = reader.string("EDGE_TLS_KEY", "")
        reader.require(bool(cert) == bool(key), "EDGE_TLS_KEY", "set both TLS_CERT and TLS_KEY")
        for name, value in (("EDGE_TLS_CERT", cert), ("EDGE_TLS_KEY", key)):
            reader.require(not value or Path(value).is_file(), name, f"no such file: {value}")
        try:
            origins = edge_static.cors_origins(reader.string("EDGE_CORS_ORIGINS", ""))
        except ValueError as error:
            reader.require(False, "EDGE_CORS_ORIGINS", str(error))
            origins = ()
        return cls(
            xff_num_trusted_hops=reader.integer("EDGE_XFF_TRUSTED_HOPS", 0, minimum=0, maximum=5),
            rate_limit_burst=reader.integer(
                "EDGE_RATE_LIMIT_BURST", DEV_RATE_LIMIT_BURST, minimum=1, maximum=10_000_000
            ),
            rate_limit_per_second=reader.integer(
                "EDGE_RATE_LIMIT_PER_SECOND",
                DEV_RATE_LIMIT_PER_SECOND,
                minimum=1,
                maximum=10_000_000,
            ),
            access_log_path=reader.string("EDGE_ACCESS_LOG", "/dev/stdout"),
            tls_cert=Path(cert).resolve() if cert else None,
            tls_key=Path(key).resolve() if key else None,
            tls_port=port(reader, "EDGE_TLS_PORT", DEFAULT_TLS_PORT),
            max_connections=reader.integer(
                "EDGE_MAX_CONNECTIONS", 50_000, minimum=1, maximum=10_000_000
            ),
            cors_origins=origins,
        )

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None


def render(
    *,
    listen_port: int,
    admin_port: int,
    upstream_ports: Mapping[str, int | Sequence[int]],
    host: str = "127.0.0.1",
    descriptor: Path = DESCRIPTOR,
    max_json_body: int = DEFAULT_MAX_JSON_BODY,
    options: EdgeOptions | None = None,
    static_root: Path = ROOT,
) -> dict[str, Any]:
    options = options or EdgeOptions()
    config: dict[str, Any] = yaml.safe_load(ENVOY_TEMPLATE.read_text())
    edge_static.add_routes(config, static_root)
    edge_static.set_cors_origins(config, options.cors_origins)
    config["admin"]["address"]["socket_address"] = {"address": host, "port_value": admin_port}
    listeners = config["static_resources"]["listeners"]
    api = next(x for x in listeners if x["name"] == TLS_LISTENER)
    manager = api["filter_chains"][0]["filters"][0]["typed_config"]
    _render_manager(manager, options)
    for http_filter in manager["http_filters"]:
        if http_filter["name"] == TRANSCODER:
            http_filter["typed_config"]["proto_descriptor"] = str(descriptor)
        if http_filter["name"] == BUFFER:
            http_filter["typed_config"]["max_request_bytes"] = max_json_body
    # A local run serves the API in plain HTTP (the production plaintext listener only
    # redirects) and reads Envoy's admin interface directly (no monitoring listener).
    listeners[:] = [_plaintext_api(api, manager, host, listen_port)]
    if options.tls:
        listeners.append(_render_tls(api, host, options))
    config["static_resources"]["clusters"] = [
        c for c in config["static_resources"]["clusters"] if c["name"] != ADMIN_CLUSTER
    ]
    for monitor in config["overload_manager"]["resource_monitors"]:
        if monitor["name"] == CONNECTIONS_MONITOR:
            monitor["typed_config"]["max_active_downstream_connections"] = options.max_connections
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


def _render_manager(manager: dict[str, Any], options: EdgeOptions) -> None:
    """The API's HTTP connection manager (the plaintext listener gets a copy)."""
    manager["xff_num_trusted_hops"] = options.xff_num_trusted_hops
    for access_log in manager["access_log"]:
        access_log["typed_config"]["path"] = options.access_log_path
    for http_filter in manager["http_filters"]:
        if http_filter["name"] == RATE_LIMIT:
            bucket = {
                "max_tokens": options.rate_limit_burst,
                "tokens_per_fill": options.rate_limit_per_second,
                "fill_interval": "1s",
            }
            limit = http_filter["typed_config"]
            limit["token_bucket"] = bucket
            for descriptor in limit["descriptors"]:
                descriptor["token_bucket"] = dict(bucket)


def _plaintext_api(
    api: dict[str, Any], manager: dict[str, Any], host: str, port: int
) -> dict[str, Any]:
    """The API listener's manager on a plaintext listener ("edge"), without HSTS (a
    header only HTTPS answers may carry)."""
    plain = copy.deepcopy(manager)
    for http_filter in plain["http_filters"]:
        if http_filter["name"] == HEADER_MUTATION:
            mutations = http_filter["typed_config"]["mutations"]
            mutations["response_mutations"] = [
                mutation
                for mutation in mutations["response_mutations"]
                if mutation.get("append", {}).get("header", {}).get("key") != HSTS
            ]
    return {
        "name": PLAINTEXT_LISTENER,
        "address": {"socket_address": {"address": host, "port_value": port}},
        "per_connection_buffer_limit_bytes": api["per_connection_buffer_limit_bytes"],
        "filter_chains": [{"filters": [{"name": HTTP_MANAGER, "typed_config": plain}]}],
    }


def _render_tls(tls: dict[str, Any], host: str, options: EdgeOptions) -> dict[str, Any]:
    """The TLS listener on the local port with the given certificate, read once (the
    production config reloads it through SDS from the pod's Secret mount)."""
    tls["address"]["socket_address"] = {"address": host, "port_value": options.tls_port}
    for chain in tls["filter_chains"]:
        context = chain["transport_socket"]["typed_config"]["common_tls_context"]
        context.pop("tls_certificate_sds_secret_configs", None)
        context["tls_certificates"] = [
            {
                "certificate_chain": {"filename": str(options.tls_cert)},
                "private_key": {"filename": str(options.tls_key)},
            }
        ]
    return tls


def argv(config: Path) -> list[str]:
    """How a local run starts Envoy on a rendered config."""
    return [
        venv_binary("envoy"),
        "-c",
        str(config),
        "--disable-hot-restart",
        "--log-level",
        "warn",
        # Access log lines are written out within half a second.
        "--file-flush-interval-msec",
        "500",
    ]


def write(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.dump(config, Dumper=_Unaliased, sort_keys=False))
    return path


class _Unaliased(yaml.SafeDumper):
    """Writes shared parts (the listeners' one connection manager) out in full."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
