"""The only module that runs SQL for media. Each statement is named, says what it is for,
and names the index it rides.

State changes are conditional updates (``WHERE status = 'uploading'`` and the like): of
two racing callers exactly one changes the row, and the other learns it from the empty
result rather than by overwriting.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import (
    ARRAY,
    UUID,
    Row,
    Text,
    bindparam,
    cast,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from services.kit.db import DriverStatement, driver_connection, driver_fetch
from services.kit.outages import classify, database_failures
from services.media.domain import Asset, ContentFacts, Purpose, Status
from services.media.errors import DatabaseFailed
from services.media.tables import assets

_c = assets.c
_P = ParamSpec("_P")
_T = TypeVar("_T")


def _database(
    method: Callable[_P, Awaitable[_T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """A store method whose database outages and contention leave as DatabaseFailed (the
    kit's one boundary, kit.outages.database_failures); any other failure passes unchanged."""

    @functools.wraps(method)
    async def answering(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with database_failures(DatabaseFailed):
            return await method(*args, **kwargs)

    return answering


# The hot reads, compiled once for asyncpg (kit.db.driver_fetch): one autocommit
# statement each, prepared once per connection.
ASSET_BY_ID = DriverStatement.of(select(assets).where(_c.asset_id == bindparam("asset_id")))
OWNED_ASSET = DriverStatement.of(
    select(assets).where(
        _c.asset_id == bindparam("asset_id"), _c.owner_user_id == bindparam("owner_user_id")
    )
)
STATUS_BY_KEY = DriverStatement.of(
    select(_c.status).where(_c.object_key == bindparam("object_key"))
)
# The same for many keys in one statement (rides uq_assets_object_key).
STATUSES_BY_KEY = DriverStatement.of(
    select(_c.object_key, _c.status).where(
        _c.object_key == func.any(cast(bindparam("object_keys"), ARRAY(Text)))
    )
)
# The asset an owner's idempotency key made (rides uq_assets_owner_idempotency_key).
ASSET_BY_IDEMPOTENCY_KEY = DriverStatement.of(
    select(assets).where(
        _c.owner_user_id == bindparam("owner_user_id"),
        _c.idempotency_key == bindparam("idempotency_key"),
        _c.idempotency_key.is_not(None),
    )
)
# The upload an owner's CreateUpload request id made (rides
# uq_assets_owner_upload_request_id).
ASSET_BY_UPLOAD_REQUEST_ID = DriverStatement.of(
    select(assets).where(
        _c.owner_user_id == bindparam("owner_user_id"),
        _c.upload_request_id == bindparam("upload_request_id"),
        _c.upload_request_id.is_not(None),
    )
)
_UPLOADING: ColumnElement[str] = literal_column(f"'{Status.UPLOADING.value}'")
# The writes of every PutAsset, the same way: one statement, one round trip, no
# transaction around it (a single statement is atomic by itself).
_NEW_ROW: dict[str, BindParameter[Any]] = {
    name: bindparam(name)
    for name in (
        "asset_id",
        "owner_user_id",
        "purpose",
        "content_type",
        "declared_size_bytes",
        "declared_sha256",
        "object_key",
        "created_at",
        "upload_expires_at",
        "idempotency_key",
        "upload_request_id",
    )
}
INSERT_UPLOADING = DriverStatement.of(insert(assets).values(status=_UPLOADING, **_NEW_ROW))
INSERT_KEYED = DriverStatement.of(
    pg_insert(assets)
    .values(status=_UPLOADING, **_NEW_ROW)
    .on_conflict_do_nothing(
        index_elements=[_c.owner_user_id, _c.idempotency_key],
        index_where=_c.idempotency_key.is_not(None),
    )
    .returning(*assets.c)
)
INSERT_REQUESTED = DriverStatement.of(
    pg_insert(assets)
    .values(status=_UPLOADING, **_NEW_ROW)
    .on_conflict_do_nothing(
        index_elements=[_c.owner_user_id, _c.upload_request_id],
        index_where=_c.upload_request_id.is_not(None),
    )
    .returning(*assets.c)
)
MARK_READY = DriverStatement.of(
    update(assets)
    .where(
        _c.asset_id == bindparam("asset_id"),
        _c.status == _UPLOADING,
        _c.rejected_uploads == bindparam("rejected_uploads"),
    )
    .values(
        status=literal_column(f"'{Status.READY.value}'"),
        size_bytes=bindparam("size_bytes"),
        sha256=bindparam("sha256"),
        width=bindparam("width"),
        height=bindparam("height"),
        ready_at=bindparam("ready_at"),
        thumbnail_content_type=bindparam("thumbnail_content_type"),
    )
    .returning(*assets.c)
)
# Thumbnails the backfill stored, recorded together (rides pk_assets): the pairs come as
# two arrays of the same length.
_MADE = (
    func.unnest(
        cast(bindparam("asset_ids"), ARRAY(UUID(as_uuid=True))),
        cast(bindparam("content_types"), ARRAY(Text)),
    )
    .table_valued("asset_id", "content_type")
    .render_derived(name="made")
)
RECORD_THUMBNAILS = DriverStatement.of(
    update(assets)
    .where(
        _c.asset_id == _MADE.c.asset_id,
        _c.status == literal_column(f"'{Status.READY.value}'"),
        _c.thumbnail_content_type.is_(None),
        _c.thumbnail_failure.is_(None),
    )
    .values(thumbnail_content_type=_MADE.c.content_type, thumbnail_claimed_at=null())
    .returning(_c.asset_id)
)
# What signing download URLs needs of many ready assets, in one statement (rides pk_assets).
READY_FOR_URLS = DriverStatement.of(
    select(
        _c.asset_id,
        _c.object_key,
        _c.content_type,
        _c.thumbnail_content_type,
        _c.width,
        _c.height,
        _c.size_bytes,
    ).where(
        _c.asset_id == func.any(bindparam("asset_ids")),
        _c.status == literal_column(f"'{Status.READY.value}'"),
    )
)


def _new_row(asset: Asset) -> dict[str, Any]:
    return {
        "asset_id": asset.asset_id,
        "owner_user_id": asset.owner_user_id,
        "purpose": asset.purpose.value,
        "content_type": asset.content_type,
        "declared_size_bytes": asset.declared_size_bytes,
        "declared_sha256": asset.declared_sha256,
        "object_key": asset.object_key,
        "created_at": asset.created_at,
        "upload_expires_at": asset.upload_expires_at,
        "idempotency_key": asset.idempotency_key,
        "upload_request_id": asset.upload_request_id,
    }


def _asset(row: Row[Any] | Any) -> Asset:
    """An asset from a SQLAlchemy row or an asyncpg record."""
    values = row._mapping if isinstance(row, Row) else row
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
        idempotency_key=values["idempotency_key"],
        thumbnail_content_type=values["thumbnail_content_type"],
        upload_request_id=values["upload_request_id"],
    )


@dataclass(frozen=True)
class Signable:
    """What signing a ready asset's download URLs needs."""

    asset_id: uuid.UUID
    object_key: str
    content_type: str
    thumbnail_content_type: str | None
    # The image's size, read from the stored object when it became ready.
    width: int = 0
    height: int = 0
    # The stored object's length.
    size_bytes: int = 0


@dataclass(frozen=True)
class ThumbnailWanted:
    """A ready output without a thumbnail, claimed by this replica for the backfill."""

    asset_id: uuid.UUID
    object_key: str
    content_type: str
    size_bytes: int


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

    @_database
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


@dataclass(frozen=True)
class Unpurged:
    asset_id: uuid.UUID
    object_key: str
    # No upload URL of the asset can add an object any more: removing it now is for good.
    settled: bool


class UnpurgedBatch:
    """Deleted assets whose objects may still exist, locked by this transaction."""

    def __init__(
        self, connection: AsyncConnection, unpurged: Sequence[Unpurged], now: datetime
    ) -> None:
        self._connection = connection
        self.assets = list(unpurged)
        self._now = now

    @_database
    async def mark_purged(self, asset_ids: Sequence[uuid.UUID]) -> None:
        """Their objects are gone for good: housekeeping stops watching them (pk_assets)."""
        if not asset_ids:
            return
        await self._connection.execute(
            update(assets)
            .where(_c.asset_id.in_(list(asset_ids)), _c.status == Status.DELETED.value)
            .values(object_purged_at=self._now)
        )


class AssetStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def _write(self, statement: DriverStatement, **values: Any) -> list[Any]:
        """One write statement in autocommit, run once: unlike a read it is not repeated
        on a fresh connection, since the first may have been applied."""
        async with driver_connection(self._engine) as connection:
            return list(await connection.fetch(statement.sql, *statement.args(**values)))

    @_database
    async def insert_uploading(self, asset: Asset) -> None:
        """A new asset waiting for its bytes (CreateUpload, and PutAsset before it stores)."""
        await self._write(INSERT_UPLOADING, **_new_row(asset))

    async def _insert_or_found(
        self, insert: DriverStatement, found: DriverStatement, asset: Asset, **key: Any
    ) -> Asset:
        """The new row, or the row its owner's key already made, unchanged."""
        rows = await self._write(insert, **_new_row(asset))
        if not rows:
            # The key is taken; its row is never removed (deleted assets keep their
            # keys), so it is there to read.
            rows = await driver_fetch(self._engine, found, owner_user_id=asset.owner_user_id, **key)
        return _asset(rows[0])

    @_database
    async def insert_keyed(self, asset: Asset) -> Asset:
        """A new uploading asset under its idempotency key, or the asset the key already
        made (whatever its status), unchanged (rides uq_assets_owner_idempotency_key)."""
        return await self._insert_or_found(
            INSERT_KEYED, ASSET_BY_IDEMPOTENCY_KEY, asset, idempotency_key=asset.idempotency_key
        )

    @_database
    async def keyed(self, owner_user_id: str, idempotency_key: str) -> Asset | None:
        """The asset the owner's key made, whatever its status (rides
        uq_assets_owner_idempotency_key)."""
        rows = await driver_fetch(
            self._engine,
            ASSET_BY_IDEMPOTENCY_KEY,
            owner_user_id=owner_user_id,
            idempotency_key=idempotency_key,
        )
        return _asset(rows[0]) if rows else None

    @_database
    async def insert_requested(self, asset: Asset) -> Asset:
        """A new upload under the client's request id, or the asset that request id
        already made (whatever its status), unchanged (rides
        uq_assets_owner_upload_request_id)."""
        return await self._insert_or_found(
            INSERT_REQUESTED,
            ASSET_BY_UPLOAD_REQUEST_ID,
            asset,
            upload_request_id=asset.upload_request_id,
        )

    @_database
    async def mark_keyed_deleted(
        self, owner_user_id: str, idempotency_keys: Sequence[str], now: datetime
    ) -> list[Asset]:
        """The owner's live assets under any of the keys → deleted; the ones this call
        changed (rides uq_assets_owner_idempotency_key)."""
        statement = (
            update(assets)
            .where(
                _c.owner_user_id == owner_user_id,
                _c.idempotency_key.in_(list(idempotency_keys)),
                _c.idempotency_key.is_not(None),
                _c.status != Status.DELETED.value,
            )
            .values(status=Status.DELETED.value, deleted_at=now)
            .returning(*assets.c)
        )
        async with self._engine.begin() as connection:
            rows = (await connection.execute(statement)).all()
        return [_asset(row) for row in rows]

    @_database
    async def get(self, asset_id: uuid.UUID) -> Asset | None:
        """Any asset by id (rides pk_assets)."""
        rows = await driver_fetch(self._engine, ASSET_BY_ID, asset_id=asset_id)
        return _asset(rows[0]) if rows else None

    @_database
    async def get_owned(self, asset_id: uuid.UUID, owner_user_id: str) -> Asset | None:
        """The asset if this user owns it; another user's asset is simply not found
        (rides pk_assets)."""
        rows = await driver_fetch(
            self._engine, OWNED_ASSET, asset_id=asset_id, owner_user_id=owner_user_id
        )
        return _asset(rows[0]) if rows else None

    @_database
    async def ready_for_urls(self, asset_ids: Sequence[uuid.UUID]) -> list[Signable]:
        """Those of the assets that are ready, with what signing their URLs needs; the
        others (unknown, uploading, deleted) are simply absent (rides pk_assets)."""
        rows = await driver_fetch(self._engine, READY_FOR_URLS, asset_ids=list(asset_ids))
        return [
            Signable(
                row["asset_id"],
                row["object_key"],
                row["content_type"],
                row["thumbnail_content_type"],
                row["width"] or 0,
                row["height"] or 0,
                row["size_bytes"] or 0,
            )
            for row in rows
        ]

    @_database
    async def mark_ready(
        self,
        asset_id: uuid.UUID,
        facts: ContentFacts,
        now: datetime,
        rejected_uploads: int,
        thumbnail_content_type: str | None = None,
    ) -> Asset | None:
        """uploading → ready with the measured facts (and the thumbnail stored beside the
        object, if any), if no upload was rejected since the caller read the asset. None
        when it was no longer uploading (completed by someone else, or removed) or a
        rejection came in between (rides pk_assets)."""
        rows = await self._write(
            MARK_READY,
            asset_id=asset_id,
            rejected_uploads=rejected_uploads,
            size_bytes=facts.size_bytes,
            sha256=facts.sha256,
            width=facts.width,
            height=facts.height,
            ready_at=now,
            thumbnail_content_type=thumbnail_content_type,
        )
        return _asset(rows[0]) if rows else None

    @_database
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

    @_database
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

    @_database
    async def status_by_key(self, object_key: str) -> Status | None:
        """The status of the asset an object key belongs to; None when no asset has it
        (rides uq_assets_object_key)."""
        rows = await driver_fetch(self._engine, STATUS_BY_KEY, object_key=object_key)
        return Status(rows[0]["status"]) if rows else None

    @_database
    async def statuses_by_key(self, object_keys: Sequence[str]) -> dict[str, Status]:
        """The statuses of the assets these object keys belong to, by key; a key no asset
        has is absent (rides uq_assets_object_key)."""
        rows = await driver_fetch(self._engine, STATUSES_BY_KEY, object_keys=list(object_keys))
        return {row["object_key"]: Status(row["status"]) for row in rows}

    @asynccontextmanager
    async def _locking(self) -> AsyncIterator[AsyncConnection]:
        """A transaction for a claimed batch. Failing to open or commit it is
        DatabaseFailed when the database did not answer (or the commit gave way); a
        failure of the caller's block passes unchanged (its storage calls are not the
        database's)."""
        in_block = False
        try:
            async with self._engine.begin() as connection:
                try:
                    yield connection
                except BaseException:
                    in_block = True
                    raise
        except Exception as error:
            outage = None if in_block else classify(error)
            if outage is None:
                raise
            raise DatabaseFailed(outage) from error

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
        async with self._locking() as connection:
            with database_failures(DatabaseFailed):
                rows = (await connection.execute(query)).all()
            yield ExpiredBatch(
                connection, [ExpiredUpload(row.asset_id, row.object_key) for row in rows], now
            )

    @asynccontextmanager
    async def claim_unpurged(
        self, after: uuid.UUID | None, limit: int, now: datetime, write_grace: timedelta
    ) -> AsyncIterator[UnpurgedBatch]:
        """Locks up to ``limit`` deleted assets whose object may still exist or (re)appear,
        in id order after ``after``, skipping rows another replica holds
        (rides ix_assets_unpurged)."""
        query = (
            select(_c.asset_id, _c.object_key, _c.upload_expires_at)
            .where(_c.status == Status.DELETED.value, _c.object_purged_at.is_(None))
            .order_by(_c.asset_id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        if after is not None:
            query = query.where(_c.asset_id > after)
        async with self._locking() as connection:
            with database_failures(DatabaseFailed):
                rows = (await connection.execute(query)).all()
            yield UnpurgedBatch(
                connection,
                [
                    Unpurged(
                        row.asset_id,
                        row.object_key,
                        # A PUT signed before the expiry may still be arriving after it.
                        settled=row.upload_expires_at is None
                        or row.upload_expires_at + write_grace <= now,
                    )
                    for row in rows
                ],
                now,
            )

    @_database
    async def claim_thumbnail_backlog(
        self, now: datetime, stale_before: datetime, limit: int
    ) -> list[ThumbnailWanted]:
        """Claims up to ``limit`` ready outputs with neither a thumbnail nor a failure that
        no replica claimed since ``stale_before``, by stamping them with ``now``: one
        statement, its row locks taken with SKIP LOCKED and released at once, so replicas
        take disjoint rows and no lock is held while the images are read and decoded
        (rides ix_assets_thumbnail_backlog)."""
        wanted = (
            select(_c.asset_id)
            .where(
                # Literals, not parameters: a generic plan still sees the index's predicate.
                _c.status == literal_column(f"'{Status.READY.value}'"),
                _c.purpose == literal_column(f"'{Purpose.AI_OUTPUT.value}'"),
                _c.thumbnail_content_type.is_(None),
                _c.thumbnail_failure.is_(None),
                or_(_c.thumbnail_claimed_at.is_(None), _c.thumbnail_claimed_at <= stale_before),
            )
            .order_by(_c.asset_id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        statement = (
            update(assets)
            .where(_c.asset_id.in_(wanted.scalar_subquery()))
            .values(thumbnail_claimed_at=now)
            .returning(_c.asset_id, _c.object_key, _c.content_type, _c.size_bytes)
        )
        async with self._engine.begin() as connection:
            rows = (await connection.execute(statement)).all()
        return sorted(
            (ThumbnailWanted(r.asset_id, r.object_key, r.content_type, r.size_bytes) for r in rows),
            key=lambda wanted: wanted.asset_id,
        )

    @_database
    async def record_thumbnails(self, made: Sequence[tuple[uuid.UUID, str]]) -> set[uuid.UUID]:
        """The backfill stored these thumbnails (asset id, content type): records each
        whose asset is still a ready output without one (not deleted meanwhile), in one
        autocommit statement. The ids recorded (pk_assets)."""
        if not made:
            return set()
        rows = await self._write(
            RECORD_THUMBNAILS,
            asset_ids=[asset_id for asset_id, _ in made],
            content_types=[content_type for _, content_type in made],
        )
        return {row[0] for row in rows}

    @_database
    async def mark_thumbnail_failed(self, asset_id: uuid.UUID, failure: str) -> None:
        """No thumbnail can be made of the asset's object (``failure`` says why): the
        backfill never takes it again (pk_assets)."""
        statement = (
            update(assets)
            .where(_c.asset_id == asset_id, _c.thumbnail_content_type.is_(None))
            .values(thumbnail_failure=failure, thumbnail_claimed_at=None)
        )
        async with self._engine.begin() as connection:
            await connection.execute(statement)

    @_database
    async def release_thumbnail_claims(
        self, asset_ids: Sequence[uuid.UUID], claimed_at: datetime
    ) -> None:
        """Hands back claims this replica could not work on (a dependency went down), so
        the next round may take them without waiting for them to go stale (pk_assets)."""
        if not asset_ids:
            return
        statement = (
            update(assets)
            .where(_c.asset_id.in_(list(asset_ids)), _c.thumbnail_claimed_at == claimed_at)
            .values(thumbnail_claimed_at=None)
        )
        async with self._engine.begin() as connection:
            await connection.execute(statement)
