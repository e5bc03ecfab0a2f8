"""The statements that record pushes (notify.pushes), run inside another write's
transaction: a Deliver's apply (so a committed move never lacks its pushes, and a
replayed one, which moves nothing, never adds any: three short statements when the owners
have tokens, one when they have none), and a Live Activity registration (the push it
needs to show its job as it is). What to record, the planner decides."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.kit.logging import get_logger
from services.notify.projection import Job, Moved
from services.notify.pushes.planner import PushPlanner
from services.notify.pushes.planning import Plan, Prior, Token

log = get_logger(__name__)

# The owners' devices and push-to-start tokens, and the jobs' activity tokens. Rides
# ix_push_tokens_user_id_active and ix_push_tokens_job_id_activity_active (statuses and
# kinds literal, so the partial indexes apply).
_TOKENS = text(
    """
    SELECT token_id, user_id, kind, bundle_id, locale, job_id FROM notify.push_tokens
    WHERE status = 'active' AND (
        (user_id = ANY(CAST(:user_ids AS text[])) AND kind IN ('device', 'push_to_start'))
        OR (kind = 'activity' AND job_id = ANY(CAST(:job_ids AS uuid[])))
    )
    """
)

# The latest start and update not dropped, per token and job. Rides
# uq_pushes_token_id_job_id_version_kind (token_id, job_id lead it).
_PRIOR = text(
    """
    SELECT DISTINCT ON (token_id, job_id, kind)
        push_id, token_id, job_id, kind, status, next_attempt_at, sent_at,
        payload -> 'aps' -> 'content-state' AS content_state
    FROM notify.pushes
    WHERE token_id = ANY(CAST(:token_ids AS uuid[]))
      AND job_id = ANY(CAST(:job_ids AS uuid[]))
      AND kind IN ('la_start', 'la_update') AND status <> 'dropped'
    ORDER BY token_id, job_id, kind, version DESC
    """
)

# Holds the pending ones no sender has claimed, so that this transaction may replace
# them. A claim commits before its send, so its lock is gone while the push is in flight:
# attempts = 0 (a claim counts one) is what keeps a push on its way, or waiting to be
# tried again, from being replaced and then reaching the device unrecorded. Rides
# pk_pushes.
_HOLD = text(
    """
    SELECT push_id FROM notify.pushes
    WHERE push_id = ANY(CAST(:push_ids AS bigint[])) AND status = 'pending'
      AND attempts = 0
    FOR UPDATE SKIP LOCKED
    """
)

_DROP = text(
    """
    UPDATE notify.pushes SET status = 'dropped', last_reason = 'superseded'
    WHERE push_id = ANY(CAST(:push_ids AS bigint[]))
    """
)

# The unique key makes a second recording of the same push a no-op.
_INSERT = text(
    """
    INSERT INTO notify.pushes
        (token_id, job_id, version, kind, priority, expires_at, collapse_id, headers,
         payload, next_attempt_at, created_at)
    SELECT token_id, job_id, version, kind, priority, expires_at, collapse_id,
           CAST(headers AS jsonb), CAST(payload AS jsonb), next_attempt_at, now()
    FROM unnest(
        CAST(:token_ids AS uuid[]), CAST(:job_ids AS uuid[]), CAST(:versions AS bigint[]),
        CAST(:kinds AS text[]), CAST(:priorities AS int[]),
        CAST(:expires_ats AS timestamptz[]), CAST(:collapse_ids AS text[]),
        CAST(:headers AS text[]), CAST(:payloads AS text[]),
        CAST(:next_attempt_ats AS timestamptz[])
    ) AS planned(token_id, job_id, version, kind, priority, expires_at, collapse_id,
                 headers, payload, next_attempt_at)
    ON CONFLICT (token_id, job_id, version, kind) DO NOTHING
    RETURNING kind
    """
)


# A deleted job's Live Activity tokens serve nothing any more: retired with it, and what
# they still had waiting dropped (one the sender holds right now is left to it). A token
# whose `end` is still to go keeps it and stays active: the tombstone is the job's last
# version, so nothing else is ever planned for it. Rides
# ix_push_tokens_job_id_activity_active, and uq_pushes_token_id_job_id_version_kind for
# the pending end.
_RETIRE_FOR_DELETED_JOBS = text(
    """
    WITH retired AS (
        UPDATE notify.push_tokens AS t
        SET status = 'retired', status_reason = 'job_deleted', retired_at = now()
        WHERE t.kind = 'activity' AND t.status = 'active'
          AND t.job_id = ANY(CAST(:job_ids AS uuid[]))
          AND NOT EXISTS (
              SELECT 1 FROM notify.pushes p
              WHERE p.token_id = t.token_id AND p.job_id = t.job_id
                AND p.kind = 'la_end' AND p.status = 'pending'
          )
        RETURNING t.token_id
    ), dropped AS (
        UPDATE notify.pushes SET status = 'dropped', last_reason = 'token_retired'
        WHERE push_id IN (
            SELECT push_id FROM notify.pushes
            WHERE token_id IN (SELECT token_id FROM retired) AND status = 'pending'
            FOR UPDATE SKIP LOCKED
        )
    )
    SELECT count(*) AS retired FROM retired
    """
)

# What last reached (or waits to reach) a newly registered activity for its job: an
# update to one of its tokens (this one, or one it rotated from), or the start its
# device's push-to-start token got. Rides ix_push_tokens_device_id, then
# uq_pushes_token_id_job_id_version_kind.
_REGISTRATION_PRIOR = text(
    """
    SELECT push_id, kind, status, next_attempt_at, sent_at,
        payload -> 'aps' -> 'content-state' AS content_state
    FROM notify.pushes
    WHERE job_id = :job_id AND status <> 'dropped' AND kind IN ('la_start', 'la_update')
      AND token_id IN (
        SELECT token_id FROM notify.push_tokens
        WHERE device_id = :device_id AND (
            kind = 'push_to_start'
            OR (kind = 'activity' AND job_id = :job_id AND activity_id = :activity_id)
        )
      )
    ORDER BY version DESC, push_id DESC
    LIMIT 1
    """
)


async def record_moves(
    connection: AsyncConnection, moved: Sequence[Moved], planner: PushPlanner
) -> None:
    """Records the pushes ``moved`` implies, in the apply's transaction."""
    user_ids = sorted({change.applied.user_id for change in moved})
    job_ids = sorted({change.applied.job_id for change in moved})
    rows = await connection.execute(_TOKENS, {"user_ids": user_ids, "job_ids": job_ids})
    tokens = [
        Token(
            token_id=str(row.token_id),
            user_id=row.user_id,
            kind=row.kind,
            bundle_id=row.bundle_id,
            locale=row.locale,
            job_id=str(row.job_id) if row.job_id else None,
        )
        for row in rows
    ]
    if not tokens:
        return
    prior = await _prior(connection, tokens, job_ids)
    await _write(connection, planner.for_moves(moved, tokens, prior))
    # After the write: a deleted job's activity keeps its token until its end went.
    deleted = {c.applied.job_id for c in moved if c.applied.state.deleted}
    if any(t.kind == "activity" and t.job_id in deleted for t in tokens):
        retired = await connection.scalar(_RETIRE_FOR_DELETED_JOBS, {"job_ids": sorted(deleted)})
        log.info("activity_tokens_retired", reason="job_deleted", count=retired)


