"""`atelier serve creation --role ...`: which listeners and components each role runs."""

from __future__ import annotations

import socket
from pathlib import Path

from services.cli import main as atelier
from services.creation.app import build
from services.creation.settings import CreationSettings
from services.dev.processes import free_port, grpc_serving, spawn, venv_binary, wait_until


def _refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_worker_process_listens_only_internally(database_url: str, tmp_path: Path) -> None:
    public, internal = free_port(), free_port()
    env = {
        "ATELIER_ENV": "test",
        "ATELIER_DATABASE_URL": database_url,
        "ATELIER_CREATION_PUBLIC_PORT": str(public),
        "ATELIER_CREATION_INTERNAL_PORT": str(internal),
        "ATELIER_CREATION_METRICS_PORT": str(free_port()),
    }
    child = spawn(
        "creation-worker",
        [venv_binary("atelier"), "serve", "creation", "--role", "worker"],
        env,
        tmp_path,
    )
    try:
        # Probes reach it on the internal listener; nothing listens on the public port.
        wait_until(child, grpc_serving(f"127.0.0.1:{internal}"), 60)
        assert _refused(public)
    finally:
        assert child.stop() == 0


def test_roles_split_rpcs_from_components() -> None:
    settings = CreationSettings.from_env({})
    api = build(settings, "api")
    worker = build(settings, "worker")
    everything = build(settings, "all")
    assert api.serve_public and api.public and api.internal and not api.components
    assert not worker.serve_public and not worker.public and not worker.internal
    assert [c.name for c in worker.components] == [c.name for c in everything.components]
    assert everything.public and everything.internal


def test_role_is_for_creation_only() -> None:
    assert atelier(["serve", "media", "--role", "worker"]) == 2
