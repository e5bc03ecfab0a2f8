"""media's store on real PostgreSQL: the CHECK constraints turn away every illegal asset
row, state changes are conditional, and expired uploads are claimed by one replica each."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.kit.db import asyncpg_url
from services.media.domain import Asset, ContentFacts, Purpose, Status, object_key
from services.media.store.assets import AssetStore
from tests.support.wire import watched_engine

HASH = "ab" * 32


@pytest.fixture
async def media_engine(media_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(media_url))
    yield engine
    await engine.dispose()


# -- CHECK constraints -------------------------------------------------------------------


def row(**changes: str) -> str:
    """An INSERT of a legal uploading asset, with some columns replaced (as SQL, where
    ``{id}`` stands for the row's asset id)."""
    asset_id = str(uuid.uuid4())
    purpose = changes.get("purpose", "'ai_input'").strip("'")
    values = {
        "asset_id": f"'{asset_id}'",
        "owner_user_id": "'alice'",
        "purpose": f"'{purpose}'",
        "status": "'uploading'",
        "content_type": "'image/png'",
        "declared_size_bytes": "10",
        "declared_sha256": "NULL",
        "size_bytes": "NULL",
        "sha256": "NULL",
        "width": "NULL",
        "height": "NULL",
        "object_key": f"'{purpose}/2026/11/{asset_id}'",
        "created_at": "now()",
        "upload_expires_at": "now() + interval '15 minutes'",
        "ready_at": "NULL",
        "deleted_at": "NULL",
    }
    values.update({name: sql.replace("{id}", asset_id) for name, sql in changes.items()})
    return f"INSERT INTO media.assets ({', '.join(values)}) VALUES ({', '.join(values.values())})"


READY = {
    "status": "'ready'",
    "size_bytes": "10",
    "sha256": f"'{HASH}'",
    "width": "4",
    "height": "3",
    "ready_at": "now()",
}


LEGAL = {
    "uploading": row(),
    "ready": row(**READY),
    "ready with a declared hash": row(**READY, declared_sha256=f"'{HASH}'"),
    "deleted after ready": row(**{**READY, "status": "'deleted'", "deleted_at": "now()"}),
    "deleted while uploading": row(status="'deleted'", deleted_at="now()"),
    "an output": row(purpose="'ai_output'", declared_size_bytes="NULL"),
}


@pytest.mark.parametrize("statement", list(LEGAL.values()), ids=list(LEGAL))
async def test_legal_rows_are_accepted(media_engine: AsyncEngine, statement: str) -> None:
    async with media_engine.begin() as connection:
        await connection.execute(text(statement))


ILLEGAL = {
    # what: (statement, the constraint that refuses it)
    "unknown purpose": (row(purpose="'thumbnail'"), "purpose_known"),
    "unknown status": (row(status="'lost'"), "status_known"),
    "unaccepted content type": (row(content_type="'image/gif'"), "content_type_known"),
    "no owner": (row(owner_user_id="''"), "owner_present"),
    "key of another asset": (row(object_key=f"'ai_input/2026/11/{uuid.uuid4()}'"), "key_from_ids"),
    "key with a user path": (row(object_key="'ai_input/2026/11/../../etc/passwd'"), "key_from_ids"),
    "key of another purpose": (row(object_key="'ai_output/2026/11/{id}'"), "key_from_ids"),
    "ready without facts": (row(status="'ready'", ready_at="now()"), "facts_together"),
    "ready without a hash": (row(**{**READY, "sha256": "NULL"}), "facts_together"),
    "ready without a size": (row(**{**READY, "size_bytes": "NULL"}), "facts_together"),
    "ready without ready time": (row(**{**READY, "ready_at": "NULL"}), "facts_together"),
    "ready with nothing measured": (row(status="'ready'"), "ready_has_facts"),
    "uploading with facts": (
        row(**{**READY, "status": "'uploading'"}),
        "uploading_has_expiry_and_no_facts",
    ),
    "uploading without expiry": (
        row(upload_expires_at="NULL"),
        "uploading_has_expiry_and_no_facts",
    ),
    "deleted without time": (row(status="'deleted'"), "deleted_iff_deleted_at"),
    "live with deleted time": (row(deleted_at="now()"), "deleted_iff_deleted_at"),
    "ready with another size": (
        row(**{**READY, "size_bytes": "11"}),
        "ready_matches_declaration",
    ),
    "ready with another hash": (
        row(**READY, declared_sha256=f"'{'cd' * 32}'"),
        "ready_matches_declaration",
    ),
    "hash not hex": (row(**{**READY, "sha256": "'not-a-hash'"}), "sha256_hex"),
    "declared hash not hex": (row(declared_sha256="'ABAB'"), "declared_sha256_hex"),
    "zero declared size": (row(declared_size_bytes="0"), "declared_size_positive"),
    "zero width": (row(**{**READY, "width": "0"}), "dimensions_positive"),
    "negative rejections": (row(rejected_uploads="-1"), "rejections_counted"),
}


@pytest.mark.parametrize(("statement", "constraint"), list(ILLEGAL.values()), ids=list(ILLEGAL))
async def test_database_rejects_an_illegal_asset_row(
    media_engine: AsyncEngine, statement: str, constraint: str
) -> None:
    with pytest.raises(sqlalchemy.exc.IntegrityError) as caught:
        async with media_engine.begin() as connection:
            await connection.execute(text(statement))
    assert f'"ck_assets_{constraint}"' in str(caught.value)


# -- statements ---------------------------------------------------------------------------


def new_upload(owner: str = "alice", expires_in: float = 900, now: datetime | None = None) -> Asset:
    created = now or datetime.now(UTC)
    asset_id = uuid.uuid4()
    return Asset(
        asset_id=asset_id,
        owner_user_id=owner,
        purpose=Purpose.AI_INPUT,
        status=Status.UPLOADING,
        content_type="image/png",
        declared_size_bytes=10,
        declared_sha256=None,
        size_bytes=None,
        sha256=None,
        width=None,
        height=None,
        rejected_uploads=0,
        object_key=object_key(Purpose.AI_INPUT, asset_id, created),
        created_at=created,
        upload_expires_at=created + timedelta(seconds=expires_in),
        ready_at=None,
        deleted_at=None,
    )


FACTS = ContentFacts(size_bytes=10, sha256=HASH, width=4, height=3)


async def test_an_asset_reads_back_as_written(media_engine: AsyncEngine) -> None:
    store = AssetStore(media_engine)
    asset = new_upload()
    await store.insert_uploading(asset)
    assert await store.get(asset.asset_id) == asset
    assert await store.get_owned(asset.asset_id, "alice") == asset
    assert await store.get_owned(asset.asset_id, "mallory") is None
    assert await store.get(uuid.uuid4()) is None


async def test_of_two_racing_completions_exactly_one_wins(media_engine: AsyncEngine) -> None:
    store = AssetStore(media_engine)
    asset = new_upload()
    await store.insert_uploading(asset)
    now = datetime.now(UTC)
    results = await asyncio.gather(
        *(store.mark_ready(asset.asset_id, FACTS, now, 0) for _ in range(2))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert winners[0].status == Status.READY and winners[0].sha256 == HASH
    assert winners[0].ready_at == now


async def test_only_a_check_of_the_current_upload_rejects_or_completes(
    media_engine: AsyncEngine,
) -> None:
    store = AssetStore(media_engine)
    asset = new_upload()
    await store.insert_uploading(asset)
    now = datetime.now(UTC)
    # Two checks read the asset (0 rejections so far); the first rejects the bytes.
    assert await store.reject_upload(asset.asset_id, 0) is True
    # The second read the same, now stale, state: it may neither delete nor complete.
    assert await store.reject_upload(asset.asset_id, 0) is False
    assert await store.mark_ready(asset.asset_id, FACTS, now, 0) is None
    # A check of the new upload can.
    ready = await store.mark_ready(asset.asset_id, FACTS, now, 1)
    assert ready is not None and ready.rejected_uploads == 1
    assert await store.reject_upload(asset.asset_id, 1) is False


async def test_deleting_is_idempotent_and_keeps_the_first_time(media_engine: AsyncEngine) -> None:
    store = AssetStore(media_engine)
    asset = new_upload()
    await store.insert_uploading(asset)
    first = datetime.now(UTC)
    deleted = await store.mark_deleted(asset.asset_id, first)
    again = await store.mark_deleted(asset.asset_id, first + timedelta(minutes=5))
    assert deleted is not None and again is not None
    assert deleted.status == again.status == Status.DELETED
    assert again.deleted_at == first
    assert await store.mark_ready(asset.asset_id, FACTS, first, 0) is None
    assert await store.mark_deleted(uuid.uuid4(), first) is None


async def test_replicas_claim_disjoint_batches_of_expired_uploads(
    media_engine: AsyncEngine,
) -> None:
    store = AssetStore(media_engine)
    # Created "in the future" so no other housekeeper sharing the server could see them.
    future = datetime.now(UTC) + timedelta(days=365)
    expired = [new_upload(expires_in=60, now=future) for _ in range(5)]
    alive = new_upload(expires_in=3600, now=future)
    for asset in [*expired, alive]:
        await store.insert_uploading(asset)
    sweep_time = future + timedelta(minutes=10)

    async with store.claim_expired_uploads(sweep_time, limit=2) as first:
        # While the first replica holds its batch, the second gets only the rest.
        async with store.claim_expired_uploads(sweep_time, limit=10) as second:
            await second.mark_deleted()
        await first.mark_deleted()

    first_ids = {u.asset_id for u in first.uploads}
    second_ids = {u.asset_id for u in second.uploads}
    mine = {a.asset_id for a in expired}
    assert len(first_ids) == 2
    assert not first_ids & second_ids
    assert mine <= first_ids | second_ids
    assert alive.asset_id not in first_ids | second_ids
    for asset in expired:
        found = await store.get(asset.asset_id)
        assert found is not None and found.status == Status.DELETED
        assert found.deleted_at == sweep_time
    still = await store.get(alive.asset_id)
    assert still is not None and still.status == Status.UPLOADING


async def test_hot_reads_are_one_statement_without_a_transaction(media_url: str) -> None:
    # GetAssetInfo and the object listener's status check, as the kit's engine sends them.
    async with watched_engine(media_url) as (engine, wire):
        store = AssetStore(engine)
        asset = new_upload()
        await store.insert_uploading(asset)
        for read in (
            store.get(asset.asset_id),
            store.get_owned(asset.asset_id, "alice"),
            store.status_by_key(asset.object_key),
        ):
            # The insert runs on the driver too: its log arrives a loop turn later.
            await wire.caught_up()
            wire.clear()
            assert await read is not None
            await wire.caught_up()
            assert (len(wire.statements), wire.commands) == (1, [])


async def test_put_writes_are_one_statement_each_without_a_transaction(media_url: str) -> None:
    # PutAsset's writes: insert (keyed or not), then mark ready, each its own round trip.
    async with watched_engine(media_url) as (engine, wire):
        store = AssetStore(engine)

        async def sent(write: Any) -> tuple[Any, int, list[str]]:
            await wire.caught_up()
            wire.clear()
            result = await write
            await wire.caught_up()
            return result, len(wire.statements), wire.commands

        plain = new_upload()
        assert (await sent(store.insert_uploading(plain)))[1:] == (1, [])
        keyed = replace(
            new_upload(),
            declared_size_bytes=None,
            declared_sha256=HASH,
            idempotency_key=f"test:{uuid.uuid4()}",
        )
        made, statements, commands = await sent(store.insert_keyed(keyed))
        assert (made.asset_id, statements, commands) == (keyed.asset_id, 1, [])
        # A repeat under the key finds the first asset (one more read, still no transaction).
        repeat = replace(
            new_upload(),
            declared_size_bytes=None,
            declared_sha256=HASH,
            idempotency_key=keyed.idempotency_key,
        )
        found, statements, commands = await sent(store.insert_keyed(repeat))
        assert (found.asset_id, statements, commands) == (keyed.asset_id, 2, [])
        facts = ContentFacts(size_bytes=10, sha256=HASH, width=4, height=3)
        ready, statements, commands = await sent(
            store.mark_ready(keyed.asset_id, facts, datetime.now(UTC), 0)
        )
        assert (ready.status, ready.sha256, statements, commands) == (Status.READY, HASH, 1, [])
        # Only once: a second completion changes nothing.
        assert (await sent(store.mark_ready(keyed.asset_id, facts, datetime.now(UTC), 0)))[
            0
        ] is None
        stored = await store.get(plain.asset_id)
        assert stored is not None and stored.status == Status.UPLOADING
