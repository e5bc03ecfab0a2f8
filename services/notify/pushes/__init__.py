"""APNs pushes before they are sent: the tokens users register and the pushes each job
update implies (recorded in the update's transaction for the sender to deliver)."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["planner", "planning", "tokens"]
