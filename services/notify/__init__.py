"""notify: the projection of job state, client streams, devices and APNs pushes."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["apns", "pushes", "store", "streams"]
