"""`atelier dev` and the test stacks: embedded PostgreSQL, processes, Envoy, the APNs peer."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = [
    "apns_peer",
    "edge",
    "fleet",
    "launcher",
    "postgres",
    "processes",
    "running",
    "stack",
]
