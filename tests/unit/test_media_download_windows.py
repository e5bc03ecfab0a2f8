"""Download URLs are signed per epoch-aligned window: every read within a window gets the
same signing time and expiry (so the same URL), and a URL read at any moment of its window
works at least the TTL more."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.media.storage import DownloadWindows

WINDOWS = DownloadWindows(window_seconds=3600, ttl_seconds=300)
# 2026-12-02 06:00:00 UTC, a window's start (epoch seconds divisible by 3600).
START = datetime(2026, 12, 2, 6, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize("offset", [0.0, 0.5, 1.0, 1799.0, 3599.0, 3599.999])
def test_every_read_in_a_window_gets_its_start_and_expiry(offset: float) -> None:
    read_at = START + timedelta(seconds=offset)
    validity = WINDOWS.at(read_at)
    assert validity.signed_at == START
    assert validity.expires_at == START + timedelta(seconds=3900)
    assert validity.window_ends_at == START + timedelta(seconds=3600)
    # At least the TTL left, whenever in the window it was read; never more than W + TTL.
    left = (validity.expires_at - read_at).total_seconds()
    assert 300 < left <= 3900


def test_the_next_window_signs_anew_and_both_overlap() -> None:
    last = WINDOWS.at(START + timedelta(seconds=3599.9))
    first_of_next = WINDOWS.at(START + timedelta(seconds=3600))
    assert first_of_next.signed_at == START + timedelta(seconds=3600)
    assert first_of_next.expires_at == last.expires_at + timedelta(seconds=3600)
    # The old URL still works the TTL into the next window.
    assert last.expires_at == first_of_next.signed_at + timedelta(seconds=300)


def test_windows_are_aligned_to_the_epoch_not_to_the_first_read() -> None:
    windows = DownloadWindows(window_seconds=900, ttl_seconds=60)
    read_at = datetime(2026, 12, 2, 6, 7, 30, tzinfo=UTC)
    assert windows.at(read_at).signed_at == datetime(2026, 12, 2, 6, 0, 0, tzinfo=UTC)
    assert windows.at(read_at).expires_at == datetime(2026, 12, 2, 6, 16, 0, tzinfo=UTC)
    assert int(windows.at(read_at).signed_at.timestamp()) % 900 == 0


def test_objects_may_be_kept_as_long_as_a_url_can_work() -> None:
    assert WINDOWS.longest_seconds == 3900
    assert WINDOWS.cache_control == "private, max-age=3900, immutable"
