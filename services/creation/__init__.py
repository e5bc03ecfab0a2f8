"""creation: jobs and their state machine, the catalog, quotas and points, the outbox
relay and the job engine (see docs/ and DESIGN.md's layout)."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = [
    "domain",
    "media_client",
    "object_transfer",
    "parameters",
    "providers",
    "queue_standing",
    "remote_worker",
    "settings",
    "store",
    "submission",
    "tables",
    "waits",
    "webhooks",
    "worker",
]
