-- Where a job change is written. Every writer of creation.jobs (the submit function, the
-- store's single-job writes, the worker's fenced batches, the claim, the beat, the reaper,
-- remote workers, operators) only inserts or updates the row: a new version is an UPDATE
-- that bumps `version` by one and names the change in the row's change_* columns (who and
-- why). The statement triggers below then write everything else the change calls for, in
-- the writer's statement and transaction, for all its rows at once:
--
--   * an audit event (creation.job_events) when the status changed, or when the owner or
--     an operator asked to cancel (the event names who asked; so does the CANCELLED one);
--   * the ledger entry the change calls for: a reservation for a new job, a capture at
--     success, a release at failure or cancellation (once each: uq_points_ledger_job_id_kind);
--   * exactly one outbox row per new version, recording what changed, not a copy of it:
--     the job and its new version, the change's webhook event type (a submit is
--     job.queued, a new status 'job.' || status, a deletion job.deleted, any other new
--     version job.progress) and the job's model. The relay builds the job's message when
--     it delivers, from the job's row as it is then (creation.job_message, read in its
--     take statement, relay/relay.py), once per job per round however many of the job's
--     versions the round took: notify and every consumer behind it are version-gated, so
--     the newest state stands for the versions it supersedes (migration 0030).
--     While some webhook endpoint is enabled the row is marked webhooks_pending and the
--     deliverers are woken at commit; they fan it out to one delivery per endpoint that
--     wants it (creation.fan_out_webhooks, below), off the job's path, each delivery
--     carrying the job's message as the job stands at the fan-out (its version is the
--     change's or a later one: docs/webhooks.md). A job change writes the same rows
--     whatever the number of endpoints, and with or without one it builds no message: a
--     system with no enabled endpoint pays one probe of an empty table per statement,
--     one with an endpoint a partial-index entry and a NOTIFY (migration 0031).
--
-- A change written by hand in SQL that names no one (no change_* columns set, on a new
-- row) is the database role's, as an operator's. A user's event names the service
-- identity that acted for the user (change_via, atelier-on-behalf-of) in `via`; other
-- actors' events never do. Migration 0034 loads this file;
-- tests/migration checks the installed functions against it. To change it: copy this
-- file to migrations/frozen/job_changes_<the revision that loads it now>.sql and point
-- that revision at the copy, edit this file, and load it from a new revision.

