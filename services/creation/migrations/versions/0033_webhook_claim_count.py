"""webhook claims find the endpoints with due rows by one index descent each, and count an
endpoint's claims in flight once per claim by a plain index scan.

0032's lock statement asked EXISTS of a due row, which with a fresh backlog's statistics
the planner ran as a hash of every due row (30,000 rows, 20 ms, every claim; main's
statements before 0032 did the same, twice a claim). 0032's count of the claims in flight
was inlined into the pick, so it ran again for every row picked (33 counts for a claim of
32), and with those statistics it read the index by a bitmap scan, which visits the heap
for every entry of the last claim_seconds' claims and never marks the answered ones dead.
A backlog of 30,000 deliveries (bench/webhooks.py) made a claim 16 ms of PostgreSQL's CPU
until autovacuum came by; now 2.4 ms. The due row is a LIMIT 1 subquery; the count is
MATERIALIZED and ordered as the index (newest claims first), so its scan is a plain one.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-04
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CLAIM_WEBHOOKS = """
CREATE OR REPLACE FUNCTION creation.claim_webhooks(
  p_limit integer, p_claim_seconds double precision, p_parts integer
) RETURNS TABLE (
  delivery_id bigint, claimed_until timestamptz, message_id text, endpoint_id text,
  event_type text, payload text, occurred_at timestamptz, attempts integer,
  job_version bigint, url text, secret text, previous_secret text, failing boolean,
  more boolean
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_locked uuid[];
BEGIN
  -- The locks first, in a statement of their own: the claim below takes a new snapshot
  -- (READ COMMITTED), which sees every claim committed by a replica this one waited for.
  SELECT array_agg(l.endpoint_id) INTO v_locked FROM (
    WITH RECURSIVE pending AS (
      (SELECT d.endpoint_id FROM creation.webhook_deliveries AS d
       WHERE d.state = 'pending' ORDER BY d.endpoint_id LIMIT 1)
      UNION ALL
      SELECT (SELECT d.endpoint_id FROM creation.webhook_deliveries AS d
              WHERE d.state = 'pending' AND d.endpoint_id > p.endpoint_id
              ORDER BY d.endpoint_id LIMIT 1)
      FROM pending AS p WHERE p.endpoint_id IS NOT NULL
    )
    SELECT e.endpoint_id FROM pending AS p
    JOIN creation.webhook_endpoints AS e ON e.endpoint_id = p.endpoint_id
    -- A due row of the endpoint, one descent of ix_webhook_deliveries_endpoint_due (an
    -- EXISTS, the planner could hash every due row of every endpoint into a semi-join).
    WHERE e.enabled AND (
      SELECT true FROM creation.webhook_deliveries AS d
      WHERE d.endpoint_id = e.endpoint_id AND d.state = 'pending'
        AND d.next_attempt_at <= now()
      ORDER BY d.endpoint_id, d.next_attempt_at
      LIMIT 1
    )
    FOR UPDATE OF e SKIP LOCKED
  ) AS l;
  IF v_locked IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY
  -- Counted once per endpoint (MATERIALIZED: inlined, the count ran again for every
  -- row picked).
  WITH free AS MATERIALIZED (
    SELECT e.endpoint_id, e.max_in_flight - (
             -- At most max_in_flight (room 0 either way), newest claims first: a plain
             -- index scan of ix_webhook_deliveries_in_flight in its order, which marks
             -- the entries of answered claims dead for the next count to skip (a bitmap
             -- scan, which a fresh backlog's statistics led the planner to, marks none
             -- and read every claim of the last claim_seconds from the heap).
             SELECT count(*) FROM (
               SELECT FROM creation.webhook_deliveries AS f
               WHERE f.endpoint_id = e.endpoint_id AND f.claimed_until > now()
               ORDER BY f.endpoint_id DESC, f.claimed_until DESC
               LIMIT e.max_in_flight
             ) AS f
           ) AS free,
           ceil(e.max_in_flight::numeric / greatest(p_parts, 1))::integer AS part
    FROM creation.webhook_endpoints AS e
    WHERE e.endpoint_id = ANY (v_locked)
  ),
  room AS (
    -- more: the endpoint has room past this claim's part (the deliverer claims again).
    SELECT f.endpoint_id, least(f.free, f.part) AS room, f.free > f.part AS more
    FROM free AS f
  ),
  picked AS (
    SELECT p.delivery_id, r.more
    FROM room AS r
    CROSS JOIN LATERAL (
      SELECT d.delivery_id FROM creation.webhook_deliveries AS d
      WHERE d.endpoint_id = r.endpoint_id AND d.state = 'pending'
        AND d.next_attempt_at <= now()
        AND (d.claimed_until IS NULL OR d.claimed_until <= now())
      -- By ix_webhook_deliveries_endpoint_due (the endpoint named, so its order).
      ORDER BY d.endpoint_id, d.next_attempt_at
      LIMIT greatest(r.room, 0)
      FOR UPDATE OF d SKIP LOCKED
    ) AS p
    LIMIT p_limit
  )
  UPDATE creation.webhook_deliveries AS d
  SET claimed_until = now() + make_interval(secs => p_claim_seconds)
  FROM picked, creation.webhook_endpoints AS e
  LEFT JOIN creation.webhook_signing_keys AS k ON k.owner = e.signing_owner
  WHERE d.delivery_id = picked.delivery_id AND e.endpoint_id = d.endpoint_id
  RETURNING d.delivery_id, d.claimed_until, d.message_id, d.endpoint_id::text,
            d.event_type, d.payload::text, d.occurred_at, d.attempts, d.job_version,
            e.url, coalesce(e.secret, k.secret),
            CASE WHEN coalesce(e.previous_secret_expires_at, k.previous_secret_expires_at)
                      > now()
                 THEN coalesce(e.previous_secret, k.previous_secret) END,
            e.failing_since IS NOT NULL, picked.more;
END
$$
"""

# 0032's, for the downgrade (a migration imports nothing, not even another migration).
CLAIM_WEBHOOKS_0032 = """
CREATE OR REPLACE FUNCTION creation.claim_webhooks(
  p_limit integer, p_claim_seconds double precision, p_parts integer
) RETURNS TABLE (
  delivery_id bigint, claimed_until timestamptz, message_id text, endpoint_id text,
  event_type text, payload text, occurred_at timestamptz, attempts integer,
  job_version bigint, url text, secret text, previous_secret text, failing boolean,
  more boolean
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_locked uuid[];
BEGIN
  -- The locks first, in a statement of their own: the claim below takes a new snapshot
  -- (READ COMMITTED), which sees every claim committed by a replica this one waited for.
  SELECT array_agg(l.endpoint_id) INTO v_locked FROM (
    WITH RECURSIVE pending AS (
      (SELECT d.endpoint_id FROM creation.webhook_deliveries AS d
       WHERE d.state = 'pending' ORDER BY d.endpoint_id LIMIT 1)
      UNION ALL
      SELECT (SELECT d.endpoint_id FROM creation.webhook_deliveries AS d
              WHERE d.state = 'pending' AND d.endpoint_id > p.endpoint_id
              ORDER BY d.endpoint_id LIMIT 1)
      FROM pending AS p WHERE p.endpoint_id IS NOT NULL
    )
    SELECT e.endpoint_id FROM pending AS p
    JOIN creation.webhook_endpoints AS e ON e.endpoint_id = p.endpoint_id
    WHERE e.enabled AND EXISTS (
      SELECT FROM creation.webhook_deliveries AS d
      WHERE d.endpoint_id = e.endpoint_id AND d.state = 'pending'
        AND d.next_attempt_at <= now()
    )
    FOR UPDATE OF e SKIP LOCKED
  ) AS l;
  IF v_locked IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH free AS (
    SELECT e.endpoint_id, e.max_in_flight - (
             -- At most max_in_flight (room 0 either way): an index scan, which also
             -- marks the entries of answered claims dead for the next one to skip.
             SELECT count(*) FROM (
               SELECT FROM creation.webhook_deliveries AS f
               WHERE f.endpoint_id = e.endpoint_id AND f.claimed_until > now()
               LIMIT e.max_in_flight
             ) AS f
           ) AS free,
           ceil(e.max_in_flight::numeric / greatest(p_parts, 1))::integer AS part
    FROM creation.webhook_endpoints AS e
    WHERE e.endpoint_id = ANY (v_locked)
  ),
  room AS (
    -- more: the endpoint has room past this claim's part (the deliverer claims again).
    SELECT f.endpoint_id, least(f.free, f.part) AS room, f.free > f.part AS more
    FROM free AS f
  ),
  picked AS (
    SELECT p.delivery_id, r.more
    FROM room AS r
    CROSS JOIN LATERAL (
      SELECT d.delivery_id FROM creation.webhook_deliveries AS d
      WHERE d.endpoint_id = r.endpoint_id AND d.state = 'pending'
        AND d.next_attempt_at <= now()
        AND (d.claimed_until IS NULL OR d.claimed_until <= now())
      -- By ix_webhook_deliveries_endpoint_due (the endpoint named, so its order).
      ORDER BY d.endpoint_id, d.next_attempt_at
      LIMIT greatest(r.room, 0)
      FOR UPDATE OF d SKIP LOCKED
    ) AS p
    LIMIT p_limit
  )
  UPDATE creation.webhook_deliveries AS d
  SET claimed_until = now() + make_interval(secs => p_claim_seconds)
  FROM picked, creation.webhook_endpoints AS e
  LEFT JOIN creation.webhook_signing_keys AS k ON k.owner = e.signing_owner
  WHERE d.delivery_id = picked.delivery_id AND e.endpoint_id = d.endpoint_id
  RETURNING d.delivery_id, d.claimed_until, d.message_id, d.endpoint_id::text,
            d.event_type, d.payload::text, d.occurred_at, d.attempts, d.job_version,
            e.url, coalesce(e.secret, k.secret),
            CASE WHEN coalesce(e.previous_secret_expires_at, k.previous_secret_expires_at)
                      > now()
                 THEN coalesce(e.previous_secret, k.previous_secret) END,
            e.failing_since IS NOT NULL, picked.more;
END
$$
"""


def upgrade() -> None:
    op.execute(CLAIM_WEBHOOKS)


def downgrade() -> None:
    op.execute(CLAIM_WEBHOOKS_0032)
