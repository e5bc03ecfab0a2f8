"""Files the edge serves itself, with no service behind them: the OpenAPI document, the
web playground (web/playground/) and its icon at /favicon.ico, as listed in
:data:`STATIC_FILES`.

Each file becomes one route in front of all others: its exact path, GET or HEAD, answered
by an Envoy direct response whose body Envoy reads from the file when it loads its config
(a changed file needs an edge restart), with its content type and a cache lifetime, no
authentication, the transcoder and the body buffer off. Both ways of rendering
deploy/envoy/envoy.yaml add these routes: services/dev/edge.py (a local run and the tests,
files from the repository) and services/edge_config.py (the Envoy pod's init container,
files from the image, where deploy/image/Dockerfile copies each to
/opt/atelier/share/<file>). Envoy refuses a direct-response body over the route table's
``max_direct_response_body_size_bytes`` (set in the template; its default is 4 KiB).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Where the image keeps the files (deploy/image/Dockerfile), each under its repository path.
IMAGE_ROOT = "/opt/atelier/share"
TRANSCODER = "envoy.filters.http.grpc_json_transcoder"
BUFFER = "envoy.filters.http.buffer"
HTTP_MANAGER = "envoy.filters.network.http_connection_manager"
_FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"
_BUFFER_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute"


@dataclass(frozen=True)
class StaticFile:
    """One file the edge answers ``path`` with."""

    # The request path, matched exactly.
    path: str
    # The file, relative to the repository root (and to IMAGE_ROOT in the image).
    file: str
    content_type: str
    cache_control: str = "public, max-age=300"
    # More response headers (name, value), e.g. a page's Content-Security-Policy.
    headers: tuple[tuple[str, str], ...] = ()


# The page runs only its own script and style (no inline code, no eval), talks to and
# shows pictures from its own origin, and from https: origins for signed storage URLs
# (an S3 bucket with a CORS rule for the edge's origin, docs/playground.md). It cannot be
# framed, and sends no form anywhere.
PLAYGROUND_CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' blob: https:",
        "connect-src 'self' https:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
_PAGE_HEADERS = (
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("content-security-policy", PLAYGROUND_CSP),
)


def _playground_file(path: str, file: str, content_type: str) -> StaticFile:
    # no-cache: a page and its modules change together; the browser revalidates each.
    return StaticFile(path, f"web/playground/{file}", content_type, "no-cache", _PAGE_HEADERS)


_JAVASCRIPT = "text/javascript; charset=utf-8"
PLAYGROUND_FILES: tuple[StaticFile, ...] = (
    _playground_file("/", "index.html", "text/html; charset=utf-8"),
    _playground_file("/playground/app.js", "app.js", _JAVASCRIPT),
    _playground_file("/playground/edge.js", "edge.js", _JAVASCRIPT),
    _playground_file("/playground/style.css", "style.css", "text/css; charset=utf-8"),
)
# The playground's icon (scripts/make_favicon.py draws it), where browsers look for one.
FAVICON = StaticFile(
    "/favicon.ico",
    "web/playground/favicon.ico",
    "image/x-icon",
    "public, max-age=86400",
    (("x-content-type-options", "nosniff"),),
)
STATIC_FILES: tuple[StaticFile, ...] = (
    StaticFile("/openapi.json", "gen/openapi.json", "application/json"),
    *PLAYGROUND_FILES,
    FAVICON,
)


def route(static: StaticFile, root: Path | str) -> dict[str, Any]:
    """The Envoy route that answers ``static`` from the file under ``root``."""
    overwrite = "OVERWRITE_IF_EXISTS_OR_ADD"
    return {
        "name": f"static:{static.path}",
        "match": {
            "path": static.path,
            "headers": [{"name": ":method", "string_match": {"safe_regex": {"regex": "GET|HEAD"}}}],
        },
        "direct_response": {"status": 200, "body": {"filename": str(Path(root) / static.file)}},
        "response_headers_to_add": [
            {
                "header": {"key": "content-type", "value": static.content_type},
                "append_action": overwrite,
            },
            {
                "header": {"key": "cache-control", "value": static.cache_control},
                "append_action": overwrite,
            },
            *(
                {"header": {"key": key, "value": value}, "append_action": overwrite}
                for key, value in static.headers
            ),
        ],
        # Not gRPC: the transcoder would refuse an unknown method; nothing to buffer.
        "typed_per_filter_config": {
            TRANSCODER: {"@type": _FILTER_CONFIG, "disabled": True},
            BUFFER: {"@type": _BUFFER_PER_ROUTE, "disabled": True},
        },
    }


def add_routes(
    config: dict[str, Any], root: Path | str, files: Sequence[StaticFile] = STATIC_FILES
) -> None:
    """Puts a route for each of ``files`` (read under ``root``) in front of every virtual
    host of every API listener (one that transcodes: not the plaintext redirect, not the
    monitoring listener), and points the Lua filters' source files under ``root`` too.
    Listeners that share one route table get the routes once."""
    for route_config in _route_configs(config):
        for host in route_config["virtual_hosts"]:
            host["routes"][:0] = [route(static, root) for static in files]
    point_lua_sources(config, root)


def api_managers(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The HTTP connection managers that serve the API (those that transcode), each once
    (listeners may share one)."""
    managers: list[dict[str, Any]] = []
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                if network_filter["name"] != HTTP_MANAGER:
                    continue
                manager = network_filter["typed_config"]
                transcodes = any(f["name"] == TRANSCODER for f in manager.get("http_filters", []))
                if transcodes and not any(m is manager for m in managers):
                    managers.append(manager)
    return managers


