"""How an attempt's failure is judged, and the attempt's way of saying it ended early.

The table of provider error codes is a local stand-in until providers/failures.py lands:
the codes it names decide; any other code keeps what the provider declared.
"""

from __future__ import annotations

# Worth another attempt: the provider or the path to it was busy or briefly away.
RETRYABLE_CODES = frozenset({"TIMEOUT", "UNAVAILABLE", "RATE_LIMITED", "TRANSIENT"})
# Another attempt would fail the same way.
FINAL_CODES = frozenset({"CONTENT_REJECTED", "INPUT_UNREADABLE", "INTERNAL"})


def is_retryable(code: str, declared: bool) -> bool:
    if code in RETRYABLE_CODES:
        return True
    if code in FINAL_CODES:
        return False
    return declared


class AttemptFailed(Exception):
    """The attempt failed with ``code``; the job retries (with backoff) or fails."""

    def __init__(
        self, code: str, message: str, *, retryable: bool, retry_after_seconds: float | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after_seconds = retry_after_seconds


class LeaseLost(Exception):
    """A fenced write matched nothing: another worker holds the job now."""
