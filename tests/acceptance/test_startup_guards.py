"""A process never starts half-right: a taken port stops `atelier serve` and `atelier dev`
with a message naming the port and its variable (exit code 2, no traceback, no second
listener sharing the port), a failed child means no "atelier is running." banner, and a
service that is not told it is a dev run refuses the public development secrets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.dev.processes import free_port
from tests.support.cli import ATELIER, atelier, dev_ports, wait_serving

REAL_SECRETS = {"ATELIER_JWT_SECRET": "j" * 40, "ATELIER_SERVICE_TOKEN": "s" * 40}


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process listens on — with SO_REUSEPORT, as a gRPC server would, so
    a listener that also set it would silently share the port."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    yield int(holder.getsockname()[1])
    holder.close()


def creation_ports() -> dict[str, str]:
    return {
        f"ATELIER_CREATION_{kind}_PORT": str(free_port())
        for kind in ("PUBLIC", "INTERNAL", "METRICS")
    }


def listeners(port: int) -> int:
    """How many sockets LISTEN on 127.0.0.1:``port`` (from /proc/net/tcp)."""
    wanted = f"0100007F:{port:04X}"
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for row in rows if row.split()[1] == wanted and row.split()[3] == "0A")


@pytest.mark.parametrize("kind", ["PUBLIC", "INTERNAL", "METRICS"])
def test_serve_stops_on_a_taken_port_naming_it(
    database_url: str, held_port: int, kind: str
) -> None:
    variable = f"ATELIER_CREATION_{kind}_PORT"
    env = {
        "ATELIER_ENV": "test",
        "ATELIER_DATABASE_URL": database_url,
        **creation_ports(),
        variable: str(held_port),
    }
    result = atelier("serve", "creation", env=env)
    assert result.returncode == 2, result.stderr
    assert f"127.0.0.1:{held_port}" in result.stderr
    assert variable in result.stderr
    assert "Address already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert listeners(held_port) == 1


def test_dev_stops_on_a_taken_port_before_starting_anything(tmp_path: Path, held_port: int) -> None:
    env = {f"ATELIER_{k}": v for k, v in dev_ports().items()}
    env["ATELIER_MEDIA_HTTP_PORT"] = str(held_port)
    env["ATELIER_DEV_DIR"] = str(tmp_path / "var")
    result = atelier("dev", env=env)
    assert result.returncode == 2, result.stderr
    assert f"127.0.0.1:{held_port}" in result.stderr
    assert "ATELIER_MEDIA_HTTP_PORT" in result.stderr
    assert "atelier is running" not in result.stderr
    assert "Traceback" not in result.stderr
    # Failed before PostgreSQL or any service was started.
    assert not (tmp_path / "var").exists()


def test_dev_prints_no_banner_when_a_service_fails(tmp_path: Path, database_url: str) -> None:
    env = {f"ATELIER_{k}": v for k, v in dev_ports().items()}
    env.update(
        {
            "ATELIER_DEV_DIR": str(tmp_path / "var"),
            "ATELIER_DATABASE_URL": database_url,
            # Read by creation only: the launcher starts, creation exits with code 2.
            "ATELIER_LEASE_TTL": "-5",
        }
    )
    result = atelier("dev", env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "atelier is running" not in result.stderr
    assert "creation exited with 2" in result.stderr
    assert "ATELIER_LEASE_TTL" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_without_atelier_env_refuses_the_development_secrets() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ATELIER_ENV"}
    result = subprocess.run(
        [*ATELIER, "serve", "creation"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "ATELIER_JWT_SECRET must be set in prod" in result.stderr
    assert "ATELIER_SERVICE_TOKEN must be set in prod" in result.stderr
    assert "ATELIER_ENV=dev" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_without_atelier_env_runs_with_real_secrets(database_url: str) -> None:
    ports = creation_ports()
    env = {k: v for k, v in os.environ.items() if k != "ATELIER_ENV"}
    env.update({"ATELIER_DATABASE_URL": database_url, **ports, **REAL_SECRETS})
    process = subprocess.Popen(
        [*ATELIER, "serve", "creation"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_serving(process, f"127.0.0.1:{ports['ATELIER_CREATION_PUBLIC_PORT']}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
