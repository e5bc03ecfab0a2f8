"""The worker's writes as single statements, each for any number of jobs at once.

Every write after the claim is fenced by ``(job_id, lease_epoch)`` and the status
``running`` inside the statement itself: a job whose lease was taken over, or that a
reaper already resolved, matches nothing and comes back missing. The rows that change
are locked in job id order (as the lease keeper's beat locks them), so two statements of
one worker over overlapping jobs wait for each other instead of deadlocking; a row
changed while the statement waited for it is checked again as it is now
(PostgreSQL re-reads it under READ COMMITTED), so a cancel request that committed first
wins. Each statement bumps the version and names the change (the lease's owner, a
reason); the triggers of sql/job_changes.sql write its event, ledger entry and outbox
row, for the whole batch at once.

Parameters, the same for every write: $1 now, $2 job ids, $3 lease epochs, $4 one text
value per job (the request id, the output asset ids as a JSON array, the error message;
NULL where unused).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass

from services.creation.domain import Status, Step
from services.creation.job_errors import job_error

_RELEASE_LEASE = "lease_owner = NULL, lease_expires_at = NULL"
_NO_ERROR = "error_code = NULL, error_message = NULL, error_reason = NULL, error_retryable = NULL"


def _error_literal(code: str) -> str:
    """The assignments of an error of atelier's own ``code``, with what its owner is told."""
    answer = job_error(code)
    return (
        f"error_code = '{code}', error_reason = '{answer.reason}',"
        f" error_retryable = {str(answer.retryable).lower()}"
    )


# A COMPLETE's value is the output asset ids as a JSON array (``outputs_value``), in order.
_SET_OUTPUTS = (
    "outputs = ARRAY(SELECT o.asset_id FROM jsonb_array_elements_text(h.value::jsonb)"
    " WITH ORDINALITY AS o(asset_id, n) ORDER BY o.n)"
)


def _named(actor_id: str, reason: str) -> str:
    """The assignments that name a worker's change (see sql/job_changes.sql)."""
    return f"change_actor_kind = 'worker', change_actor_id = {actor_id}, change_reason = {reason}"


def _fenced_sql(assignments: str, reason: str, *, cancel_requested: bool | None) -> str:
    cancel = "" if cancel_requested is None else f" AND j.cancel_requested = {cancel_requested}"
    return f"""
WITH
  input AS (
    SELECT * FROM unnest($2::uuid[], $3::bigint[], $4::text[]) AS i(job_id, lease_epoch, value)
  ),
  -- The fence, locked in job id order; rides pk_jobs.
  held AS (
    SELECT j.job_id, j.lease_owner AS held_by, i.value
    FROM creation.jobs AS j
    JOIN input AS i ON i.job_id = j.job_id AND i.lease_epoch = j.lease_epoch
    WHERE j.status = 'running'{cancel}
    ORDER BY j.job_id
    FOR UPDATE OF j
  ),
  changed AS (
    UPDATE creation.jobs AS j
    SET {assignments}, version = j.version + 1, updated_at = $1,
        {_named("h.held_by", f"'{reason}'")}
    FROM held AS h
    WHERE j.job_id = h.job_id
    RETURNING j.*
  )
SELECT * FROM changed
"""  # noqa: S608


# The unique index RECORD_REQUEST can break: one job per (provider code, request id).
PROVIDER_REQUEST_UNIQUE = "uq_jobs_provider_request"


class FencedWrite(enum.Enum):
    """A worker's write to jobs it holds; the value is its statement."""

    # Committed before the provider is called, so a crash during the call is visible.
    # Its value is the adapter's version (Provider.version), recorded with the job.
    MARK_SUBMITTING = _fenced_sql(
        f"step = '{Step.SUBMITTING.value}', provider_version = h.value",
        "submitting",
        cancel_requested=None,
    )
    # Committed as soon as the provider accepted, so no later crash submits again.
    RECORD_REQUEST = _fenced_sql(
        f"provider_request_id = h.value, step = '{Step.GENERATING.value}'",
        "provider accepted",
        cancel_requested=None,
    )
    # Refused once the owner asked to cancel: an output that lands after a cancel is
    # never attached (the worker acknowledges the cancel and purges what it landed).
    COMPLETE = _fenced_sql(
        f"status = '{Status.SUCCEEDED.value}', step = '{Step.DONE.value}', progress = 100,"
        f" {_SET_OUTPUTS}, {_NO_ERROR},"
        f" completed_at = $1, {_RELEASE_LEASE}",
        "completed",
        cancel_requested=False,
    )
    # The worker stopped at a safe point after the owner asked to cancel.
    ACKNOWLEDGE_CANCEL = _fenced_sql(
        f"status = '{Status.CANCELLED.value}', completed_at = $1, {_RELEASE_LEASE}",
        "cancelled",
        cancel_requested=True,
    )
    # A submit that may have reached the provider without telling us its request id:
    # never submitted again; an operator decides (the points stay reserved).
    OUTCOME_UNKNOWN = _fenced_sql(
        f"status = '{Status.NEEDS_ATTENTION.value}', {_error_literal('OUTCOME_UNKNOWN')},"
        f" error_message = h.value, {_RELEASE_LEASE}",
        "OUTCOME_UNKNOWN",
        cancel_requested=None,
    )


def brief(write: FencedWrite) -> str:
    """``write``'s statement answering only what the attempt needs of each written job
    (no full row to send, decode and build: the worker writes thousands a second)."""
    return _BRIEF[write]


