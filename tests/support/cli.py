"""Running the `atelier` command as a user does: a real process, its exit code and output."""

from __future__ import annotations

import os
import selectors
import subprocess
import time

from services.dev.processes import free_port, grpc_serving, venv_binary

ATELIER = [venv_binary("atelier")]


def atelier(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ATELIER, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def read_until(process: subprocess.Popen[bytes], marker: bytes, timeout: float) -> bytes:
    """Reads the process's stderr until ``marker`` appears; fails if it exits first."""
    assert process.stderr is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stderr, selectors.EVENT_READ)
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {marker!r} within {timeout}s:\n{seen.decode(errors='replace')}"
        if selector.select(remaining):
            chunk = os.read(process.stderr.fileno(), 65536)
            assert chunk, f"exited early:\n{seen.decode(errors='replace')}"
            seen += chunk
    return seen


def dev_ports() -> dict[str, str]:
    """Free ports for every port `atelier dev` opens, by variable (without ATELIER_)."""
    return {
        name: str(free_port())
        for name in [
            "EDGE_PORT",
            "EDGE_ADMIN_PORT",
            "MEDIA_HTTP_PORT",
            "CONSOLE_PORT",
            *(
                f"{s}_{kind}_PORT"
                for s in ("CREATION", "MEDIA", "NOTIFY")
                for kind in ("PUBLIC", "INTERNAL", "METRICS")
            ),
        ]
    }


def wait_serving(process: subprocess.Popen[str], address: str, timeout: float = 30) -> None:
    """Polls gRPC health at ``address`` until SERVING; fails if the process exits first."""
    serving = grpc_serving(address)
    deadline = time.monotonic() + timeout
    while not serving():
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        assert time.monotonic() < deadline, f"{address} never became SERVING"
        time.sleep(0.1)
