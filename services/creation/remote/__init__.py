"""WorkerService: remote workers claim, run and finish jobs over their own listener."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["errors", "service", "servicer", "settings"]
