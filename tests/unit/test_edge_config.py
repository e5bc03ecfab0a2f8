"""`atelier edge-config`: the Envoy pod's init container points the repository's edge
config at the Kubernetes Services (deploy/k8s/base/edge.yaml runs it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from services import edge_jwt, edge_static
from services.cli import main
from services.dev.processes import venv_binary
from services.edge_config import ADMIN_CLUSTER, EdgeConfigError, point
from services.kit.issuers import JwksBounds, TrustedIssuer
from tests.support.production_edge import POD_SDS_FILE, POD_TLS_DIR, local_sds_file, tls_secret

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "envoy" / "envoy.yaml"
UPSTREAMS = {
    "creation": ("creation-api", 50051),
    "media": ("media", 50052),
    "media_http": ("media", 50072),
    "notify": ("notify", 50053),
    "notify_streams": ("notify", 50053),
}


def args(out: Path, upstreams: dict[str, tuple[str, int]], *extra: str) -> list[str]:
    given = [f"--upstream={name}={host}:{port}" for name, (host, port) in upstreams.items()]
    descriptor = str(ROOT / "gen" / "atelier.binpb")
    return [
        "edge-config",
        f"--template={TEMPLATE}",
        f"--out={out}",
        f"--descriptor={descriptor}",
        "--admin=127.0.0.1:9901",
        *given,
        *extra,
    ]


def test_every_cluster_points_at_its_service_and_the_rest_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "envoy.yaml"
    assert main(args(out, UPSTREAMS)) == 0
    rendered = yaml.safe_load(out.read_text())
    template = yaml.safe_load(TEMPLATE.read_text())
    for cluster in rendered["static_resources"]["clusters"]:
        [group] = cluster["load_assignment"]["endpoints"]
        [endpoint] = group["lb_endpoints"]
        address = endpoint["endpoint"]["address"]["socket_address"]
        if cluster["name"] == ADMIN_CLUSTER:
            # The monitoring listener reaches the admin interface where it listens.
            assert (address["address"], address["port_value"]) == ("127.0.0.1", 9901)
            continue
        assert (address["address"], address["port_value"]) == UPSTREAMS[cluster["name"]]
        assert cluster["type"] == "STRICT_DNS"  # resolves a headless Service to every pod
    assert rendered["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 9901,
    }
    # Routes, filters and limits are the repository's, untouched; the files the edge serves
    # itself come first, read from the image.
    edge_static.add_routes(template, edge_static.IMAGE_ROOT)
    manager = rendered["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    expected = template["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    assert manager["typed_config"]["route_config"] == expected["typed_config"]["route_config"]
    static = manager["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]
    assert static["direct_response"]["body"] == {"filename": "/opt/atelier/share/gen/openapi.json"}
    assert str(ROOT / "gen" / "atelier.binpb") in out.read_text()


def test_envoy_accepts_the_rendered_config(tmp_path: Path) -> None:
    envoy = venv_binary("envoy")
    out = tmp_path / "envoy.yaml"
    # Envoy reads the static files to validate: the repository's, where the image has them.
    assert main(args(out, UPSTREAMS, f"--static-root={ROOT}")) == 0
    # The TLS listener's SDS file and the Secret it names must exist even to validate:
    # made here, where the pod would have them.
    mount, _ = tls_secret(tmp_path)
    text = (
        out.read_text()
        .replace(POD_SDS_FILE, str(local_sds_file(tmp_path, mount.directory)))
        .replace(POD_TLS_DIR, str(mount.directory))
    )
    out.write_text(text)
    checked = subprocess.run(
        [envoy, "--mode", "validate", "-c", str(out)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_admin_interface_must_listen_on_the_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "envoy.yaml"
    assert main([*args(out, UPSTREAMS), "--admin=0.0.0.0:9901"]) == 2
    assert "--admin must be a loopback address" in capsys.readouterr().err
    assert not out.exists()
    config = yaml.safe_load(TEMPLATE.read_text())
    point(config, UPSTREAMS, "/d.binpb", ("::1", 9911))
    assert config["admin"]["address"]["socket_address"] == {"address": "::1", "port_value": 9911}


def test_a_cluster_left_out_or_unknown_is_refused(tmp_path: Path) -> None:
    config = yaml.safe_load(TEMPLATE.read_text())
    partial = {k: v for k, v in UPSTREAMS.items() if k != "media_http"}
    with pytest.raises(EdgeConfigError, match="missing media_http"):
        point(config, partial, "/d.binpb")
    with pytest.raises(EdgeConfigError, match="no such cluster search"):
        point(config, {**UPSTREAMS, "search": ("search", 1)}, "/d.binpb")


def test_bad_upstreams_exit_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args(tmp_path / "a.yaml", {**UPSTREAMS, "media": ("media", 0)})) == 2
    assert "--upstream media must be HOST:PORT" in capsys.readouterr().err
    assert not (tmp_path / "a.yaml").exists()


def test_the_trusted_issuers_tokens_are_checked_by_the_edge_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATELIER_JWT_ISSUERS in the init container's environment (the services' settings):
    a jwt_authn provider per issuer, a TLS cluster for each key set, and the refusal
    filter, after the rate limit and before the routes."""
    issuers: list[dict[str, str | list[str]]] = [
        {
            "issuer": "https://appleid.apple.com",
            "audience": "com.example.app",
            "jwks_url": "https://appleid.apple.com/auth/keys",
        },
        {
            "issuer": "https://idp.example.com/",
            "audience": ["a", "b"],
            "jwks_url": "https://keys.example.com:8443/jwks",
        },
    ]
    monkeypatch.setenv("ATELIER_JWT_ISSUERS", json.dumps(issuers))
    monkeypatch.setenv("ATELIER_JWKS_DEFAULT_TTL", "300")
    out = tmp_path / "envoy.yaml"
    assert main(args(out, UPSTREAMS, f"--static-root={ROOT}")) == 0
    rendered = yaml.safe_load(out.read_text())
    api = rendered["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    names = [f["name"] for f in api["typed_config"]["http_filters"]]
    assert names.index("envoy.filters.http.local_ratelimit") < names.index(edge_jwt.JWT_AUTHN)
    assert names.index(edge_jwt.JWT_AUTHN) + 1 == names.index(edge_jwt.REFUSAL)
    assert names.index(edge_jwt.REFUSAL) + 1 == names.index("atelier.routes")
    jwt_filter = api["typed_config"]["http_filters"][names.index(edge_jwt.JWT_AUTHN)]
    providers = jwt_filter["typed_config"]["providers"]
    assert [p["issuer"] for p in providers.values()] == [i["issuer"] for i in issuers]
    assert providers["issuer_1"]["audiences"] == ["a", "b"]
    assert providers["issuer_0"]["remote_jwks"]["cache_duration"] == "300s"
    assert all(p["forward"] for p in providers.values())
    clusters = {c["name"]: c for c in rendered["static_resources"]["clusters"]}
    keys = clusters["jwks_1"]
    address = keys["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"] == {"address": "keys.example.com", "port_value": 8443}
    assert keys["transport_socket"]["typed_config"]["sni"] == "keys.example.com"
    # The other listeners check nothing: they serve no API call.
    for listener in rendered["static_resources"]["listeners"][1:]:
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        assert edge_jwt.JWT_AUTHN not in [f["name"] for f in manager["http_filters"]]
    # Envoy takes it (with the TLS Secret it needs to load, made here).
    mount, _ = tls_secret(tmp_path)
    text = (
        out.read_text()
        .replace(POD_SDS_FILE, str(local_sds_file(tmp_path, mount.directory)))
        .replace(POD_TLS_DIR, str(mount.directory))
    )
    out.write_text(text)
    checked = subprocess.run(
        [venv_binary("envoy"), "--mode", "validate", "-c", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_bad_trusted_issuers_stop_the_rendering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATELIER_JWT_ISSUERS", '[{"issuer": "http://idp.example.com"}]')
    out = tmp_path / "envoy.yaml"
    assert main(args(out, UPSTREAMS)) == 2
    assert "ATELIER_JWT_ISSUERS" in capsys.readouterr().err
    assert not out.exists()


def test_without_trusted_issuers_the_edge_checks_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ATELIER_JWT_ISSUERS", raising=False)
    out = tmp_path / "envoy.yaml"
    assert main(args(out, UPSTREAMS)) == 0
    assert edge_jwt.JWT_AUTHN not in out.read_text()


@pytest.mark.parametrize(("setting", "checked"), [("false", False), ("true", True)])
def test_the_edges_token_check_can_be_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, checked: bool
) -> None:
    """ATELIER_EDGE_CHECK_TOKENS=false: the issuers stay the services' alone (for one
    that signs with a key as soon as it publishes it)."""
    issuer = {
        "issuer": "https://idp.example.com/",
        "audience": "a",
        "jwks_url": "https://idp.example.com/jwks",
    }
    monkeypatch.setenv("ATELIER_JWT_ISSUERS", json.dumps([issuer]))
    monkeypatch.setenv("ATELIER_EDGE_CHECK_TOKENS", setting)
    out = tmp_path / "envoy.yaml"
    assert main(args(out, UPSTREAMS)) == 0
    assert (edge_jwt.JWT_AUTHN in out.read_text()) is checked


def test_a_bad_token_check_switch_stops_the_rendering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATELIER_EDGE_CHECK_TOKENS", "no")
    out = tmp_path / "envoy.yaml"
    assert main(args(out, UPSTREAMS)) == 2
    assert "ATELIER_EDGE_CHECK_TOKENS must be one of true, false" in capsys.readouterr().err
    assert not out.exists()


def test_an_issuer_whose_discovery_fails_is_left_out_with_a_warning() -> None:
    found = TrustedIssuer("https://a.example.com", ("x",), ("RS256",))
    lost = TrustedIssuer("https://b.example.com", ("x",), ("RS256",))
    warnings: list[str] = []

    def find(issuer: TrustedIssuer, timeout: float) -> str:
        if issuer is lost:
            raise OSError("connection refused")
        return issuer.issuer + "/keys"

    kept = edge_jwt.edge_issuers([found, lost], JwksBounds(), warnings.append, find)
    assert [(e.issuer, e.jwks_url) for e in kept] == [(found, "https://a.example.com/keys")]
    [warning] = warnings
    assert "https://b.example.com" in warning and "OSError" in warning
