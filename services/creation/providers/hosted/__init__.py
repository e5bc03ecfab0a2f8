"""What the hosted vendors' adapters share: the HTTP client and its error mapping onto the
failure table, the input photo as a vendor takes it, and the checked output download."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["adapter", "http", "models"]
