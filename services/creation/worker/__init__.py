"""The job engine: the loop that claims jobs, the lease keeper that holds them, one
attempt at a job, and the reaper that resolves jobs whose worker died."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["context", "driver", "loop", "outcomes", "output_purger", "reaper"]
