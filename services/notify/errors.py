"""notify's own error reasons (contract: never reuse or rename one)."""

from __future__ import annotations


class Reason:
    # A Deliver request that no outbox row could have produced: empty, too large, or a
    # state without a job id, owner, version or status.
    INVALID_DELIVERY = "INVALID_DELIVERY"
