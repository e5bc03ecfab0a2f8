"""The contract: buf lint, generated code in step with protos/, and an edge that is
derived from the same descriptor set and exposes the public services only."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from services.dev import edge
from services.dev.processes import venv_binary
from tests.support.production_edge import POD_SDS_FILE, POD_TLS_DIR, local_sds_file, tls_secret

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {
    "atelier.creation.v1.CreationService",
    "atelier.media.v1.MediaService",
    "atelier.notify.v1.NotifyService",
}
INTERNAL = {
    "atelier.creation.v1.AdminService",
    "atelier.creation.v1.QueueStandingService",
    "atelier.creation.v1.WorkerService",
    "atelier.media.v1.MediaInternalService",
    "atelier.notify.v1.NotifyIngestService",
    "atelier.notify.v1.NotifyFeedService",
    "atelier.notify.v1.NotifyAdminService",
}


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False, **kwargs
    )  # type: ignore[call-overload]


def test_buf_lint_is_clean() -> None:
    result = run([venv_binary("buf"), "lint"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    result = run(["bash", "scripts/gen-protos.sh", str(tmp_path / "gen")])
    assert result.returncode == 0, result.stderr
    comparison = filecmp.dircmp(ROOT / "gen", tmp_path / "gen")
    stale: list[str] = []

    def collect(cmp: filecmp.dircmp[str], prefix: str) -> None:
        stale.extend(prefix + n for n in cmp.diff_files + cmp.left_only + cmp.right_only)
        for name, sub in cmp.subdirs.items():
            collect(sub, f"{prefix}{name}/")

    collect(comparison, "")
    # filecmp's shallow check trusts size+mtime; compare bytes of the rest too.
    for path in (tmp_path / "gen").rglob("*"):
        if path.is_file():
            committed = ROOT / "gen" / path.relative_to(tmp_path / "gen")
            if committed.exists() and committed.read_bytes() != path.read_bytes():
                stale.append(str(path.relative_to(tmp_path / "gen")))
    assert not stale, f"gen/ is stale, run `make proto`: {sorted(set(stale))}"


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    return descriptor_pb2.FileDescriptorSet.FromString(
        (ROOT / "gen" / "atelier.binpb").read_bytes()
    )


def services() -> dict[str, descriptor_pb2.ServiceDescriptorProto]:
    found = {}
    for file in descriptor_set().file:
        for service in file.service:
            if file.package.startswith("atelier."):
                found[f"{file.package}.{service.name}"] = service
    return found


def test_every_public_rpc_has_an_http_rule_and_no_internal_one_does() -> None:
    found = services()
    assert set(found) == PUBLIC | INTERNAL
    for name, service in found.items():
        for method in service.method:
            has_rule = method.options.HasExtension(annotations_pb2.http)
            if name in PUBLIC:
                assert has_rule, f"{name}.{method.name} has no google.api.http rule"
            else:
                assert not has_rule, f"internal {name}.{method.name} must not be mapped to HTTP"


def test_descriptor_carries_error_details_for_json_errors() -> None:
    names = {f.name for f in descriptor_set().file}
    assert "google/rpc/error_details.proto" in names


def test_edge_transcodes_and_routes_public_services_only() -> None:
    config = edge.render(
        listen_port=1,
        admin_port=2,
        upstream_ports={"creation": 3, "media": 4, "notify": 5, "media_http": 6},
    )
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    transcoder = next(f for f in manager["http_filters"] if f["name"] == edge.TRANSCODER)[
        "typed_config"
    ]
    assert set(transcoder["services"]) == PUBLIC
    assert transcoder["convert_grpc_status"] is True
    routes = manager["route_config"]["virtual_hosts"][0]["routes"]
    # Routes match a prefix, an exact path or (reads of one service) a regular expression.
    matches = [
        r["match"].get("prefix") or r["match"].get("path") or r["match"]["safe_regex"]["regex"]
        for r in routes
    ]
    assert not any(internal in m.replace("\\", "") for m in matches for internal in INTERNAL)
    # Streaming routes have no timeout; the catch-all answers 404.
    watch = next(r for r, m in zip(routes, matches, strict=True) if "WatchJob" in m)
    assert watch["route"]["timeout"] == "0s"
    assert routes[-1]["direct_response"]["status"] == 404
    # media's signed object URLs are plain HTTP: routed (before the catch-all) to its object
    # listener, with the transcoder off, never to a gRPC cluster.
    objects = [r for r in routes if r["match"].get("prefix") == "/media-objects/"]
    assert objects and all(routes.index(r) < len(routes) - 1 for r in objects)
    assert {r["route"]["cluster"] for r in objects if "route" in r} == {"media_http"}
    for route in objects:
        assert route["typed_per_filter_config"][edge.TRANSCODER]["disabled"] is True


def test_edge_balances_over_every_replica_it_is_given() -> None:
    """Several ports for a cluster: one endpoint each (replicas); one port: one endpoint,
    as every single-process stack renders it."""
    config = edge.render(
        listen_port=1,
        admin_port=2,
        upstream_ports={"creation": [3, 13], "media": (4, 14, 24), "notify": 5, "media_http": [6]},
    )

    def ports(cluster: str) -> list[int]:
        found = next(c for c in config["static_resources"]["clusters"] if c["name"] == cluster)
        return [
            endpoint["endpoint"]["address"]["socket_address"]["port_value"]
            for group in found["load_assignment"]["endpoints"]
            for endpoint in group["lb_endpoints"]
        ]

    assert ports("creation") == [3, 13]
    assert ports("media") == [4, 14, 24]
    assert ports("notify") == ports("notify_streams") == [5]
    assert ports("media_http") == [6]


@pytest.mark.parametrize("rendered", [False, True])
def test_envoy_accepts_the_config(tmp_path: Path, rendered: bool) -> None:
    if rendered:
        config_path = edge.write(
            tmp_path / "envoy.yaml",
            edge.render(
                listen_port=18080,
                admin_port=19901,
                upstream_ports={"creation": 1, "media": 2, "notify": 3, "media_http": 4},
            ),
        )
    else:
        # The deployable file as it is, with the descriptor where it expects it.
        # The TLS Secret a deployment mounts, made here, and the SDS file reading it.
        mount, _ = tls_secret(tmp_path)
        text = (
            edge.ENVOY_TEMPLATE.read_text()
            .replace("/etc/envoy/atelier.binpb", str(edge.DESCRIPTOR))
            .replace(POD_SDS_FILE, str(local_sds_file(tmp_path, mount.directory)))
            .replace(POD_TLS_DIR, str(mount.directory))
            .replace("/opt/atelier/share/gen/", str(edge.ROOT / "gen") + "/")
        )
        config_path = tmp_path / "envoy.yaml"
        config_path.write_text(text)
    result = run([venv_binary("envoy"), "--mode", "validate", "-c", str(config_path)])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
