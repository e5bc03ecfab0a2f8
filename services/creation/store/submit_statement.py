"""SubmitJob's whole decision and write as one call: ``creation.submit_job``, as it runs in
services/creation/sql/submit_job.sql (loaded by the newest migration that changes it),
takes the user's advisory lock, then decides and writes in one statement (verdict,
welcome, job; the job's triggers add its event, reservation and outbox row), in the
call's own implicit transaction.
One round trip to PostgreSQL per submit, prepared once per connection.

The verdicts, in the order the rules apply: ``replay``, ``model_not_available``,
``style_not_available``, ``style_model_mismatch``, ``daily_quota_exceeded``,
``in_flight_limit_reached``, ``insufficient_points``, ``ok``. The job's columns follow the
verdict's: the new job (ok), the earlier one (replay), or all NULL.

The call returns the job column by column, not as the function's ``creation.jobs``
composite: asyncpg knows the built-in types, but for a composite it asks the server for
the type's whole tree on every new connection (its introspection query), which made a
fresh connection's first submit ~6 ms slower (docs/benchmarks.md, "the submit tail").
"""

from __future__ import annotations

from typing import Any

import asyncpg  # type: ignore[import-untyped]

SUBMIT_CALL = """
SELECT s.submit_outcome, s.model_kind, s.model_price, s.available_points, (s.job).*
FROM creation.submit_job(
  p_job_id => $1, p_user_id => $2, p_idempotency_key => $3, p_model_id => $4,
  p_style_id => $5, p_input_asset_id => $6, p_prompt => $7, p_negative_prompt => $8,
  p_width => $9, p_height => $10, p_parameters => $11, p_max_attempts => $12,
  p_request_hash => $13, p_day_start => $14, p_daily_quota => $15,
  p_in_flight_limit => $16, p_welcome_points => $17, p_now => $18,
  p_num_outputs => $19, p_trace_parent => $20, p_via => $21) AS s
"""

# The arguments of SUBMIT_CALL, in order.
SUBMIT_ARGUMENTS = (
    "job_id",
    "user_id",
    "idempotency_key",
    "model_id",
    "style_id",
    "input_asset_id",
    "prompt",
    "negative_prompt",
    "width",
    "height",
    "parameters",
    "max_attempts",
    "request_hash",
    "day_start",
    "daily_quota",
    "in_flight_limit",
    "welcome_points",
    "now",
    "num_outputs",
    "trace_parent",
    "via",
)

# The DETAIL of the lock_not_available the function raises when the user's own lock was
# not free within lock_timeout (any other lock wait keeps PostgreSQL's own error).
USER_LOCK_DETAIL = "creation.user_lock"


def submit_arguments(**values: Any) -> list[Any]:
    return [values[name] for name in SUBMIT_ARGUMENTS]


def user_lock_timed_out(error: BaseException) -> bool:
    return (
        isinstance(error, asyncpg.exceptions.LockNotAvailableError)
        and getattr(error, "detail", None) == USER_LOCK_DETAIL
    )
