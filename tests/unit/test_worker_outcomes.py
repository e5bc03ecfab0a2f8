"""The worker's pure parts: how it judges failures (the providers' table), and the bounded
record of outcomes."""

from __future__ import annotations

import pytest

from services.creation.providers.failures import is_retryable
from services.creation.worker.context import RecentOutcomes


@pytest.mark.parametrize(
    ("code", "declared", "expected"),
    [
        ("TIMEOUT", False, True),
        ("UNAVAILABLE", False, True),
        ("RATE_LIMITED", False, True),
        ("TRANSIENT", False, True),
        ("CONTENT_REJECTED", True, False),
        ("INPUT_UNREADABLE", True, False),
        ("INTERNAL", True, False),
        ("SOMETHING_NEW", True, True),  # a code the table does not know: the provider says
        ("SOMETHING_NEW", False, False),
    ],
)
def test_the_failure_table(code: str, declared: bool, expected: bool) -> None:
    assert is_retryable(code, declared) is expected


def test_recent_outcomes_keep_only_the_newest() -> None:
    outcomes = RecentOutcomes(size=2)
    for job_id in ("a", "b", "c"):
        outcomes.record(job_id, "succeeded")
    outcomes.record("b", "cancelled")
    assert "a" not in outcomes
    assert (outcomes.get("b"), outcomes["c"]) == ("cancelled", "succeeded")
