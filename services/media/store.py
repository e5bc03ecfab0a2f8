"""The only module that runs SQL for media. Each statement is named, says what it is for,
and names the index it rides.

State changes are conditional updates (``WHERE status = 'uploading'`` and the like): of
two racing callers exactly one changes the row, and the other learns it from the empty
result rather than by overwriting.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.media.model import Asset, ContentFacts, Purpose, Status
from services.media.tables import assets

_c = assets.c


def _asset(row: Row[Any]) -> Asset:
    values = row._mapping
    return Asset(
        asset_id=values["asset_id"],
        owner_user_id=values["owner_user_id"],
        purpose=Purpose(values["purpose"]),
        status=Status(values["status"]),
        content_type=values["content_type"],
        declared_size_bytes=values["declared_size_bytes"],
        declared_sha256=values["declared_sha256"],
        size_bytes=values["size_bytes"],
        sha256=values["sha256"],
        width=values["width"],
        height=values["height"],
        rejected_uploads=values["rejected_uploads"],
        object_key=values["object_key"],
        created_at=values["created_at"],
        upload_expires_at=values["upload_expires_at"],
        ready_at=values["ready_at"],
        deleted_at=values["deleted_at"],
    )


@dataclass(frozen=True)
class ExpiredUpload:
    asset_id: uuid.UUID
    object_key: str


class ExpiredBatch:
    """Expired uploads locked by this transaction: other replicas skip them until it ends."""

    def __init__(
        self, connection: AsyncConnection, uploads: Sequence[ExpiredUpload], now: datetime
    ) -> None:
        self._connection = connection
        self.uploads = list(uploads)
        self._now = now

    async def mark_deleted(self) -> None:
        """Rides pk_assets; the rows are ours (locked), so every one changes."""
        if not self.uploads:
            return
        await self._connection.execute(
            update(assets)
            .where(_c.asset_id.in_([u.asset_id for u in self.uploads]))
            .where(_c.status == Status.UPLOADING.value)
            .values(status=Status.DELETED.value, deleted_at=self._now)
        )


class AssetStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def insert_uploading(self, asset: Asset) -> None:
        """A new asset waiting for its bytes (CreateUpload, and PutAsset before it stores)."""
        async with self._engine.begin() as connection:
            await connection.execute(
                insert(assets).values(
                    asset_id=asset.asset_id,
                    owner_user_id=asset.owner_user_id,
                    purpose=asset.purpose.value,
                    status=Status.UPLOADING.value,
                    content_type=asset.content_type,
                    declared_size_bytes=asset.declared_size_bytes,
                    declared_sha256=asset.declared_sha256,
                    object_key=asset.object_key,
                    created_at=asset.created_at,
                    upload_expires_at=asset.upload_expires_at,
                )
            )

    async def get(self, asset_id: uuid.UUID) -> Asset | None:
        """Any asset by id (rides pk_assets)."""
        async with self._engine.connect() as connection:
            row = (await connection.execute(select(assets).where(_c.asset_id == asset_id))).first()
        return None if row is None else _asset(row)

    async def get_owned(self, asset_id: uuid.UUID, owner_user_id: str) -> Asset | None:
        """The asset if this user owns it; another user's asset is simply not found
        (rides pk_assets)."""
        query = select(assets).where(_c.asset_id == asset_id, _c.owner_user_id == owner_user_id)
        async with self._engine.connect() as connection:
            row = (await connection.execute(query)).first()
        return None if row is None else _asset(row)

    async def mark_ready(
        self, asset_id: uuid.UUID, facts: ContentFacts, now: datetime, rejected_uploads: int
    ) -> Asset | None:
        """uploading → ready with the measured facts, if no upload was rejected since the
        caller read the asset. None when it was no longer uploading (completed by someone
        else, or removed) or a rejection came in between (rides pk_assets)."""
        statement = (
            update(assets)
            .where(
                _c.asset_id == asset_id,
                _c.status == Status.UPLOADING.value,
                _c.rejected_uploads == rejected_uploads,
            )
            .values(
                status=Status.READY.value,
                size_bytes=facts.size_bytes,
                sha256=facts.sha256,
                width=facts.width,
                height=facts.height,
                ready_at=now,
            )
            .returning(*assets.c)
        )
        async with self._engine.begin() as connection:
            row = (await connection.execute(statement)).first()
        return None if row is None else _asset(row)

    async def reject_upload(self, asset_id: uuid.UUID, rejected_uploads: int) -> bool:
        """Counts a rejected upload. True only for the caller whose view of the asset was
        current: that caller, and no other, deletes the object (rides pk_assets)."""
        statement = (
            update(assets)
            .where(
                _c.asset_id == asset_id,
                _c.status == Status.UPLOADING.value,
                _c.rejected_uploads == rejected_uploads,
            )
            .values(rejected_uploads=_c.rejected_uploads + 1)
            .returning(_c.asset_id)
        )
        async with self._engine.begin() as connection:
            return (await connection.execute(statement)).first() is not None

    async def mark_deleted(self, asset_id: uuid.UUID, now: datetime) -> Asset | None:
        """Any live status → deleted; a deleted asset keeps its first deletion time. None
        for an unknown id (rides pk_assets)."""
        statement = (
            update(assets)
            .where(_c.asset_id == asset_id, _c.status != Status.DELETED.value)
            .values(status=Status.DELETED.value, deleted_at=now)
            .returning(*assets.c)
        )
        async with self._engine.begin() as connection:
            row = (await connection.execute(statement)).first()
            if row is None:
                row = (
                    await connection.execute(select(assets).where(_c.asset_id == asset_id))
                ).first()
        return None if row is None else _asset(row)

    @asynccontextmanager
    async def claim_expired_uploads(self, now: datetime, limit: int) -> AsyncIterator[ExpiredBatch]:
        """Locks up to ``limit`` uploads whose time ran out, skipping rows another replica
        holds; the lock lasts until the block ends (rides ix_assets_upload_expiry)."""
        query = (
            select(_c.asset_id, _c.object_key)
            .where(_c.status == Status.UPLOADING.value, _c.upload_expires_at <= now)
            .order_by(_c.upload_expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        async with self._engine.begin() as connection:
            rows = (await connection.execute(query)).all()
            yield ExpiredBatch(
                connection, [ExpiredUpload(row.asset_id, row.object_key) for row in rows], now
            )
