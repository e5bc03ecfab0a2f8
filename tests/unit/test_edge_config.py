"""`atelier edge-config`: the Envoy pod's init container points the repository's edge
config at the Kubernetes Services (deploy/k8s/base/edge.yaml runs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services import edge_static
from services.cli import main
from services.dev.processes import venv_binary
from services.edge_config import EdgeConfigError, point
from tests.support.certificates import self_signed

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "envoy" / "envoy.yaml"
# Where the edge pod mounts its TLS Secret (deploy/k8s/base/edge.yaml).
POD_TLS_DIR = "/etc/envoy/tls/"
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
        "--admin=0.0.0.0:9901",
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
        assert (address["address"], address["port_value"]) == UPSTREAMS[cluster["name"]]
        assert cluster["type"] == "STRICT_DNS"  # resolves a headless Service to every pod
    assert rendered["admin"]["address"]["socket_address"] == {
        "address": "0.0.0.0",
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


def with_local_tls_files(node: Any, files: dict[str, Path]) -> Any:
    """The config with the files the pod mounts at /etc/envoy/tls/ read from ``files``."""
    if isinstance(node, dict):
        return {
            key: str(files[Path(value).name])
            if key == "filename" and str(value).startswith(POD_TLS_DIR)
            else with_local_tls_files(value, files)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [with_local_tls_files(item, files) for item in node]
    return node


def test_envoy_accepts_the_rendered_config(tmp_path: Path) -> None:
    envoy = venv_binary("envoy")
    out = tmp_path / "envoy.yaml"
    # Envoy reads the static files to validate: the repository's, where the image has them.
    assert main(args(out, UPSTREAMS, f"--static-root={ROOT}")) == 0
    # A TLS listener loads its certificate even to validate: give it one where the pod
    # would have the Secret's.
    cert, key = self_signed(tmp_path)
    files = {"tls.crt": cert, "tls.key": key}
    rendered = with_local_tls_files(yaml.safe_load(out.read_text()), files)
    out.write_text(yaml.safe_dump(rendered, sort_keys=False))
    checked = subprocess.run(
        [envoy, "--mode", "validate", "-c", str(out)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


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
