"""The failure table: which provider codes a new attempt may cure, and the retry delay."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from services.creation.providers.failures import FAILURES, Kind, is_retryable, retry_delay


@pytest.mark.parametrize(
    "code", ["TIMEOUT", "UNAVAILABLE", "RATE_LIMITED", "TRANSIENT", "REQUEST_UNKNOWN"]
)
def test_transient_codes_are_retryable(code: str) -> None:
    assert is_retryable(code)


@pytest.mark.parametrize(
    "code",
    [
        "CONTENT_REJECTED",
        "INPUT_UNREADABLE",
        "INVALID_INPUT",
        "INTERNAL",
        "CANCELLED",
        "AUTH_REJECTED",
        "OUTPUT_EXPIRED",
        "OUTPUT_INVALID",
    ],
)
def test_terminal_codes_are_not(code: str) -> None:
    assert not is_retryable(code)


def test_a_code_the_table_does_not_know_is_terminal() -> None:
    assert not is_retryable("SOMETHING_NEW")
    assert not is_retryable("")


def test_the_table_overrides_what_an_adapter_declared_for_codes_it_knows() -> None:
    assert is_retryable("UNAVAILABLE", declared=False)
    assert not is_retryable("CONTENT_REJECTED", declared=True)
    # For codes it does not know, the adapter's word stands.
    assert is_retryable("BACKEND_SPECIFIC_BUSY", declared=True)
    assert not is_retryable("BACKEND_SPECIFIC_BAD", declared=False)


def test_only_a_timeout_leaves_a_submit_ambiguous() -> None:
    assert [code for code, f in FAILURES.items() if f.ambiguous_on_submit] == ["TIMEOUT"]


def test_call_failures_are_the_transport_ones() -> None:
    calls = {code for code, f in FAILURES.items() if f.kind is Kind.CALL}
    assert calls == {"TIMEOUT", "UNAVAILABLE", "RATE_LIMITED", "AUTH_REJECTED"}


def test_retry_delay_is_full_jitter_backoff_under_the_cap() -> None:
    rng = random.Random(7)
    delays = [retry_delay(3, 2.0, 5.0, rng=rng) for _ in range(200)]
    assert all(timedelta(0) <= d <= timedelta(seconds=5) for d in delays)
    # Full jitter spreads over the whole range, not around the ceiling.
    assert min(delays) < timedelta(seconds=1) and max(delays) > timedelta(seconds=4)


def test_retry_delay_honours_the_providers_retry_after_up_to_the_cap() -> None:
    rng = random.Random(1)
    delays = [retry_delay(1, 0.1, 300, retry_after_seconds=30, rng=rng) for _ in range(50)]
    assert all(d == timedelta(seconds=30) for d in delays)
    assert retry_delay(1, 0.1, 10, retry_after_seconds=3600, rng=rng) == timedelta(seconds=10)
