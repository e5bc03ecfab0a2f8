"""The outbox relay: creation's job changes, delivered to notify at least once."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["jobs", "notify_client", "pruning", "relay"]
