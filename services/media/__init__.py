"""media: asset rows and every object-storage write; presigned URLs."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["domain", "settings"]
