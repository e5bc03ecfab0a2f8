"""The operator's console: a web page on the internal side, every action an AdminService
RPC made with the operator's own credential (docs/console.md)."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["settings"]
