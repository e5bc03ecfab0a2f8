"""Byte counts the way people read them, for every message that quotes a size limit:
"20 MiB", not "20971520"."""

from __future__ import annotations

# Binary units: the limits are set in them (settings say 20 * MIB), so they print whole.
_UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def byte_size(count: int) -> str:
    """``count`` bytes in the largest unit it fills: "20 MiB", "512 bytes". A count that
    is not a whole number of its unit keeps its exact bytes beside the rounded figure
    ("12.1 KiB (12345 bytes)"), so no limit reads looser than it is."""
    for unit, size in _UNITS:
        if count >= size:
            if count % size == 0:
                return f"{count // size} {unit}"
            return f"{count / size:.1f} {unit} ({count} bytes)"
    return "1 byte" if count == 1 else f"{count} bytes"
