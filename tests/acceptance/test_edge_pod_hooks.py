"""The edge pod's probes and preStop hook (deploy/k8s/base/edge.yaml), run against a real
Envoy with the config its init container renders: before the hook, the readiness and
liveness probes' paths and the load balancer's /healthz answer 200; after it, /ready (the
readiness probe) and /healthz answer 503 while the liveness probe's path still answers,
on the monitoring listener the kubelet reaches (the admin interface is on the loopback)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from services.dev import edge
from services.dev.processes import spawn, venv_binary, wait_until
from tests.support.production_edge import production_config, tls_secret

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


def edge_pod() -> dict[str, Any]:
    for doc in yaml.safe_load_all((ROOT / "deploy/k8s/base/edge.yaml").read_text()):
        if doc["kind"] == "Deployment":
            return dict(doc["spec"]["template"]["spec"])
    raise AssertionError("no edge Deployment")


def status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def test_the_prestop_hook_takes_envoy_out_of_readiness_but_not_liveness(tmp_path: Path) -> None:
    pod = edge_pod()
    [envoy] = pod["containers"]
    hook: str = envoy["lifecycle"]["preStop"]["exec"]["command"][-1]
    ready_path = envoy["readinessProbe"]["httpGet"]["path"]
    alive_path = envoy["livenessProbe"]["httpGet"]["path"]
    mount, _ = tls_secret(tmp_path)
    config, ports = production_config(tmp_path, mount.directory, upstream_port=1)
    path = edge.write(tmp_path / "envoy.yaml", config)
    child = spawn(
        "edge",
        [venv_binary("envoy"), "-c", str(path), "--disable-hot-restart", "--drain-time-s", "1"],
        {},
        tmp_path,
    )
    try:
        monitoring = f"http://127.0.0.1:{ports.monitoring}"
        healthz = f"http://127.0.0.1:{ports.plaintext}/healthz"
        wait_until(child, lambda: status(f"{monitoring}{ready_path}") == 200, timeout=30)
        assert status(f"{monitoring}{alive_path}") == 200
        assert status(healthz) == 200
        # The hook as the kubelet runs it, on this admin port and without its wait.
        local = hook.replace("http://127.0.0.1:9901", f"http://127.0.0.1:{ports.admin}")
        local = re.sub(r"time\.sleep\(\d+\)", "None", local)
        assert local != hook
        exec(compile(local, "preStop", "exec"), {})  # noqa: S102 - our own manifest's hook
        assert status(f"{monitoring}{ready_path}") == 503
        assert status(healthz) == 503
        # Past the drain time the public listeners close; monitoring still answers.
        wait_until(child, lambda: status(healthz) == 0, timeout=30)
        assert status(f"{monitoring}{alive_path}") == 200
        assert status(f"{monitoring}{ready_path}") == 503
    finally:
        child.stop()
