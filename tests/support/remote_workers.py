"""Remote workers beside an API stack, for acceptance tests: `atelier worker --remote`
processes on the stack's creation internal listener, and a raw WorkerService channel for
tests that speak the protocol themselves."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping

import grpc

from services.dev.processes import spawn
from services.dev.stack import Stack
from tests.support.workers import WorkerProcess

# Two pools, each with its credential; the stack knows only their hashes.
POOL_CREDENTIALS = {
    "gpu": "gpu-pool-credential-0123456789",
    "office": "office-pool-credential-0123",
}


def pools_setting() -> str:
    return ",".join(
        f"{name}={hashlib.sha256(credential.encode()).hexdigest()}"
        for name, credential in POOL_CREDENTIALS.items()
    )


def internal_address(api: Stack) -> str:
    return f"127.0.0.1:{api.ports.internal['creation']}"


def start_remote_worker(
    api: Stack,
    name: str,
    env: Mapping[str, str],
    pool: str = "gpu",
    *,
    address: str | None = None,
) -> WorkerProcess:
    """`atelier worker --remote` on ``api``'s creation, sharing the stub's state directory
    (so an in-process worker can resume what it submitted). By default it dials the
    internal listener in plaintext (a loopback address); ``address`` and ``env`` point it
    elsewhere (the TLS listener: ATELIER_REMOTE_WORKER_PLAINTEXT=off and a CA)."""
    full = {
        "ATELIER_REMOTE_WORKER_CREDENTIAL": POOL_CREDENTIALS[pool],
        "ATELIER_REMOTE_WORKER_ID": name,
        "ATELIER_REMOTE_WORKER_PLAINTEXT": "loopback",
        "ATELIER_STUB_STATE_DIR": str(api.work_dir / "stub"),
        **env,
    }
    target = address or internal_address(api)
    argv = [
        sys.executable,
        "-c",
        "import sys; from services.cli import main; sys.exit(main())",
        "worker",
        "--remote",
        target,
    ]
    child = spawn(name, argv, full, api.work_dir / "logs")
    return WorkerProcess(child, target)


def pool_metadata(pool: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {POOL_CREDENTIALS[pool]}"),)


def channel(api: Stack) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(internal_address(api))
