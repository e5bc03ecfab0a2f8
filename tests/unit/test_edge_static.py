"""The files the edge answers itself (services/edge_static.py): exact-path direct-response
routes in front of the others, with their file, content type and, for the playground, its
policy headers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from services import edge_static
from services.dev import edge

ROOT = Path(__file__).resolve().parents[2]


def routes_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    routes: list[dict[str, Any]] = manager["typed_config"]["route_config"]["virtual_hosts"][0][
        "routes"
    ]
    return routes


def headers_of(route: dict[str, Any]) -> dict[str, str]:
    return {h["header"]["key"]: h["header"]["value"] for h in route["response_headers_to_add"]}


def test_the_playground_is_served_with_its_policy_and_the_document_without() -> None:
    config: dict[str, Any] = yaml.safe_load(edge.ENVOY_TEMPLATE.read_text())
    edge_static.add_routes(config, ROOT)
    routes = routes_of(config)
    assert routes[-1]["match"] == {"prefix": "/"}  # the 404 stays last
    served = {r["match"]["path"]: r for r in routes if r.get("name", "").startswith("static:")}
    assert set(served) == {
        "/openapi.json",
        "/",
        "/playground/app.js",
        "/playground/edge.js",
        "/playground/style.css",
        "/favicon.ico",
    }
    for static in edge_static.PLAYGROUND_FILES:
        route = served[static.path]
        assert Path(route["direct_response"]["body"]["filename"]).is_file()
        headers = headers_of(route)
        assert headers["content-type"] == static.content_type
        assert headers["cache-control"] == "no-cache"
        assert headers["x-content-type-options"] == "nosniff"
        assert "script-src 'self'" in headers["content-security-policy"]
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert route["typed_per_filter_config"][edge.TRANSCODER]["disabled"] is True
    assert "content-security-policy" not in headers_of(served["/openapi.json"])
    icon = served["/favicon.ico"]
    assert headers_of(icon)["content-type"] == "image/x-icon"
    assert Path(icon["direct_response"]["body"]["filename"]).read_bytes()[:4] == b"\0\0\1\0"


def test_the_local_edge_serves_the_playground_from_the_repository() -> None:
    config = edge.render(
        listen_port=1,
        admin_port=2,
        upstream_ports={"creation": 3, "media": 4, "notify": 5, "media_http": 6},
    )
    [page] = [r for r in routes_of(config) if r["match"].get("path") == "/"]
    assert page["direct_response"]["body"]["filename"] == str(
        ROOT / "web" / "playground" / "index.html"
    )
