"""Size limits quoted the way people read them."""

from __future__ import annotations

import pytest

from services.kit.sizes import byte_size


@pytest.mark.parametrize(
    ("count", "said"),
    [
        (20 * 1024 * 1024, "20 MiB"),
        (512 * 1024 * 1024, "512 MiB"),
        (2 * 1024**3, "2 GiB"),
        (3 * 1024, "3 KiB"),
        (1024, "1 KiB"),
        (1023, "1023 bytes"),
        (1, "1 byte"),
        (0, "0 bytes"),
        # Not a whole unit: rounded, and the exact count beside it (never looser).
        (12345, "12.1 KiB (12345 bytes)"),
        (20 * 1024 * 1024 + 1, "20.0 MiB (20971521 bytes)"),
    ],
)
def test_byte_counts_read_in_the_largest_whole_unit(count: int, said: str) -> None:
    assert byte_size(count) == said