def _route_configs(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    seen: set[int] = set()
    for manager in api_managers(config):
        route_config: dict[str, Any] = manager["route_config"]
        if id(route_config) not in seen:
            seen.add(id(route_config))
            yield route_config


# Filters whose Lua source is a file of the image (the routes filter: gen/edge_routes.lua).
LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
CORS_FILTER = "atelier.cors"
_ORIGINS_LINE = "local ORIGINS = {}  -- ATELIER_EDGE_CORS_ORIGINS"


def point_lua_sources(config: dict[str, Any], root: Path | str) -> None:
    """Every Lua filter whose source is a file under IMAGE_ROOT (as the template names
    it) reads that file under ``root`` instead."""
    for http_filter in _http_filters(config):
        source = http_filter["typed_config"].get("default_source_code", {})
        filename = source.get("filename", "")
        if http_filter["typed_config"].get("@type") == LUA and filename.startswith(IMAGE_ROOT):
            source["filename"] = str(Path(root) / filename.removeprefix(IMAGE_ROOT + "/"))


def cors_origins(value: str) -> tuple[str, ...]:
    """ATELIER_EDGE_CORS_ORIGINS: comma-separated origins (`https://app.example.com`),
    or `*` for any; empty: no cross-origin access."""
    origins = tuple(part.strip().rstrip("/") for part in value.split(",") if part.strip())
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?", origin):
            raise ValueError(f"not an origin (scheme://host[:port]): {origin!r}")
    if "*" in origins and len(origins) > 1:
        raise ValueError("`*` allows every origin: name no other")
    return origins


def set_cors_origins(config: dict[str, Any], origins: Sequence[str]) -> None:
    """The CORS filter allows ``origins`` (``("*",)``: any origin)."""
    table = "{" + ", ".join(f'["{origin}"] = true' for origin in origins) + "}"
    for http_filter in _http_filters(config):
        if http_filter["name"] != CORS_FILTER:
            continue
        source = http_filter["typed_config"]["default_source_code"]
        if _ORIGINS_LINE not in source["inline_string"]:
            raise ValueError(f"the {CORS_FILTER} filter has no line {_ORIGINS_LINE!r}")
        source["inline_string"] = source["inline_string"].replace(
            _ORIGINS_LINE, f"local ORIGINS = {table}  -- ATELIER_EDGE_CORS_ORIGINS"
        )


def _http_filters(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    seen: set[int] = set()
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                if network_filter["name"] != HTTP_MANAGER:
                    continue
                for http_filter in network_filter["typed_config"].get("http_filters", []):
                    if id(http_filter) not in seen:
                        seen.add(id(http_filter))
                        yield http_filter


def body_limit(config: dict[str, Any]) -> int:
    """The largest direct-response body the config's route tables allow (the smallest)."""
    return min(
        int(route_config.get("max_direct_response_body_size_bytes", 4096))
        for route_config in _route_configs(config)
    )
