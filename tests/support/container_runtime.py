"""The Docker engine the pod tests use (scripts/container-runtime.sh starts it, `make
container-runtime`), and the project's images built on it from the offline base."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
DEFAULT_SOCKET = Path("/var/cache/atelier-docker/docker.sock")
BASE_IMAGE = os.environ.get("ATELIER_BASE_IMAGE", "atelier-base:bookworm")
# `make test` sets it where it can run the runtime (root on Debian): there a missing
# engine fails the pod tests instead of skipping them.
REQUIRED = "ATELIER_REQUIRE_CONTAINER_RUNTIME"
# The images' tag: another checkout's pod tests on the same engine may set their own, so
# that two runs side by side never retag each other's images.
POD_IMAGE_TAG = os.environ.get("ATELIER_POD_IMAGE_TAG", "pod-test")
SERVICE_IMAGE = f"atelier:{POD_IMAGE_TAG}"
EDGE_IMAGE = f"atelier-edge:{POD_IMAGE_TAG}"


def docker_host() -> str | None:
    configured = os.environ.get("ATELIER_DOCKER_HOST")
    if configured:
        return configured
    directory = os.environ.get("ATELIER_DOCKER_DIR")
    socket = Path(directory) / "docker.sock" if directory else DEFAULT_SOCKET
    return f"unix://{socket}" if socket.is_socket() else None


def environment() -> dict[str, str]:
    """The docker CLI's environment: our engine, and the classic builder (BuildKit's
    `# syntax=` frontends and its own base image pulls need a registry)."""
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    host = docker_host()
    if host:
        env["DOCKER_HOST"] = host
    return env


def docker(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


@functools.cache
def unavailable() -> str | None:
    """Why no container can be run here, or None when the engine and the base answer."""
    if shutil.which("docker") is None:
        return "no docker CLI on this machine"
    if docker("info", timeout=30, check=False).returncode != 0:
        return (
            "no Docker engine answers (`make container-runtime` starts one as root on Debian; "
            "or set ATELIER_DOCKER_HOST)"
        )
    if docker("image", "inspect", BASE_IMAGE, timeout=30, check=False).returncode != 0:
        return f"the engine has no base image {BASE_IMAGE} (make container-runtime builds it)"
    return None


def require() -> None:
    """Skips the calling test where no runtime can be had, with the reason; fails it where
    `make test` said one must be there."""
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get(REQUIRED) == "1":
        pytest.fail(f"{REQUIRED}=1 but {reason}")
    pytest.skip(f"no container runtime: {reason}")


def build(tag: str, *, variant: str = "service", context: Path = ROOT) -> float:
    """Builds the image from the repository (or a copy of it: ``context``), layers cached by
    the engine; its seconds."""
    started = time.monotonic()
    done = docker(
        "build",
        "--network=host",
        f"--build-arg=PYTHON_IMAGE={BASE_IMAGE}",
        f"--build-arg=VARIANT={variant}",
        "-f",
        str(context / DOCKERFILE.relative_to(ROOT)),
        "-t",
        tag,
        str(context),
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return time.monotonic() - started