async def record_registration(
    connection: AsyncConnection,
    activity: Token,
    device_id: str,
    activity_id: str,
    state: Job,
    planner: PushPlanner,
) -> None:
    """Records what a Live Activity registered just now needs to show ``state``, its job's
    current state. Runs in the registration's transaction, which holds the projection's
    applies off (store.projection.hold_applies)."""
    row = (
        await connection.execute(
            _REGISTRATION_PRIOR,
            {"job_id": state.job_id, "device_id": device_id, "activity_id": activity_id},
        )
    ).one_or_none()
    last = None
    if row is not None:
        held = row.status == "pending" and bool(
            (await connection.execute(_HOLD, {"push_ids": [int(row.push_id)]})).first()
        )
        last = Prior(
            push_id=int(row.push_id),
            kind=row.kind,
            status=row.status,
            next_attempt_at=row.next_attempt_at,
            sent_at=row.sent_at,
            content_state=row.content_state,
            held=held,
        )
    await _write(connection, planner.at_registration(state, activity, last))


async def _prior(
    connection: AsyncConnection, tokens: list[Token], job_ids: list[str]
) -> dict[tuple[str, str, str], Prior]:
    live = [t.token_id for t in tokens if t.kind in ("activity", "push_to_start")]
    if not live:
        return {}
    rows = (await connection.execute(_PRIOR, {"token_ids": live, "job_ids": job_ids})).all()
    pending = [int(row.push_id) for row in rows if row.status == "pending"]
    held: set[int] = set()
    if pending:
        held = {int(row.push_id) for row in await connection.execute(_HOLD, {"push_ids": pending})}
    return {
        (str(row.token_id), str(row.job_id), row.kind): Prior(
            push_id=int(row.push_id),
            kind=row.kind,
            status=row.status,
            next_attempt_at=row.next_attempt_at,
            sent_at=row.sent_at,
            content_state=row.content_state,
            held=int(row.push_id) in held,
        )
        for row in rows
    }


async def _write(connection: AsyncConnection, result: Plan) -> None:
    for token_id, kind, size in result.oversized:
        log.error("push_too_large", to=token_id, kind=kind, bytes=size)
    if result.dropped:
        await connection.execute(_DROP, {"push_ids": result.dropped})
    if not result.pushes:
        return
    planned = result.pushes
    recorded = await connection.execute(
        _INSERT,
        {
            "token_ids": [p.token_id for p in planned],
            "job_ids": [p.job_id for p in planned],
            "versions": [p.version for p in planned],
            "kinds": [p.push.kind for p in planned],
            "priorities": [p.push.priority for p in planned],
            "expires_ats": [p.push.expires_at for p in planned],
            "collapse_ids": [p.push.collapse_id for p in planned],
            "headers": [json.dumps(p.push.headers) for p in planned],
            "payloads": [json.dumps(p.push.payload, ensure_ascii=False) for p in planned],
            "next_attempt_ats": [p.send_at for p in planned],
        },
    )
    kinds = [row.kind for row in recorded]
    if kinds:
        log.info("pushes_recorded", count=len(kinds), kinds=sorted(set(kinds)))
