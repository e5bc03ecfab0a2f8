"""The worker's writes as single statements, each for any number of jobs at once.

Every write after the claim is fenced by ``(job_id, lease_epoch)`` and the status
``running`` inside the statement itself: a job whose lease was taken over, or that a
reaper already resolved, matches nothing and comes back missing. The rows that change
are locked in job id order (as the lease keeper's beat locks them), so two statements of
one worker over overlapping jobs wait for each other instead of deadlocking; a row
changed while the statement waited for it is checked again as it is now
(PostgreSQL re-reads it under READ COMMITTED), so a cancel request that committed first
wins. The statement writes its side rows itself, as ``changes.record`` would: an audit
event when the status changed, the ledger entry the new status calls for (capture once:
uq_points_ledger_job_id_kind), and exactly one outbox row per new version (its payload
built in SQL, held equal to ``changes.outbox_payload`` by a test).

Parameters, the same for every write: $1 now, $2 now as the payload's updateTime, $3 job
ids, $4 lease epochs, $5 one text value per job (the request id, the output asset ids as
a JSON array, the error message; NULL where unused). The events' actor is the lease's owner.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass

from services.creation.domain import TERMINAL, Status, Step, ledger_effect


def _json_time_sql(value: str) -> str:
    """``changes.json_time`` of the timestamptz ``value`` in SQL: RFC 3339 in UTC with
    0, 3 or 6 fractional digits, as protobuf writes a Timestamp."""
    utc = f"({value} AT TIME ZONE 'UTC')"
    return (
        f"""to_char({utc}, 'YYYY-MM-DD"T"HH24:MI:SS') || CASE"""
        f" WHEN to_char({utc}, 'US') = '000000' THEN ''"
        f" WHEN right(to_char({utc}, 'US'), 3) = '000' THEN '.' || to_char({utc}, 'MS')"
        f" ELSE '.' || to_char({utc}, 'US') END || 'Z'"
    )


_TERMINAL_SQL = ", ".join(f"'{value}'" for value in sorted(s.value for s in TERMINAL))

# The outbox payload of a row of ``creation.jobs`` named ``r``, as
# ``changes.outbox_payload`` builds it: protobuf's JSON of JobState, defaults left out.
# ``$2`` is ``updated_at`` in protobuf's RFC 3339 form (every statement here sets
# ``updated_at = $1``).
PAYLOAD_SQL = f"""jsonb_strip_nulls(jsonb_build_object(
        'jobId', r.job_id,
        'userId', r.user_id,
        'version', r.version::text,
        'status', 'JOB_STATUS_' || upper(r.status),
        'updateTime', $2::text,
        'step', 'JOB_STEP_' || upper(r.step),
        'progressPercent', nullif(r.progress, 0),
        'cancelRequested', nullif(r.cancel_requested, false),
        'outputs', CASE WHEN cardinality(r.outputs) > 0 THEN (
            SELECT jsonb_agg(jsonb_build_object('assetId', o.asset_id) ORDER BY o.n)
            FROM unnest(r.outputs) WITH ORDINALITY AS o(asset_id, n)) END,
        'error', CASE WHEN r.error_code IS NOT NULL THEN jsonb_build_object(
            'code', r.error_code, 'message', nullif(r.error_message, '')) END,
        'done', CASE WHEN r.status IN ({_TERMINAL_SQL}) THEN true END,
        'attempt', nullif(r.attempt, 0),
        'nextAttemptTime', CASE WHEN r.status = 'queued' THEN
            {_json_time_sql("r.next_attempt_at")} END))"""  # noqa: S608

_TERMINAL_LEDGER = {
    status.value: kind.value for status in Status if (kind := ledger_effect(status)) is not None
}
_LEDGER_KIND_SQL = (
    "CASE r.status "
    + " ".join(f"WHEN '{status}' THEN '{kind}'" for status, kind in _TERMINAL_LEDGER.items())
    + " END"
)

_RELEASE_LEASE = "lease_owner = NULL, lease_expires_at = NULL"
# A COMPLETE's value is the output asset ids as a JSON array (``outputs_value``), in order.
_SET_OUTPUTS = (
    "outputs = ARRAY(SELECT o.asset_id FROM jsonb_array_elements_text(h.value::jsonb)"
    " WITH ORDINALITY AS o(asset_id, n) ORDER BY o.n)"
)


def side_rows_sql(changed: str, from_status: str, reason: str) -> str:
    """The CTEs that write the side rows of the rows ``changed`` returned (with the
    lease's owner as ``held_by``); ``reason`` is an SQL expression."""
    # Built only from this module's constants, at import; every value is a parameter.
    return f"""
  event AS (
    INSERT INTO creation.job_events (
      job_id, version, from_status, to_status, actor_kind, actor_id, reason, created_at)
    SELECT r.job_id, r.version, {from_status}, r.status, 'worker', r.held_by, {reason}, $1
    FROM {changed} AS r
    WHERE r.status <> {from_status}
  ),
  entry AS (
    INSERT INTO creation.points_ledger (user_id, job_id, kind, amount, reason, created_at)
    SELECT r.user_id, r.job_id, {_LEDGER_KIND_SQL}, r.price_points, {reason}, $1
    FROM {changed} AS r
    WHERE r.status IN ({", ".join(f"'{s}'" for s in _TERMINAL_LEDGER)})
  ),
  -- The outbox's statement trigger sends NOTIFY at commit.
  message AS (
    INSERT INTO creation.outbox (job_id, user_id, version, payload, created_at)
    SELECT r.job_id, r.user_id, r.version, {PAYLOAD_SQL}, $1
    FROM {changed} AS r
  )"""  # noqa: S608


def _fenced_sql(assignments: str, reason: str, *, cancel_requested: bool | None) -> str:
    cancel = "" if cancel_requested is None else f" AND j.cancel_requested = {cancel_requested}"
    return f"""
WITH
  input AS (
    SELECT * FROM unnest($3::uuid[], $4::bigint[], $5::text[]) AS i(job_id, lease_epoch, value)
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
    SET {assignments}, version = j.version + 1, updated_at = $1
    FROM held AS h
    WHERE j.job_id = h.job_id
    RETURNING j.*, h.held_by
  ),{side_rows_sql("changed", "'running'", f"'{reason}'")}
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
        f" {_SET_OUTPUTS}, error_code = NULL, error_message = NULL,"
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
        f"status = '{Status.NEEDS_ATTENTION.value}', error_code = 'OUTCOME_UNKNOWN',"
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


# Claims up to $4 due jobs for worker $3 in claim order, ties broken by job id (rides
# ix_jobs_claim_queue, skipping rows other workers hold). A job that already has a
# provider request resumes polling in the same attempt; any other starts a new attempt,
# so a job with no attempt left and no request is passed over: claiming it would break
# ck_jobs_attempts_bounded and abort the whole batch. $5: the new lease's expiry.
CLAIM_SQL = f"""
WITH
  due AS (
    SELECT job_id FROM creation.jobs
    WHERE status = 'queued' AND next_attempt_at <= $1
      AND (attempt < max_attempts OR provider_request_id IS NOT NULL)
    ORDER BY priority DESC, next_attempt_at, created_at, job_id
    LIMIT $4
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
        lease_owner = $3,
        lease_epoch = j.lease_epoch + 1,
        lease_expires_at = $5,
        started_at = coalesce(j.started_at, $1),
        version = j.version + 1,
        updated_at = $1
    FROM due
    WHERE j.job_id = due.job_id
    RETURNING j.*, j.lease_owner AS held_by
  ),{side_rows_sql("claimed", "'queued'", "'claimed'")}
SELECT * FROM claimed ORDER BY priority DESC, next_attempt_at, created_at, job_id
"""  # noqa: S608


# A failed attempt, fenced like the rest ($3 job id, $4 lease epoch): a retryable failure
# ($7) with attempts left and no cancel request queues a fresh attempt at $8; anything
# else fails the job. The error ($5 code, $6 message) is kept either way; the event's
# reason is the code.
FAIL_SQL = f"""
WITH
  held AS (
    SELECT j.job_id, j.lease_owner AS held_by,
           ($7::boolean AND j.attempt < j.max_attempts AND NOT j.cancel_requested) AS again
    FROM creation.jobs AS j
    WHERE j.job_id = $3::uuid AND j.lease_epoch = $4::bigint AND j.status = 'running'
    FOR UPDATE OF j
  ),
  changed AS (
    UPDATE creation.jobs AS j
    SET status = CASE WHEN h.again THEN 'queued' ELSE 'failed' END,
        step = CASE WHEN h.again THEN NULL ELSE j.step END,
        provider_request_id = CASE WHEN h.again THEN NULL ELSE j.provider_request_id END,
        next_attempt_at = CASE WHEN h.again THEN $8 ELSE j.next_attempt_at END,
        completed_at = CASE WHEN h.again THEN j.completed_at ELSE $1 END,
        error_code = $5::text, error_message = $6::text, {_RELEASE_LEASE},
        version = j.version + 1, updated_at = $1
    FROM held AS h
    WHERE j.job_id = h.job_id
    RETURNING j.*, h.held_by
  ),{side_rows_sql("changed", "'running'", "$5::text")}
SELECT * FROM changed
"""  # noqa: S608

# A job this worker will not finish, queued again at $5 ($3 job id, $4 lease epoch): with
# a provider request it keeps it (and its step), so the next worker resumes polling;
# without one it never reached the provider, so the attempt it started does not count. A
# job whose owner asked to cancel comes back unchanged (still running): the caller
# cancels it instead.
HAND_BACK_SQL = f"""
WITH
  held AS (
    SELECT j.*
    FROM creation.jobs AS j
    WHERE j.job_id = $3::uuid AND j.lease_epoch = $4::bigint AND j.status = 'running'
    FOR UPDATE OF j
  ),
  changed AS (
    UPDATE creation.jobs AS j
    SET status = 'queued', next_attempt_at = $5, {_RELEASE_LEASE},
        step = CASE WHEN j.provider_request_id IS NULL THEN NULL ELSE j.step END,
        progress = CASE WHEN j.provider_request_id IS NULL THEN 0 ELSE j.progress END,
        attempt = CASE WHEN j.provider_request_id IS NULL THEN j.attempt - 1
                       ELSE j.attempt END,
        version = j.version + 1, updated_at = $1
    FROM held AS h
    WHERE j.job_id = h.job_id AND NOT h.cancel_requested
    RETURNING j.*, h.lease_owner AS held_by
  ),{side_rows_sql("changed", "'running'", "'handed back'")}
SELECT * FROM changed
UNION ALL
SELECT h.*, h.lease_owner AS held_by FROM held AS h WHERE h.cancel_requested
"""  # noqa: S608
