"""The attempt's ways of saying it ended early. Whether a failure is worth another
attempt is the providers' failure table's to say (providers/failures.py)."""

from __future__ import annotations


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


class CancelAsked(Exception):
    """A write refused because the owner asked to cancel (the remote worker learns it
    so): stop at this safe point and acknowledge the cancel."""
