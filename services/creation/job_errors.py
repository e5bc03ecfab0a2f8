"""What a job's error tells its owner: the internal code a writer records (a provider's
code of the failure table, or one of atelier's own below) mapped to a reason of the
contract's JobErrorReason and whether submitting again may help (JobError.retryable).

The code stays the job's internal record (logs, the event's reason, an operator's view);
the owner sees only the reason, the flag and the message. Each writer stores all three
beside each other (error_code, error_reason, error_retryable; a CHECK holds a failed or
attention job to having a reason), so reads and the outbox payload never map anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.creation.providers.failures import FAILURES

# atelier's own codes, each with its reason and whether a new job may succeed.
OWN_CODES: dict[str, tuple[str, bool]] = {
    # An adapter raised something that is not a ProviderError (worker/driver.py).
    "PROVIDER_BUG": ("PROVIDER_ERROR", True),
    # The catalog names a provider this deployment has no adapter for.
    "PROVIDER_NOT_CONFIGURED": ("MODEL_NOT_CONFIGURED", False),
    # media did not hand the input over (worker/attempt.py).
    "MEDIA_UNAVAILABLE": ("INPUT_UNAVAILABLE", True),
    # media refused an output the provider made (worker/attempt.py, the remote worker).
    "OUTPUT_REJECTED": ("OUTPUT_REJECTED", True),
    # The provider returned fewer images than asked for (worker/driver.py).
    "NO_OUTPUT": ("OUTPUT_MISSING", True),
    # The reaper: the worker stopped and no attempts are left (store/leases.py).
    "LEASE_EXPIRED": ("WORKER_LOST", True),
    # The submit's answer was lost: NEEDS_ATTENTION (store/fenced.py, store/leases.py).
    "OUTCOME_UNKNOWN": ("OUTCOME_UNKNOWN", False),
    # An operator's FAIL (store/admin.py).
    "OPERATOR_FAILED": ("OPERATOR_FAILED", False),
}

# A provider's code the failure table does not know.
UNKNOWN_PROVIDER_CODE = "PROVIDER_ERROR"


@dataclass(frozen=True)
class JobErrorAnswer:
    """A JobErrorReason's name without its JOB_ERROR_REASON_ prefix, and the flag."""

    reason: str
    retryable: bool


def job_error(code: str, declared_retryable: bool = False) -> JobErrorAnswer:
    """The reason and flag for an error ``code``. A code neither table knows (an adapter's
    own, a remote worker's) is a PROVIDER_ERROR, retryable as its adapter declared."""
    failure = FAILURES.get(code)
    if failure is not None:
        return JobErrorAnswer(failure.reason, failure.resubmit)
    own = OWN_CODES.get(code)
    if own is not None:
        return JobErrorAnswer(*own)
    return JobErrorAnswer(UNKNOWN_PROVIDER_CODE, declared_retryable)


def error_columns(code: str) -> dict[str, Any]:
    """The jobs columns of an error of atelier's own ``code``, with what its owner is told
    (the message is the writer's)."""
    answer = job_error(code)
    return {"error_code": code, "error_reason": answer.reason, "error_retryable": answer.retryable}
