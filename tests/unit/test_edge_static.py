"""The files the edge answers itself (services/edge_static.py): direct-response routes
before the catch-all, with their bytes, content type and policy, within Envoy's size limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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


def template() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(edge.ENVOY_TEMPLATE.read_text())
    return loaded


def test_each_file_is_answered_before_the_catch_all_with_its_bytes_and_headers() -> None:
    config = template()
    files = edge_static.playground()
    edge_static.add_static_routes(config, files)
    routes = routes_of(config)
    assert routes[-1]["match"] == {"prefix": "/"}  # the 404 stays last
    served = {r["match"]["path"]: r for r in routes if r.get("name", "").startswith("static ")}
    assert set(served) == {
        "/",
        "/playground/app.js",
        "/playground/edge.js",
        "/playground/style.css",
    }
    for static in files:
        route = served[static.path]
        assert route["direct_response"]["body"]["inline_string"] == static.file.read_text()
        headers = {
            h["header"]["key"]: h["header"]["value"] for h in route["response_headers_to_add"]
        }
        assert headers["content-type"] == static.content_type
        assert "script-src 'self'" in headers["content-security-policy"]
        assert route["typed_per_filter_config"][edge.TRANSCODER]["disabled"] is True
    largest = max(len(f.file.read_bytes()) for f in files)
    route_config = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]
    assert route_config["max_direct_response_body_size_bytes"] >= largest > 4096


def test_a_file_too_large_for_a_direct_response_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.html"
    big.write_bytes(b"x" * (edge_static.MAX_FILE_BYTES + 1))
    with pytest.raises(edge_static.StaticFileError, match="at most"):
        edge_static.add_static_routes(template(), [edge_static.StaticFile("/", big, "text/html")])


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(edge_static.StaticFileError, match=r"missing\.html"):
        edge_static.add_static_routes(
            template(), [edge_static.StaticFile("/", tmp_path / "missing.html", "text/html")]
        )


def test_the_local_edge_serves_the_playground() -> None:
    config = edge.render(
        listen_port=1,
        admin_port=2,
        upstream_ports={"creation": 3, "media": 4, "notify": 5, "media_http": 6},
    )
    assert any(r["match"].get("path") == "/" for r in routes_of(config))
