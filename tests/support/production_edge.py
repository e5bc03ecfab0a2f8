"""The production edge on one machine: deploy/envoy/envoy.yaml as the edge pod's init
container renders it (services/edge_config.point), with the pod's paths and ports made
local, and a directory that holds the TLS Secret the way the kubelet mounts one."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.dev.processes import free_port
from services.edge_config import ADMIN_CLUSTER, point
from tests.support.certificates import self_signed_for

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "envoy" / "envoy.yaml"
SDS_FILE = ROOT / "deploy" / "envoy" / "edge-tls-sds.yaml"
DESCRIPTOR = ROOT / "gen" / "atelier.binpb"
# Where the edge pod has its TLS Secret and the template ConfigMap (deploy/k8s/base/edge.yaml).
POD_TLS_DIR = "/etc/envoy/tls"
POD_SDS_FILE = "/etc/envoy-template/edge-tls-sds.yaml"


@dataclass(frozen=True)
class ProductionPorts:
    tls: int
    plaintext: int
    monitoring: int
    admin: int


def production_config(
    work: Path, tls_dir: Path, upstream_port: int
) -> tuple[dict[str, Any], ProductionPorts]:
    """The rendered production config on free local ports, its TLS Secret read from
    ``tls_dir`` (see :class:`SecretMount`) and every upstream at ``upstream_port``."""
    config = yaml.safe_load(TEMPLATE.read_text())
    names = [c["name"] for c in config["static_resources"]["clusters"]]
    admin = free_port()
    point(
        config,
        {name: ("127.0.0.1", upstream_port) for name in names if name != ADMIN_CLUSTER},
        str(DESCRIPTOR),
        ("127.0.0.1", admin),
        # The files the edge serves itself: the repository's, where the image has them.
        str(ROOT),
    )
    ports: dict[str, int] = {}
    for listener in config["static_resources"]["listeners"]:
        ports[listener["name"]] = free_port()
        listener["address"]["socket_address"] = {
            "address": "127.0.0.1",
            "port_value": ports[listener["name"]],
        }
    sds = local_sds_file(work, tls_dir)
    localized = _local_paths(config, {POD_SDS_FILE: str(sds), POD_TLS_DIR: str(tls_dir)})
    return localized, ProductionPorts(
        tls=ports["edge_tls"], plaintext=ports["edge"], monitoring=ports["monitoring"], admin=admin
    )


def local_sds_file(work: Path, tls_dir: Path) -> Path:
    """deploy/envoy/edge-tls-sds.yaml reading the Secret from ``tls_dir``, in ``work``."""
    sds = work / "edge-tls-sds.yaml"
    resources = _local_paths(yaml.safe_load(SDS_FILE.read_text()), {POD_TLS_DIR: str(tls_dir)})
    sds.write_text(yaml.safe_dump(resources, sort_keys=False))
    return sds


def tls_secret(work: Path) -> tuple[SecretMount, Path]:
    """A TLS Secret mounted as the kubelet does, holding a fresh self-signed certificate
    for 127.0.0.1 and localhost; the certificate's file."""
    cert, key = self_signed_for(work, ("localhost",), ("127.0.0.1",), stem="secret")
    mount = SecretMount(work / "tls")
    mount.write({"tls.crt": cert.read_bytes(), "tls.key": key.read_bytes()})
    return mount, cert


def _local_paths(node: Any, paths: dict[str, str]) -> Any:
    """``node`` with every string that is one of the pod's paths, or under one, local."""
    if isinstance(node, dict):
        return {key: _local_paths(value, paths) for key, value in node.items()}
    if isinstance(node, list):
        return [_local_paths(item, paths) for item in node]
    if isinstance(node, str):
        for pod, local in paths.items():
            if node == pod or node.startswith(pod + "/"):
                return local + node.removeprefix(pod)
    return node


class SecretMount:
    """A directory laid out as the kubelet mounts a Secret, and updated as it updates one:
    the files live in a hidden versioned directory, `..data` links to it, and each key is
    a link through `..data`. An update writes a new versioned directory, links
    `..data_tmp` to it and renames that over `..data` (one atomic move into the watched
    directory), then removes the old version."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._version = 0

    def write(self, files: dict[str, bytes]) -> None:
        self._version += 1
        version = f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{self._version}"
        (self.directory / version).mkdir()
        for name, content in files.items():
            (self.directory / version / name).write_bytes(content)
        data = self.directory / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        tmp = self.directory / "..data_tmp"
        os.symlink(version, tmp)
        os.rename(tmp, data)
        for name in files:
            link = self.directory / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)
        if old is not None:
            shutil.rmtree(self.directory / old)
