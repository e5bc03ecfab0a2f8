"""The edge pod's preStop hook (deploy/k8s/base/edge.yaml), run against a real Envoy with
the config its init container renders: after it, Envoy's /ready (the pod's readiness
probe) answers 503, while /server_info (the liveness probe) still answers."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml

from services.dev.processes import free_port, spawn, venv_binary, wait_until
from services.edge_config import point

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


def edge_pod() -> dict[str, object]:
    for doc in yaml.safe_load_all((ROOT / "deploy/k8s/base/edge.yaml").read_text()):
        if doc["kind"] == "Deployment":
            return dict(doc["spec"]["template"]["spec"])
    raise AssertionError("no edge Deployment")


def status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def test_the_prestop_hook_takes_envoy_out_of_readiness(tmp_path: Path) -> None:
    pod = edge_pod()
    [envoy] = pod["containers"]  # type: ignore[index]
    hook: str = envoy["lifecycle"]["preStop"]["exec"]["command"][-1]
    # The init container's rendering, with local ports: this test must not take 8080.
    config = yaml.safe_load((ROOT / "deploy/envoy/envoy.yaml").read_text())
    upstream = ("127.0.0.1", free_port())
    names = [c["name"] for c in config["static_resources"]["clusters"]]
    admin = free_port()
    point(
        config,
        dict.fromkeys(names, upstream),
        str(ROOT / "gen/atelier.binpb"),
        ("127.0.0.1", admin),
        # The files the edge serves itself: the repository's, where the image has them.
        str(ROOT),
    )
    listeners = config["static_resources"]["listeners"]
    # A TLS listener needs a certificate this test does not make: the hook is the same.
    config["static_resources"]["listeners"] = [
        listener
        for listener in listeners
        if not any("transport_socket" in chain for chain in listener["filter_chains"])
    ]
    for listener in config["static_resources"]["listeners"]:
        listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": free_port()}
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    child = spawn(
        "edge",
        [venv_binary("envoy"), "-c", str(path), "--disable-hot-restart", "--drain-time-s", "1"],
        {},
        tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{admin}"
        wait_until(child, lambda: status(f"{base}/ready") == 200, timeout=30)
        # The hook as the kubelet runs it, on this admin port and without its wait.
        local = hook.replace("http://127.0.0.1:9901", base)
        local = re.sub(r"time\.sleep\(\d+\)", "None", local)
        assert local != hook
        exec(compile(local, "preStop", "exec"), {})  # noqa: S102 - our own manifest's hook
        assert status(f"{base}/ready") == 503
        assert status(f"{base}/server_info") == 200
    finally:
        child.stop()
