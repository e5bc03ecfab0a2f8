"""Files the edge serves by itself: the web playground at ``/``.

Each file becomes an Envoy ``direct_response`` route whose body is the file's bytes,
inlined when the edge's config is rendered (``atelier dev``, the tests, and ``atelier
edge-config`` in the Kubernetes edge pod, which reads the files from the image). Envoy
then needs no file system access and no extra upstream for them; the price is a config
that carries the bytes, so only small files belong here (MAX_FILE_BYTES).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Where the files live: the repository's web/ (a local run), /opt/atelier/share/web in the
# image (deploy/image/Dockerfile).
REPOSITORY_WEB = Path(__file__).resolve().parents[1] / "web"
IMAGE_WEB = Path("/opt/atelier/share/web")
# Envoy refuses a direct response body over the route config's
# max_direct_response_body_size_bytes (4 KiB unless raised); we raise it to the largest
# file, up to this much.
MAX_FILE_BYTES = 256 * 1024
ENVOY_DEFAULT_MAX_BODY = 4096

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
_TRANSCODER = "envoy.filters.http.grpc_json_transcoder"
_BUFFER = "envoy.filters.http.buffer"
_TYPES = "type.googleapis.com/envoy"


@dataclass(frozen=True)
class StaticFile:
    """One file the edge answers ``GET path`` (and ``HEAD``) with."""

    path: str
    file: Path
    content_type: str


def playground(web: Path = REPOSITORY_WEB) -> list[StaticFile]:
    """The playground's page and its modules (web/playground/)."""
    folder = web / "playground"
    javascript = "text/javascript; charset=utf-8"
    return [
        StaticFile("/", folder / "index.html", "text/html; charset=utf-8"),
        StaticFile("/playground/app.js", folder / "app.js", javascript),
        StaticFile("/playground/edge.js", folder / "edge.js", javascript),
        StaticFile("/playground/style.css", folder / "style.css", "text/css; charset=utf-8"),
    ]


class StaticFileError(Exception):
    """A file to serve is missing or too large for a direct response."""


def add_static_routes(config: dict[str, Any], files: Sequence[StaticFile]) -> None:
    """Adds a direct-response route for each of ``files`` to every route config of
    ``config``, before its catch-all, and raises the direct response size limit to fit."""
    bodies = [(static, _read(static.file)) for static in files]
    largest = max((len(body.encode()) for _, body in bodies), default=0)
    for route_config in _route_configs(config):
        route_config["max_direct_response_body_size_bytes"] = max(
            largest,
            int(route_config.get("max_direct_response_body_size_bytes", ENVOY_DEFAULT_MAX_BODY)),
        )
        for host in route_config["virtual_hosts"]:
            routes: list[dict[str, Any]] = host["routes"]
            # Before the catch-all 404 (the last route), after everything else.
            catch_all = bool(routes) and routes[-1]["match"] == {"prefix": "/"}
            at = len(routes) - 1 if catch_all else len(routes)
            routes[at:at] = [_route(static, body) for static, body in bodies]


def _read(file: Path) -> str:
    try:
        data = file.read_bytes()
    except OSError as error:
        raise StaticFileError(f"cannot read {file}: {error.strerror}") from error
    if len(data) > MAX_FILE_BYTES:
        raise StaticFileError(f"{file} has {len(data)} bytes; at most {MAX_FILE_BYTES} are served")
    return data.decode("utf-8")


def _route_configs(config: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """Each HTTP connection manager's route config once (the listeners may share one)."""
    seen: set[int] = set()
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                route_config = network_filter["typed_config"].get("route_config")
                if route_config is not None and id(route_config) not in seen:
                    seen.add(id(route_config))
                    yield route_config


def _route(static: StaticFile, body: str) -> dict[str, Any]:
    headers = {
        "content-type": static.content_type,
        "cache-control": "no-cache",
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "content-security-policy": PLAYGROUND_CSP,
    }
    return {
        "name": f"static {static.path}",
        "match": {
            "path": static.path,
            "headers": [{"name": ":method", "string_match": {"safe_regex": {"regex": "GET|HEAD"}}}],
        },
        "direct_response": {"status": 200, "body": {"inline_string": body}},
        "response_headers_to_add": [
            {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
            for key, value in headers.items()
        ],
        # Not gRPC: the transcoder (whose reject_unknown_method would answer 404) and the
        # JSON body buffer stay out of the way.
        "typed_per_filter_config": {
            _TRANSCODER: {
                "@type": f"{_TYPES}.config.route.v3.FilterConfig",
                "disabled": True,
            },
            _BUFFER: {
                "@type": f"{_TYPES}.extensions.filters.http.buffer.v3.BufferPerRoute",
                "disabled": True,
            },
        },
    }