_BRIEF = {
    write: write.value.replace(
        "SELECT * FROM changed", "SELECT job_id, status, version FROM changed"
    )
    for write in FencedWrite
}


@dataclass(frozen=True)
class Written:
    """A job as a brief write left it."""

    job_id: str
    status: Status
    version: int


def outputs_value(asset_ids: Sequence[str]) -> str:
    """A COMPLETE write's value: the job's output asset ids, in order, as a JSON array."""
    return json.dumps(list(asset_ids))


@dataclass(frozen=True)
class FencedItem:
    """One job's part of a fenced write: the lease it holds and its value, if any."""

    job_id: str
    lease_epoch: int
    value: str | None = None


# Claims up to $3 due jobs for worker $2 in claim order, ties broken by job id (rides
# ix_jobs_claim_queue, skipping rows other workers hold). A job that already has a
# provider request resumes polling in the same attempt; any other starts a new attempt,
# so a job with no attempt left and no request is passed over: claiming it would break
# ck_jobs_attempts_bounded and abort the whole batch. $4: the new lease's expiry.
CLAIM_SQL = f"""
WITH
  due AS (
    SELECT job_id FROM creation.jobs
    WHERE status = 'queued' AND next_attempt_at <= $1
      AND (attempt < max_attempts OR provider_request_id IS NOT NULL)
    ORDER BY priority DESC, next_attempt_at, created_at, job_id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
  ),
  claimed AS (
    UPDATE creation.jobs AS j
    SET status = 'running',
        attempt = CASE WHEN j.provider_request_id IS NULL THEN j.attempt + 1
                       ELSE j.attempt END,
        step = CASE WHEN j.provider_request_id IS NULL THEN '{Step.PREPARING.value}'
                    ELSE j.step END,
        progress = CASE WHEN j.provider_request_id IS NULL THEN 0 ELSE j.progress END,
        lease_owner = $2,
        lease_epoch = j.lease_epoch + 1,
        lease_expires_at = $4,
        started_at = coalesce(j.started_at, $1),
        version = j.version + 1,
        updated_at = $1,
        {_named("$2", "'claimed'")}
    FROM due
    WHERE j.job_id = due.job_id
    RETURNING j.*
  )
SELECT * FROM claimed ORDER BY priority DESC, next_attempt_at, created_at, job_id
"""  # noqa: S608


# A failed attempt, fenced like the rest ($2 job id, $3 lease epoch): a retryable failure
# ($6) with attempts left and no cancel request queues a fresh attempt at $7; anything
# else fails the job. The error ($4 code, $5 message, $8 reason and $9 retryable, as
# job_errors.job_error maps the code) is kept either way; the event's reason is the code.
FAIL_SQL = f"""
WITH
  held AS (
    SELECT j.job_id, j.lease_owner AS held_by,
           ($6::boolean AND j.attempt < j.max_attempts AND NOT j.cancel_requested) AS again
    FROM creation.jobs AS j
    WHERE j.job_id = $2::uuid AND j.lease_epoch = $3::bigint AND j.status = 'running'
    FOR UPDATE OF j
  ),
  changed AS (
    UPDATE creation.jobs AS j
    SET status = CASE WHEN h.again THEN 'queued' ELSE 'failed' END,
        step = CASE WHEN h.again THEN NULL ELSE j.step END,
        provider_request_id = CASE WHEN h.again THEN NULL ELSE j.provider_request_id END,
        next_attempt_at = CASE WHEN h.again THEN $7 ELSE j.next_attempt_at END,
        completed_at = CASE WHEN h.again THEN j.completed_at ELSE $1 END,
        error_code = $4::text, error_message = $5::text, error_reason = $8::text,
        error_retryable = $9::boolean, {_RELEASE_LEASE},
        version = j.version + 1, updated_at = $1, {_named("h.held_by", "$4::text")}
    FROM held AS h
    WHERE j.job_id = h.job_id
    RETURNING j.*
  )
SELECT * FROM changed
"""  # noqa: S608

# A job this worker will not finish, queued again at $4 ($2 job id, $3 lease epoch): with
# a provider request it keeps it (and its step), so the next worker resumes polling;
# without one it never reached the provider, so the attempt it started does not count. A
# job whose owner asked to cancel comes back unchanged (still running): the caller
# cancels it instead.
HAND_BACK_SQL = f"""
WITH
  held AS (
    SELECT j.*
    FROM creation.jobs AS j
    WHERE j.job_id = $2::uuid AND j.lease_epoch = $3::bigint AND j.status = 'running'
    FOR UPDATE OF j
  ),
  changed AS (
    UPDATE creation.jobs AS j
    SET status = 'queued', next_attempt_at = $4, {_RELEASE_LEASE},
        step = CASE WHEN j.provider_request_id IS NULL THEN NULL ELSE j.step END,
        progress = CASE WHEN j.provider_request_id IS NULL THEN 0 ELSE j.progress END,
        attempt = CASE WHEN j.provider_request_id IS NULL THEN j.attempt - 1
                       ELSE j.attempt END,
        version = j.version + 1, updated_at = $1, {_named("h.lease_owner", "'handed back'")}
    FROM held AS h
    WHERE j.job_id = h.job_id AND NOT h.cancel_requested
    RETURNING j.*
  )
SELECT * FROM changed
UNION ALL
SELECT h.* FROM held AS h WHERE h.cancel_requested
"""  # noqa: S608
