"""Provider adapters behind one two-phase interface (base.py), chosen by the registry."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["base", "failures", "limits", "registry", "stub"]
