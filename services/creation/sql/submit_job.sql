-- creation.submit_job: SubmitJob's rules, as the database runs them (migration 0025 loads
-- this file; tests/migration checks the installed function against it).
--
-- One call is one submit: the call runs in its own implicit transaction, which holds the
-- user's advisory lock until it commits, so every rule below sees every submit of the
-- same user made before it. The lock wait sits in a block of its own so that its timeout
-- is told apart (DETAIL creation.user_lock, answered USER_BUSY) from any other lock wait.
--
-- The verdicts, in the order the rules apply (the order of the errors clients see):
-- replay (the idempotency key already made a job: that job comes back, whatever else
-- holds now), model_not_available, style_not_available, style_model_mismatch,
-- daily_quota_exceeded (the day's jobs, a cancelled one not counted: it gives its slot
-- back), in_flight_limit_reached, insufficient_points, ok. Each insert (the welcome
-- grant, the job, its event, its reservation, its outbox row) runs only on ok.
--
-- To change the rules: copy this file to migrations/frozen/submit_job_<the revision that
-- loads it now>.sql and point that revision at the copy, edit this file, and load it from
-- a new revision (CREATE OR REPLACE; a new argument needs DROP FUNCTION first). Earlier
-- revisions keep their own frozen text.
CREATE OR REPLACE FUNCTION creation.submit_job(
  p_job_id uuid, p_user_id text, p_idempotency_key text, p_model_id text, p_style_id text,
  p_input_asset_id uuid, p_prompt text, p_negative_prompt text, p_width integer,
  p_height integer, p_parameters jsonb, p_max_attempts integer, p_request_hash text,
  p_day_start timestamptz, p_daily_quota bigint, p_in_flight_limit bigint,
  p_welcome_points bigint, p_now timestamptz, p_num_outputs integer,
  p_trace_parent text, p_via text DEFAULT NULL)
RETURNS TABLE (submit_outcome text, model_kind text, model_price bigint,
               available_points bigint, job creation.jobs)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('creation.user:' || p_user_id, 0));
  EXCEPTION WHEN lock_not_available THEN
    -- Told apart from other lock waits: this one is the user's, answered USER_BUSY.
    RAISE lock_not_available USING
      MESSAGE = 'the user''s lock was not free within lock_timeout',
      DETAIL = 'creation.user_lock';
  END;
  RETURN QUERY
  WITH
  -- The job this idempotency key already made (uq_jobs_user_idempotency_key).
  existing AS (
    SELECT * FROM creation.jobs
    WHERE user_id = p_user_id AND idempotency_key = p_idempotency_key
  ),
  -- The enabled model with the kind of the enabled style (primary keys); the price
  -- is the model's for each of the job's outputs.
  catalog AS (
    SELECT m.media_kind, m.price_points * p_num_outputs AS price_points, m.provider_code, m.provider_model,
           (SELECT s.media_kind FROM creation.styles s
             WHERE s.style_id = p_style_id AND s.enabled) AS style_kind
    FROM creation.models m
    WHERE m.model_id = p_model_id AND m.enabled
  ),
  -- Today's jobs but the cancelled ones, which give their slot back (ix_jobs_user_newest),
  -- and jobs in flight (ix_jobs_user_in_flight; the statuses are literals, so even a
  -- generic plan can use it).
  counts AS (
    SELECT
      (SELECT count(*) FROM creation.jobs
        WHERE user_id = p_user_id AND created_at >= p_day_start
          AND status <> 'cancelled') AS today,
      (SELECT count(*) FROM creation.jobs
        WHERE user_id = p_user_id AND status IN ('queued', 'running')) AS in_flight
  ),
  -- The balance, and whether the welcome grant was ever made: the user's totals
  -- row (pk_ledger_totals, kept by the ledger's trigger; migration 0013).
  balance AS (
    SELECT
      coalesce(max(t.granted - t.reserved + t.released), 0) AS available,
      coalesce(bool_or(t.welcomed), false) AS welcomed
    FROM creation.ledger_totals AS t
    WHERE t.user_id = p_user_id
  ),
  verdict AS (
    SELECT
      CASE
        WHEN EXISTS (SELECT 1 FROM existing) THEN 'replay'
        WHEN c.price_points IS NULL THEN 'model_not_available'
        WHEN c.style_kind IS NULL THEN 'style_not_available'
        WHEN c.style_kind <> c.media_kind THEN 'style_model_mismatch'
        WHEN n.today >= p_daily_quota THEN 'daily_quota_exceeded'
        WHEN n.in_flight >= p_in_flight_limit THEN 'in_flight_limit_reached'
        WHEN b.available + w.points < c.price_points THEN 'insufficient_points'
        ELSE 'ok'
      END AS outcome,
      c.media_kind, c.price_points, c.provider_code, c.provider_model,
      b.available + w.points AS available,
      w.points AS welcome_points
    FROM counts n
    CROSS JOIN balance b
    CROSS JOIN LATERAL (
      SELECT CASE WHEN b.welcomed OR p_welcome_points <= 0 THEN 0
                  ELSE p_welcome_points END AS points
    ) w
    LEFT JOIN catalog c ON true
  ),
  -- A user's first submit brings their welcome points, once, whatever came before.
  welcome AS (
    INSERT INTO creation.points_ledger (user_id, kind, amount, grant_key, reason, created_at)
    SELECT p_user_id, 'grant', welcome_points, 'welcome', 'welcome', p_now
    FROM verdict
    WHERE outcome = 'ok' AND welcome_points > 0
    ON CONFLICT ON CONSTRAINT uq_points_ledger_user_id_grant_key DO NOTHING
    RETURNING entry_id
  ),
  job AS (
    INSERT INTO creation.jobs (
      job_id, user_id, model_id, style_id, provider_code, provider_model, price_points,
      input_asset_id, prompt, negative_prompt, width, height, parameters, status,
      max_attempts, next_attempt_at, idempotency_key, request_hash, created_at, updated_at,
      num_outputs, trace_parent, change_actor_kind, change_actor_id, change_reason,
      change_via)
    SELECT
      p_job_id, p_user_id, p_model_id, p_style_id, provider_code, provider_model, price_points,
      p_input_asset_id, p_prompt, p_negative_prompt, p_width, p_height, p_parameters, 'queued',
      p_max_attempts, p_now, p_idempotency_key, p_request_hash, p_now, p_now,
      p_num_outputs, p_trace_parent, 'user', p_user_id, 'submitted', p_via
    FROM verdict
    WHERE outcome = 'ok'
    RETURNING *
  )
  SELECT v.outcome, v.media_kind, v.price_points, CAST(v.available AS bigint), j.found
  FROM verdict v
  LEFT JOIN (
    SELECT CAST(e AS creation.jobs) AS found FROM existing e
    UNION ALL SELECT CAST(n AS creation.jobs) FROM job n
  ) j ON true;
END
$$;
