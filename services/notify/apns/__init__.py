"""APNs delivery: the provider token, the HTTP/2 client, the sender that drains
notify.pushes, and the checks behind `atelier push doctor`."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = [
    "assemble",
    "claims",
    "client",
    "doctor",
    "doctor_command",
    "keys",
    "provider_token",
    "settings",
]
