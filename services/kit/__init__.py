"""Plumbing every service shares, knowing none of them."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = [
    "auth",
    "client_times",
    "clock",
    "components",
    "db",
    "db_connect",
    "deadlines",
    "errors",
    "event_loop",
    "grpc_client",
    "idempotency",
    "ids",
    "listen",
    "logging",
    "migrations",
    "outages",
    "pagination",
    "ports",
    "readings",
    "server",
    "settings",
    "sizes",
    "timestamps",
    "tracing",
]
