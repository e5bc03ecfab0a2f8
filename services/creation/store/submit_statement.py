"""SubmitJob's whole decision and write as one statement.

Run under the user's advisory lock (a statement of its own: a lock taken inside this
statement would come after its snapshot). Every statement costs a round trip and ~0.25 ms
of Python in the service, so the checks and the four inserts of a submit go together:
the verdict is computed first, and each insert runs only when the verdict is ``ok``.
The foreign keys of the side rows are checked at the end of the statement, after the job
row exists.

Verdicts, in the order the rules apply (the same order as the errors clients see):
``replay`` (the idempotency key already made a job: that job comes back, whatever else
holds now), ``model_not_available``, ``style_not_available``, ``style_model_mismatch``,
``daily_quota_exceeded``, ``in_flight_limit_reached``, ``insufficient_points``, ``ok``.
"""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

SUBMIT = text(
    """
WITH
  -- The job this idempotency key already made (uq_jobs_user_idempotency_key).
  existing AS (
    SELECT * FROM creation.jobs
    WHERE user_id = :user_id AND idempotency_key = :idempotency_key
  ),
  -- The enabled model with the kind of the enabled style (primary keys); the price is
  -- the model's for each of the job's outputs.
  catalog AS (
    SELECT m.media_kind, m.price_points * CAST(:num_outputs AS integer) AS price_points,
           m.provider_code, m.provider_model,
           (SELECT s.media_kind FROM creation.styles s
             WHERE s.style_id = :style_id AND s.enabled) AS style_kind
    FROM creation.models m
    WHERE m.model_id = :model_id AND m.enabled
  ),
  -- Today's jobs (ix_jobs_user_newest) and jobs in flight (ix_jobs_user_in_flight).
  counts AS (
    SELECT
      (SELECT count(*) FROM creation.jobs
        WHERE user_id = :user_id AND created_at >= :day_start) AS today,
      (SELECT count(*) FROM creation.jobs
        WHERE user_id = :user_id AND status IN ('queued', 'running')) AS in_flight
  ),
  -- The balance, and whether the welcome grant was ever made (ix_points_ledger_user).
  balance AS (
    SELECT
      coalesce(sum(amount) FILTER (WHERE kind = 'grant'), 0)
        - coalesce(sum(amount) FILTER (WHERE kind = 'reserve'), 0)
        + coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0) AS available,
      coalesce(bool_or(grant_key = 'welcome'), false) AS welcomed
    FROM creation.points_ledger
    WHERE user_id = :user_id
  ),
  verdict AS (
    SELECT
      CASE
        WHEN EXISTS (SELECT 1 FROM existing) THEN 'replay'
        WHEN c.price_points IS NULL THEN 'model_not_available'
        WHEN c.style_kind IS NULL THEN 'style_not_available'
        WHEN c.style_kind <> c.media_kind THEN 'style_model_mismatch'
        WHEN n.today >= :daily_quota THEN 'daily_quota_exceeded'
        WHEN n.in_flight >= :in_flight_limit THEN 'in_flight_limit_reached'
        WHEN b.available + w.points < c.price_points THEN 'insufficient_points'
        ELSE 'ok'
      END AS outcome,
      c.media_kind, c.price_points, c.provider_code, c.provider_model,
      b.available + w.points AS available,
      w.points AS welcome_points
    FROM counts n
    CROSS JOIN balance b
    CROSS JOIN LATERAL (
      SELECT CASE WHEN b.welcomed OR :welcome_points <= 0 THEN 0
                  ELSE :welcome_points END AS points
    ) w
    LEFT JOIN catalog c ON true
  ),
  -- A user's first submit brings their welcome points, once, whatever came before.
  welcome AS (
    INSERT INTO creation.points_ledger (user_id, kind, amount, grant_key, reason, created_at)
    SELECT :user_id, 'grant', welcome_points, 'welcome', 'welcome', :now
    FROM verdict
    WHERE outcome = 'ok' AND welcome_points > 0
    ON CONFLICT ON CONSTRAINT uq_points_ledger_user_id_grant_key DO NOTHING
  ),
  job AS (
    INSERT INTO creation.jobs (
      job_id, user_id, model_id, style_id, provider_code, provider_model, price_points,
      input_asset_id, prompt, negative_prompt, width, height, parameters, status,
      max_attempts, next_attempt_at, idempotency_key, request_hash, created_at, updated_at,
      num_outputs)
    SELECT
      :job_id, :user_id, :model_id, :style_id, provider_code, provider_model, price_points,
      :input_asset_id, :prompt, :negative_prompt, :width, :height, :parameters, 'queued',
      :max_attempts, :now, :idempotency_key, :request_hash, :now, :now,
      CAST(:num_outputs AS integer)
    FROM verdict
    WHERE outcome = 'ok'
    RETURNING *
  ),
  event AS (
    INSERT INTO creation.job_events (
      job_id, version, from_status, to_status, actor_kind, actor_id, reason, created_at)
    SELECT job_id, version, NULL, status, 'user', :user_id, 'submitted', :now FROM job
  ),
  reservation AS (
    INSERT INTO creation.points_ledger (user_id, job_id, kind, amount, reason, created_at)
    SELECT :user_id, job_id, 'reserve', price_points, 'submitted', :now FROM job
  ),
  -- The outbox's statement trigger sends NOTIFY at commit.
  message AS (
    INSERT INTO creation.outbox (job_id, user_id, version, payload, created_at)
    SELECT job_id, user_id, version, :payload, :now FROM job
  )
-- Verdict columns are named apart from the job's own.
SELECT v.outcome AS submit_outcome, v.media_kind AS model_kind, v.price_points AS model_price,
       v.available AS available_points, j.*
FROM verdict v
LEFT JOIN (SELECT * FROM existing UNION ALL SELECT * FROM job) j ON true
"""
).bindparams(
    bindparam("parameters", type_=JSONB),
    bindparam("payload", type_=JSONB),
)
