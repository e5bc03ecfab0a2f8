"""Listening on a configured port, or stopping with a message that names the port and
the ATELIER_* variable that chose it (exit code 2, as for any bad setting)."""

from __future__ import annotations

import socket
from typing import Any

from services.kit.settings import PREFIX, SettingsError


class PortUnavailable(SettingsError):
    """A configured port cannot be listened on (usually: another process holds it)."""

    def __init__(self, host: str, port: int, variable: str) -> None:
        super().__init__(
            f"cannot listen on {host}:{port} ({why_unbindable(host, port)}); "
            f"stop what holds it or set {PREFIX}{variable} to another port"
        )
        self.port = port
        self.variable = PREFIX + variable


def listen_variable(service: str, kind: str) -> str:
    """The variable naming one of a service's ports: ``CREATION_PUBLIC_PORT``."""
    return f"{service.upper()}_{kind.upper()}_PORT"


def why_unbindable(host: str, port: int) -> str:
    """The operating system's reason, found by trying a plain bind (gRPC hides it)."""
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        probe.bind((host, port))
    except OSError as error:
        return error.strerror or str(error)
    finally:
        probe.close()
    return "the address was refused"


def is_free(host: str, port: int) -> bool:
    """True when nothing listens on the port (a listener with SO_REUSEPORT included)."""
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    # Ignore connections lingering in TIME_WAIT, as servers do; a listener still blocks.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, port))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def bind_grpc(server: Any, host: str, port: int, variable: str) -> int:
    """``server.add_insecure_port``, failing with PortUnavailable instead of gRPC's
    RuntimeError. The server must not set SO_REUSEPORT (kit.server.SERVER_OPTIONS), or a
    second process would silently share the port."""
    try:
        return int(server.add_insecure_port(f"{host}:{port}"))
    except RuntimeError:
        raise PortUnavailable(host, port, variable) from None


def bind_grpc_tls(server: Any, host: str, port: int, variable: str, credentials: Any) -> int:
    """``server.add_secure_port``, failing as :func:`bind_grpc` does."""
    try:
        return int(server.add_secure_port(f"{host}:{port}", credentials))
    except RuntimeError:
        raise PortUnavailable(host, port, variable) from None
