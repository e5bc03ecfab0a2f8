"""The edge's routes table (gen/edge_routes.lua) and its CORS setting, as rendered; what
Envoy does with them is tests/acceptance/test_edge_http.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from services import edge_static
from services.dev import edge
from services.dev.openapi.__main__ import render_routes

ROOT = Path(__file__).resolve().parents[2]


def lua_match(pattern: str, path: str) -> bool:
    """Lua's find for the few pattern items the table uses (%x escapes, [^/:]+, .+)."""
    regex = re.sub(r"%(.)", lambda m: re.escape(m.group(1)), pattern)
    return re.search(regex, path) is not None


@pytest.mark.parametrize(
    ("template", "matches", "misses"),
    [
        ("/v1/jobs/{job_id}", ["/v1/jobs/abc"], ["/v1/jobs/abc:cancel", "/v1/jobs/a/b"]),
        ("/v1/jobs/{job_id}:cancel", ["/v1/jobs/abc:cancel"], ["/v1/jobs/abc"]),
        ("/v1/jobs:watch", ["/v1/jobs:watch"], ["/v1/jobs", "/v1/jobsXwatch"]),
        ("/v1/things/{name=**}", ["/v1/things/a/b/c"], ["/v1/things/"]),
    ],
)
def test_a_path_pattern_matches_as_the_transcoder_does(
    template: str, matches: list[str], misses: list[str]
) -> None:
    from services.dev.openapi.edge_routes import path_pattern

    pattern = path_pattern(template)
    assert all(lua_match(pattern, path) for path in matches), pattern
    assert not any(lua_match(pattern, path) for path in misses), pattern


def test_the_committed_table_is_what_the_descriptor_makes() -> None:
    made = render_routes(ROOT / "gen" / "atelier.binpb", edge.ENVOY_TEMPLATE)
    assert (ROOT / "gen" / "edge_routes.lua").read_text() == made
    assert '{pattern = "^/v1/catalog$", methods = {GET = false}, enums = ' in made
    assert 'POST = "atelier.creation.v1.SubmitJobRequest"' in made
    assert '["modelId"] = {kind = "string"}, ["model_id"] = {kind = "string"}' in made
    assert 'enums = {GET = {["mediaKind"] = true, ["media_kind"] = true}}}' in made
    assert '["environment"] = {kind = "enum"}' in made


def test_the_renderers_point_the_routes_filter_at_their_copy() -> None:
    config = edge.render(
        listen_port=1,
        admin_port=2,
        upstream_ports=dict.fromkeys(("creation", "media", "notify", "media_http"), 3),
    )
    [routes] = [
        f
        for f in config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
            "typed_config"
        ]["http_filters"]
        if f["name"] == "atelier.routes"
    ]
    assert routes["typed_config"]["default_source_code"]["filename"] == str(
        ROOT / "gen" / "edge_routes.lua"
    )
    template = yaml.safe_load(edge.ENVOY_TEMPLATE.read_text())
    edge_static.point_lua_sources(template, "/srv/share")
    text = yaml.safe_dump(template)
    assert "/srv/share/gen/edge_routes.lua" in text and "/opt/atelier/share" not in text


@pytest.mark.parametrize(
    ("value", "origins"),
    [
        ("", ()),
        ("*", ("*",)),
        (
            "https://app.example.com, http://localhost:5173/",
            ("https://app.example.com", "http://localhost:5173"),
        ),
    ],
)
def test_cors_origins_are_read_as_origins(value: str, origins: tuple[str, ...]) -> None:
    assert edge_static.cors_origins(value) == origins


@pytest.mark.parametrize("value", ["app.example.com", "https://a.example/path", "*, https://a.b"])
def test_anything_but_an_origin_or_star_alone_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="origin"):
        edge_static.cors_origins(value)


def test_the_cors_filter_gets_the_origins_and_no_credentials() -> None:
    config = yaml.safe_load(edge.ENVOY_TEMPLATE.read_text())
    edge_static.set_cors_origins(config, ("https://app.example.com",))
    [cors] = [
        f
        for f in config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
            "typed_config"
        ]["http_filters"]
        if f["name"] == edge_static.CORS_FILTER
    ]
    source = cors["typed_config"]["default_source_code"]["inline_string"]
    assert 'local ORIGINS = {["https://app.example.com"] = true}' in source
    assert 'headers:remove("access-control-allow-credentials")' in source