-- RFC 3339 in UTC with 0, 3 or 6 fractional digits, as protobuf's JSON writes a Timestamp
-- (a test holds it equal to protobuf's own JSON of the Timestamp). This function and
-- job_message are single expressions, so PostgreSQL inlines them into the triggers' query:
-- a call per row each would cost more than the rest of the change.
CREATE OR REPLACE FUNCTION creation.rfc3339(t timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT regexp_replace(
    to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '(\.000000|000)$', '') || 'Z'
$$;

-- The job's atelier.creation.v1.Job in protobuf's JSON form, default values left out
-- (readable in psql; relay/jobs.py reads it without ParseDict): the message GetJob
-- answers, without the output URLs (notify signs them as it sends). The one builder of a
-- job's message: the relay's at delivery, the webhook fan-out's for its deliveries.
-- A deleted job is a tombstone: nothing else of it is told.
CREATE OR REPLACE FUNCTION creation.job_message(r creation.jobs) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN r.deleted_at IS NOT NULL THEN jsonb_build_object(
      'jobId', r.job_id,
      'userId', r.user_id,
      'version', r.version::text,
      'status', 'JOB_STATUS_' || upper(r.status),
      'updateTime', creation.rfc3339(r.updated_at),
      'done', true,
      'deleted', true)
  ELSE jsonb_strip_nulls(jsonb_build_object(
      'jobId', r.job_id,
      'userId', r.user_id,
      'modelId', nullif(r.model_id, ''),
      'styleId', nullif(r.style_id, ''),
      'inputAssetId', r.input_asset_id,
      'prompt', nullif(r.prompt, ''),
      'negativePrompt', nullif(r.negative_prompt, ''),
      'width', nullif(r.width, 0),
      'height', nullif(r.height, 0),
      -- Stored as protobuf's JSON of each ParameterValue ({"seed": {"intValue": "42"}}):
      -- copied as it is; an empty map is left out, as protobuf leaves it.
      'parameters', nullif(r.parameters, '{}'::jsonb),
      'status', 'JOB_STATUS_' || upper(r.status),
      'progressPercent', nullif(r.progress, 0),
      'step', 'JOB_STEP_' || upper(r.step),
      'attempt', nullif(r.attempt, 0),
      'maxAttempts', nullif(r.max_attempts, 0),
      'cancelRequested', nullif(r.cancel_requested, false),
      'pricePoints', nullif(r.price_points, 0),
      -- The owner's view of the error: its reason and flag, never the internal code.
      'error', CASE WHEN r.error_code IS NOT NULL THEN jsonb_build_object(
          'reason', 'JOB_ERROR_REASON_' || coalesce(r.error_reason, 'UNSPECIFIED'),
          'retryable', nullif(r.error_retryable, false),
          'message', nullif(r.error_message, '')) END,
      'version', r.version::text,
      'createTime', creation.rfc3339(r.created_at),
      'startTime', creation.rfc3339(r.started_at),
      'completeTime', creation.rfc3339(r.completed_at),
      'updateTime', creation.rfc3339(r.updated_at),
      'numOutputs', nullif(r.num_outputs, 0),
      -- Built as text, not by a subquery (which would keep the function from being
      -- inlined): the outputs are media asset ids, UUIDs, with nothing to escape.
      'outputs', CASE WHEN cardinality(r.outputs) > 0 THEN
          ('[{"assetId": "' || array_to_string(r.outputs, '"}, {"assetId": "') || '"}]')::jsonb
          END,
      'done', CASE WHEN r.status IN ('succeeded', 'failed', 'cancelled') THEN true END,
      'nextAttemptTime', CASE WHEN r.status = 'queued' THEN
          creation.rfc3339(r.next_attempt_at) END)) END
$$;

-- What reaching a status does to the job's reservation (domain.ledger_effect).
CREATE OR REPLACE FUNCTION creation.ledger_effect(status text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE status WHEN 'succeeded' THEN 'capture'
                     WHEN 'failed' THEN 'release'
                     WHEN 'cancelled' THEN 'release' END
$$;

-- A submit: the new jobs' events, reservations and first outbox rows.
CREATE OR REPLACE FUNCTION creation.write_job_inserts() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  hooked boolean := EXISTS (SELECT FROM creation.webhook_endpoints WHERE enabled);
BEGIN
  INSERT INTO creation.job_events (
    job_id, version, from_status, to_status, actor_kind, actor_id, reason, created_at, via)
  SELECT n.job_id, n.version, NULL, n.status, coalesce(n.change_actor_kind, 'operator'),
         coalesce(n.change_actor_id, current_user), coalesce(n.change_reason, ''),
         n.updated_at, CASE WHEN n.change_actor_kind = 'user' THEN n.change_via END
  FROM inserted_jobs AS n;
  -- In user order: the ledger's trigger locks each user's totals row, and every writer
  -- takes those locks in this order (migration 0013).
  INSERT INTO creation.points_ledger (user_id, job_id, kind, amount, reason, created_at)
  SELECT n.user_id, n.job_id, 'reserve', n.price_points, coalesce(n.change_reason, ''),
         n.updated_at
  FROM inserted_jobs AS n
  ORDER BY n.user_id COLLATE "C", n.job_id;
  -- The outbox's statement trigger sends NOTIFY at commit.
  INSERT INTO creation.outbox (
    job_id, user_id, version, created_at, event_type, model_id, webhooks_pending)
  SELECT n.job_id, n.user_id, n.version, n.updated_at, 'job.queued', n.model_id, hooked
  FROM inserted_jobs AS n;
  IF hooked THEN
    PERFORM creation.wake_webhooks();
  END IF;
  RETURN NULL;
END
$$;

-- An update: for each row whose version moved, its event, ledger entry, outbox row and
-- webhook deliveries, in one statement over one join of the statement's old and new rows
-- (a heartbeat, which moves no version, writes nothing).
CREATE OR REPLACE FUNCTION creation.write_job_updates() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  hooked boolean;
BEGIN
  -- A statement that moved no version (a heartbeat, a lease renewal, a fenced write
  -- whose fence no longer held) leaves here: the statements below would each fire their
  -- table's statement triggers over no row (the ledger totals' upsert, the outbox's
  -- NOTIFY, which wakes every relay for nothing) (migration 0034).
  IF NOT EXISTS (
    SELECT FROM updated_jobs AS n JOIN previous_jobs AS o ON o.job_id = n.job_id
    WHERE n.version <> o.version
  ) THEN
    RETURN NULL;
  END IF;
  hooked := EXISTS (SELECT FROM creation.webhook_endpoints WHERE enabled);
  WITH changed AS MATERIALIZED (
    SELECT n.job_id, n.user_id, n.model_id, n.version, n.status, n.price_points, n.updated_at,
           n.change_actor_kind, n.change_actor_id, n.change_reason, n.change_via,
           o.status AS from_status,
           n.status <> o.status AS status_changed,
           n.cancel_requested AND NOT o.cancel_requested AS cancel_asked,
           n.cancel_requester_kind, n.cancel_requester_id,
           CASE WHEN n.deleted_at IS NOT NULL AND o.deleted_at IS NULL THEN 'job.deleted'
                WHEN n.status <> o.status THEN 'job.' || n.status
                ELSE 'job.progress' END AS event_type
    FROM updated_jobs AS n
    JOIN previous_jobs AS o ON o.job_id = n.job_id
    WHERE n.version <> o.version
  ),
  event AS (
    INSERT INTO creation.job_events (
      job_id, version, from_status, to_status, actor_kind, actor_id, reason, created_at,
      requester_kind, requester_id, via)
    SELECT c.job_id, c.version, c.from_status, c.status,
           coalesce(c.change_actor_kind, 'operator'), coalesce(c.change_actor_id, current_user),
           coalesce(c.change_reason, ''), c.updated_at,
           -- Who asked to cancel: on the request, and on the CANCELLED that ends it.
           CASE WHEN c.cancel_asked OR c.status = 'cancelled' THEN c.cancel_requester_kind END,
           CASE WHEN c.cancel_asked OR c.status = 'cancelled' THEN c.cancel_requester_id END,
           -- Only a user's change: writers that are not the user leave change_via as is.
           CASE WHEN c.change_actor_kind = 'user' THEN c.change_via END
    FROM changed AS c
    WHERE c.status_changed OR c.cancel_asked
  ),
  entry AS (
    INSERT INTO creation.points_ledger (user_id, job_id, kind, amount, reason, created_at)
    SELECT c.user_id, c.job_id, creation.ledger_effect(c.status), c.price_points,
           coalesce(c.change_reason, ''), c.updated_at
    FROM changed AS c
    WHERE c.status_changed AND creation.ledger_effect(c.status) IS NOT NULL
    -- In user order (see write_job_inserts).
    ORDER BY c.user_id COLLATE "C", c.job_id
  )
  -- The outbox's statement trigger sends NOTIFY at commit.
  INSERT INTO creation.outbox (
    job_id, user_id, version, created_at, event_type, model_id, webhooks_pending)
  SELECT c.job_id, c.user_id, c.version, c.updated_at, c.event_type, c.model_id, hooked
  FROM changed AS c;
  IF hooked THEN
    PERFORM creation.wake_webhooks();
  END IF;
  RETURN NULL;
END
$$;

-- The deliverers' wake-up at commit (PostgreSQL folds a transaction's equal notifications
-- into one), bounded as the outbox's is (migration 0024): a commit stuck behind the
-- notification queue ends by the statement timeout, not lock_timeout.
CREATE OR REPLACE FUNCTION creation.wake_webhooks() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('statement_timeout') <> '0' THEN
    PERFORM set_config('lock_timeout', '0', true);
  END IF;
  PERFORM pg_notify('creation_webhooks', '');
END
$$;

-- The webhook fan-out, run by the deliverers (any number of replicas), never by a job's
-- writer: up to p_limit outbox rows marked webhooks_pending, oldest first, skipping rows
-- another replica holds, are unmarked, and each gets one delivery per enabled endpoint
-- that wants it: its event type among the endpoint's, the job's user and model within its
-- filters (empty: all), and, for a per-job endpoint, this job. The endpoints are those
-- enabled when the row is fanned out (a moment after the change's commit, while the
-- deliverers run). Each delivery carries the job's message built here from the job's row
-- (read by its primary key, once per row an endpoint wants), as the job stands now: its
-- version is the row's or a later one, since the row committed
-- with the change it records (a job's row is never deleted: a deleted job is its
-- tombstone). A row marked before migration 0031 carries its own copy, used as it is.
-- Returns how many rows it took and how many deliveries it wrote; in the caller's
-- transaction, so both commit together or neither does. PL/pgSQL, with one plan kept by
-- each session: PostgreSQL plans a SQL function's statement at every call, and this one
-- inlines the job's message (1.5 ms of planning a call, every deliverer's poll and wake-up;
-- migration 0034). The plan is the generic one (LIMIT p_limit on the partial index of
-- marked rows, each row's job and endpoints by key), which custom plans would only redo.
CREATE OR REPLACE FUNCTION creation.fan_out_webhooks(p_limit integer)
RETURNS TABLE (taken integer, written integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
  RETURN QUERY
  WITH due AS (
    SELECT outbox_id FROM creation.outbox WHERE webhooks_pending
    ORDER BY outbox_id LIMIT p_limit
    FOR UPDATE SKIP LOCKED
  ),
  took AS (
    UPDATE creation.outbox AS o SET webhooks_pending = false
    FROM due WHERE o.outbox_id = due.outbox_id
    RETURNING o.job_id, o.user_id, o.model_id, o.version, o.event_type, o.payload,
              o.created_at
  ),
  -- Each row with the endpoints that want it, and the job's message for it, built once
  -- per row (MATERIALIZED), and only for a row some endpoint wants: its job's row read
  -- by pk_jobs.
  wanted AS MATERIALIZED (
    SELECT t.job_id, t.user_id, t.version, t.event_type, t.created_at, e.endpoint_ids,
           coalesce(t.payload, (SELECT creation.job_message(j) FROM creation.jobs AS j
                                WHERE j.job_id = t.job_id)) AS payload
    FROM took AS t
    CROSS JOIN LATERAL (
      SELECT array_agg(e.endpoint_id) AS endpoint_ids
      FROM creation.webhook_endpoints AS e
      WHERE e.enabled AND (e.job_id IS NULL OR e.job_id = t.job_id)
        AND t.event_type = ANY (e.event_types)
        AND (cardinality(e.user_ids) = 0 OR t.user_id = ANY (e.user_ids))
        AND (cardinality(e.model_ids) = 0 OR t.model_id = ANY (e.model_ids))
    ) AS e
    WHERE e.endpoint_ids IS NOT NULL
  ),
  wrote AS (
    INSERT INTO creation.webhook_deliveries (
      endpoint_id, job_id, user_id, job_version, event_type, payload, occurred_at,
      next_attempt_at)
    SELECT endpoint_id, w.job_id, w.user_id, w.version, w.event_type, w.payload,
           w.created_at, now()
    FROM wanted AS w CROSS JOIN unnest(w.endpoint_ids) AS endpoint_id
    RETURNING 1
  )
  SELECT (SELECT count(*) FROM took)::integer, (SELECT count(*) FROM wrote)::integer;
END
$$;

-- Statement triggers: one run per writer's statement, whatever its number of rows (so a
-- fenced batch stays one statement's work). Transition tables allow one event each.
DROP TRIGGER IF EXISTS jobs_changes_inserted ON creation.jobs;
CREATE TRIGGER jobs_changes_inserted AFTER INSERT ON creation.jobs
REFERENCING NEW TABLE AS inserted_jobs
FOR EACH STATEMENT EXECUTE FUNCTION creation.write_job_inserts();

DROP TRIGGER IF EXISTS jobs_changes_updated ON creation.jobs;
CREATE TRIGGER jobs_changes_updated AFTER UPDATE ON creation.jobs
REFERENCING OLD TABLE AS previous_jobs NEW TABLE AS updated_jobs
FOR EACH STATEMENT EXECUTE FUNCTION creation.write_job_updates();
