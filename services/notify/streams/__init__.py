"""Client streams: the changes they carry, each stream's bounded inbox, the registry that
routes changes to local streams, the fan-out between replicas and the backstop."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = [
    "backstop",
    "change",
    "clock",
    "drain",
    "fanout",
    "first_states",
    "inbox",
    "registry",
    "standings",
]
