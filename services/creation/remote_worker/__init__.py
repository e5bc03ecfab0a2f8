"""The reference remote worker (`atelier worker --remote ADDRESS`): runs provider adapters
through WorkerService, with no database; see docs/remote-workers.md."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["worker"]
