"""The statements of registering, listing and removing APNs tokens (notify.push_tokens).

A token is stored once (per job for activity tokens): registering it again refreshes the
same row and makes it active again, so a client that registers on every launch is
harmless. Whatever stops being a live token (a deleted device with its push-to-start and
activity tokens, a rotated activity token) is retired in the same transaction, and its
pushes not yet sent are dropped.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.kit.db import fetch
from services.notify.domain import ActivityRegistration, DeviceCursor, DeviceRegistration, DeviceRow
from services.notify.errors import DeviceNotFound, JobNotFound
from services.notify.projection import Job
from services.notify.pushes.planner import PushPlanner
from services.notify.pushes.planning import Token
from services.notify.store import pushes
from services.notify.store.boundary import database
from services.notify.store.projection import hold_applies

# The ON CONFLICT target is uq_push_tokens_kind_token_job's expression, exactly.
_UPSERT_TOKEN = text(
    """
    INSERT INTO notify.push_tokens AS held
        (token_id, user_id, kind, token, environment, bundle_id, locale, job_id,
         activity_id, device_id, status, registered_at)
    VALUES
        (:token_id, :user_id, :kind, :token, :environment, :bundle_id, :locale,
         :job_id, :activity_id, :device_id, 'active', now())
    ON CONFLICT (kind, token, coalesce(job_id, '00000000-0000-0000-0000-000000000000'::uuid))
    DO UPDATE SET
        user_id = EXCLUDED.user_id,
        environment = EXCLUDED.environment,
        bundle_id = EXCLUDED.bundle_id,
        locale = EXCLUDED.locale,
        activity_id = EXCLUDED.activity_id,
        device_id = EXCLUDED.device_id,
        status = 'active',
        status_reason = NULL,
        registered_at = EXCLUDED.registered_at,
        retired_at = NULL
    RETURNING token_id, created_at, registered_at
    """
)

# A device's other tokens that are no longer live: push-to-start tokens replaced by a new
# one, and any token of a device that another user registered since. Rides
# ix_push_tokens_device_id.
_RETIRE_REPLACED_ON_DEVICE = text(
    """
    UPDATE notify.push_tokens SET status = 'retired', status_reason = :reason, retired_at = now()
    WHERE device_id = :device_id AND status = 'active'
      AND (user_id <> :user_id OR (kind = 'push_to_start' AND token_id <> :keep))
    RETURNING token_id
    """
)


_DEVICE = text(
    """
    SELECT
    d.token_id, d.environment, d.bundle_id, d.locale, d.created_at, d.registered_at,
    EXISTS (
        SELECT 1 FROM notify.push_tokens p
        WHERE p.device_id = d.token_id AND p.kind = 'push_to_start' AND p.status = 'active'
    ) AS has_push_to_start_token
    FROM notify.push_tokens d WHERE d.token_id = :device_id
    """
)

# Rides ix_push_tokens_user_id_active.
_DEVICE_PAGE = text(
    """
    SELECT
    d.token_id, d.environment, d.bundle_id, d.locale, d.created_at, d.registered_at,
    EXISTS (
        SELECT 1 FROM notify.push_tokens p
        WHERE p.device_id = d.token_id AND p.kind = 'push_to_start' AND p.status = 'active'
    ) AS has_push_to_start_token
    FROM notify.push_tokens d
    WHERE d.user_id = :user_id AND d.status = 'active' AND d.kind = 'device'
      AND (CAST(:after_created AS timestamptz) IS NULL
           OR (d.created_at, d.token_id) < (:after_created, CAST(:after_id AS uuid)))
    ORDER BY d.created_at DESC, d.token_id DESC
    LIMIT :limit
    """
)

# The device and every token living on it. Rides pk_push_tokens, ix_push_tokens_device_id.
_RETIRE_DEVICE = text(
    """
    WITH device AS (
        UPDATE notify.push_tokens
        SET status = 'retired', status_reason = 'deleted', retired_at = now()
        WHERE token_id = :device_id AND kind = 'device' AND user_id = :user_id
          AND status <> 'retired'
        RETURNING token_id
    ), living_on_it AS (
        UPDATE notify.push_tokens
        SET status = 'retired', status_reason = 'device_deleted', retired_at = now()
        WHERE device_id IN (SELECT token_id FROM device) AND status = 'active'
        RETURNING token_id
    )
    SELECT token_id FROM device UNION ALL SELECT token_id FROM living_on_it
    """
)

_LIVE_DEVICE = text(
    """
    SELECT environment, bundle_id, locale FROM notify.push_tokens
    WHERE token_id = :device_id AND kind = 'device' AND user_id = :user_id
      AND status = 'active'
    """
)

# The job's owner and current state, as the projection holds them. Rides pk_job_states.
_JOB_STATE = text("SELECT user_id, state FROM notify.job_states WHERE job_id = :job_id")

# The activity's earlier tokens (rotation) or all of them (removal). Rides
# ix_push_tokens_job_id_activity_active.
_RETIRE_ACTIVITY = text(
    """
    UPDATE notify.push_tokens SET status = 'retired', status_reason = :reason, retired_at = now()
    WHERE kind = 'activity' AND status = 'active' AND job_id = :job_id
      AND user_id = :user_id AND activity_id = :activity_id
      AND (CAST(:keep AS uuid) IS NULL OR token_id <> CAST(:keep AS uuid))
    RETURNING token_id
    """
)

# Pushes not sent yet to tokens that are gone; one the sender holds right now is left to it.
_DROP_PENDING = text(
    """
    UPDATE notify.pushes SET status = 'dropped', last_reason = 'token_retired'
    WHERE push_id IN (
        SELECT push_id FROM notify.pushes
        WHERE token_id = ANY(CAST(:token_ids AS uuid[])) AND status = 'pending'
        FOR UPDATE SKIP LOCKED
    )
    """
)


async def _drop_pending(connection: AsyncConnection, token_ids: list[str]) -> None:
    if token_ids:
        await connection.execute(_DROP_PENDING, {"token_ids": token_ids})


async def _upsert(
    connection: AsyncConnection,
    *,
    user_id: str,
    kind: str,
    token: str,
    environment: str,
    bundle_id: str,
    locale: str,
    job_id: str | None = None,
    activity_id: str | None = None,
    device_id: str | None = None,
) -> tuple[str, datetime]:
    row = (
        await connection.execute(
            _UPSERT_TOKEN,
            {
                "token_id": str(uuid.uuid4()),
                "user_id": user_id,
                "kind": kind,
                "token": token,
                "environment": environment,
                "bundle_id": bundle_id,
                "locale": locale,
                "job_id": job_id,
                "activity_id": activity_id,
                "device_id": device_id,
            },
        )
    ).one()
    return str(row.token_id), row.registered_at


def _device(row: Row[Any]) -> DeviceRow:
    return DeviceRow(
        device_id=str(row.token_id),
        environment=row.environment,
        bundle_id=row.bundle_id,
        locale=row.locale,
        has_push_to_start_token=row.has_push_to_start_token,
        created_at=row.created_at,
        registered_at=row.registered_at,
    )


class TokenStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @database
    async def register_device(self, registration: DeviceRegistration) -> DeviceRow:
        """Stores (or refreshes) the device token and, when given, its push-to-start token,
        which replaces the device's earlier one."""
        common = {
            "user_id": registration.user_id,
            "environment": registration.environment,
            "bundle_id": registration.bundle_id,
            "locale": registration.locale,
        }
        async with self._engine.begin() as connection:
            device_id, _ = await _upsert(
                connection, kind="device", token=registration.token, **common
            )
            keep = device_id
            if registration.push_to_start_token is not None:
                keep, _ = await _upsert(
                    connection,
                    kind="push_to_start",
                    token=registration.push_to_start_token,
                    device_id=device_id,
                    **common,
                )
            replaced = await connection.execute(
                _RETIRE_REPLACED_ON_DEVICE,
                {
                    "device_id": device_id,
                    "user_id": registration.user_id,
                    "keep": keep,
                    "reason": "replaced",
                },
            )
            await _drop_pending(connection, [str(row.token_id) for row in replaced])
            return _device((await connection.execute(_DEVICE, {"device_id": device_id})).one())

    @database
    async def list_devices(
        self, user_id: str, limit: int, after: DeviceCursor | None
    ) -> tuple[list[DeviceRow], DeviceCursor | None]:
        """One page of the user's live devices, newest first, and the cursor of the next."""
        rows = await fetch(
            self._engine,
            _DEVICE_PAGE,
            {
                "user_id": user_id,
                "after_created": after.created_at if after else None,
                "after_id": after.device_id if after else None,
                "limit": limit + 1,
            },
        )
        devices = [_device(row) for row in rows[:limit]]
        more = len(rows) > limit
        cursor = DeviceCursor(devices[-1].created_at, devices[-1].device_id) if more else None
        return devices, cursor

    @database
    async def delete_device(self, user_id: str, device_id: str) -> bool:
        """Retires the device and its tokens; False unless it is one of the user's."""
        async with self._engine.begin() as connection:
            retired = [
                str(row.token_id)
                for row in await connection.execute(
                    _RETIRE_DEVICE, {"device_id": device_id, "user_id": user_id}
                )
            ]
            await _drop_pending(connection, retired)
            return bool(retired)

    @database
    async def register_activity(
        self, registration: ActivityRegistration, planner: PushPlanner | None = None
    ) -> datetime:
        """Stores the activity's token on the user's device; an earlier token of the same
        activity is retired (rotation). Raises DeviceNotFound, or JobNotFound (another
        user's job, or one its owner deleted).

        A job the projection has not heard of yet (just submitted) is accepted: planning
        only ever pushes a job's updates to its owner's tokens. One it has heard of gets,
        through ``planner``, what the activity needs to show the job as it is now: the
        activity may have been registered after the job's last change, which no later
        change will tell it. Applies are held off meanwhile, so one running now either
        committed before this reads the state or sees this token."""
        async with self._engine.begin() as connection:
            await hold_applies(connection)
            held = (
                await connection.execute(_JOB_STATE, {"job_id": registration.job_id})
            ).one_or_none()
            state = Job.FromString(held.state) if held is not None else None
            if state is not None and (state.user_id != registration.user_id or state.deleted):
                raise JobNotFound(registration.job_id)
            device = (
                await connection.execute(
                    _LIVE_DEVICE,
                    {"device_id": registration.device_id, "user_id": registration.user_id},
                )
            ).one_or_none()
            if device is None:
                raise DeviceNotFound(registration.device_id)
            token_id, registered_at = await _upsert(
                connection,
                user_id=registration.user_id,
                kind="activity",
                token=registration.token,
                environment=device.environment,
                bundle_id=device.bundle_id,
                locale=device.locale,
                job_id=registration.job_id,
                activity_id=registration.activity_id,
                device_id=registration.device_id,
            )
            rotated = await connection.execute(
                _RETIRE_ACTIVITY,
                {
                    "job_id": registration.job_id,
                    "user_id": registration.user_id,
                    "activity_id": registration.activity_id,
                    "keep": token_id,
                    "reason": "rotated",
                },
            )
            await _drop_pending(connection, [str(row.token_id) for row in rotated])
            if state is not None and planner is not None:
                activity = Token(
                    token_id=token_id,
                    user_id=registration.user_id,
                    kind="activity",
                    bundle_id=device.bundle_id,
                    locale=device.locale,
                    job_id=registration.job_id,
                )
                await pushes.record_registration(
                    connection,
                    activity,
                    registration.device_id,
                    registration.activity_id,
                    state,
                    planner,
                )
            return registered_at

    @database
    async def delete_activity(self, user_id: str, job_id: str, activity_id: str) -> bool:
        """Retires the activity's tokens; False when it has none live."""
        async with self._engine.begin() as connection:
            retired = [
                str(row.token_id)
                for row in await connection.execute(
                    _RETIRE_ACTIVITY,
                    {
                        "job_id": job_id,
                        "user_id": user_id,
                        "activity_id": activity_id,
                        "keep": None,
                        "reason": "removed",
                    },
                )
            ]
            await _drop_pending(connection, retired)
            return bool(retired)
