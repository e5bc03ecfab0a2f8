"""Money visible, through creation's real listeners and PostgreSQL: GetBalance says what
is reserved and what the submit's quotas have left (the same counts the submit refuses
by), and ListLedgerEntries pages a user's own entries, newest first by the order they
were made in (their sequence), whatever their timestamps say."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc, ledger_pb2
from services.creation.errors import DailyQuotaExceeded
from services.creation.store import jobs as store
from services.creation.store import leases, ledger
from services.creation.store.fenced import FencedWrite, outputs_value
from services.creation.store.jobs import SubmitLimits
from services.kit.pagination import Integer, KeysetCodec, Timestamp
from tests.integration.creation.helpers import (
    T0,
    CreationHarness,
    command,
    new_user,
    running_creation,
    user_token,
)
from tests.support.fenced import fenced_write
from tests.support.rpc import bad_request, error_info

# The service's own limits (settings), and the store's submits made with the same ones.
LIMITS = SubmitLimits(daily_quota=4, in_flight_limit=3, max_attempts=3, welcome_points=100)
ASSET = "7b0c4e8e-5d6f-4a51-9d1e-0c7f3e2b1a90"
KIND = ledger_pb2.LedgerEntryKind


@pytest.fixture(scope="module")
async def creation(creation_url: str) -> AsyncIterator[CreationHarness]:
    async with running_creation(creation_url, DAILY_QUOTA="4", IN_FLIGHT_LIMIT="3") as harness:
        yield harness


@pytest.fixture
async def stub(
    creation: CreationHarness,
) -> AsyncIterator[creation_service_pb2_grpc.CreationServiceStub]:
    async with creation.public_channel() as channel:
        yield creation_service_pb2_grpc.CreationServiceStub(channel)


async def balance_of(
    stub: creation_service_pb2_grpc.CreationServiceStub, user: str
) -> creation_service_pb2.GetBalanceResponse:
    return await stub.GetBalance(
        creation_service_pb2.GetBalanceRequest(), metadata=user_token(user)
    )


async def test_the_balance_follows_reserve_capture_and_release_and_the_quotas(
    engine: AsyncEngine, stub: creation_service_pb2_grpc.CreationServiceStub
) -> None:
    user = new_user()
    fresh = await balance_of(stub, user)
    assert (fresh.available_points, fresh.reserved_points) == (100, 0)
    assert (fresh.daily_job_quota, fresh.daily_jobs_remaining) == (4, 4)
    assert (fresh.in_flight_limit, fresh.in_flight_remaining) == (3, 3)
    assert fresh.daily_quota_reset_time.ToDatetime() == (T0 + timedelta(hours=12)).replace(
        tzinfo=None
    )
    # Submitted at one instant, they are claimed in job id order: the first is captured.
    submitted = [(await store.submit(engine, user, command(), LIMITS, T0)).job for _ in range(3)]
    captured, released, _held = sorted(submitted, key=lambda job: job.job_id)
    reserved = await balance_of(stub, user)
    assert (reserved.available_points, reserved.reserved_points) == (85, 15)
    assert (reserved.daily_jobs_remaining, reserved.in_flight_remaining) == (1, 0)

    [claimed] = await leases.claim(engine, "w1", 1, timedelta(seconds=30), T0)
    assert claimed.job_id == captured.job_id
    await fenced_write(
        engine,
        FencedWrite.COMPLETE,
        claimed.job_id,
        claimed.lease_epoch,
        T0,
        outputs_value([ASSET]),
    )
    await stub.CancelJob(
        creation_service_pb2.CancelJobRequest(job_id=released.job_id), metadata=user_token(user)
    )
    after = await balance_of(stub, user)
    # 5 spent, 5 back, 5 still held; a finished job still counts against the day, a
    # cancelled one gives its slot back.
    assert (after.available_points, after.reserved_points) == (90, 5)
    assert (after.daily_jobs_remaining, after.in_flight_remaining) == (2, 2)

    for _ in range(2):
        await store.submit(engine, user, command(), LIMITS, T0)
    spent = await balance_of(stub, user)
    assert spent.daily_jobs_remaining == 0
    # Zero left is exactly when the submit refuses.
    with pytest.raises(DailyQuotaExceeded):
        await store.submit(engine, user, command(), LIMITS, T0)

    entries = await stub.ListLedgerEntries(
        creation_service_pb2.ListLedgerEntriesRequest(page_size=100), metadata=user_token(user)
    )
    assert [(e.kind, e.amount, e.job_id, e.reason) for e in reversed(entries.ledger_entries)][
        :6
    ] == [
        (KIND.LEDGER_ENTRY_KIND_GRANT, 100, "", "welcome"),
        *((KIND.LEDGER_ENTRY_KIND_RESERVE, 5, job.job_id, "submitted") for job in submitted),
        (KIND.LEDGER_ENTRY_KIND_CAPTURE, 5, captured.job_id, "completed"),
        (KIND.LEDGER_ENTRY_KIND_RELEASE, 5, released.job_id, "cancel"),
    ]


async def test_ledger_pages_are_newest_first_and_each_users_own(
    engine: AsyncEngine, stub: creation_service_pb2_grpc.CreationServiceStub
) -> None:
    mine, theirs = new_user(), new_user()
    made = [
        (await store.submit(engine, mine, command(), LIMITS, T0 + timedelta(seconds=n))).job
        for n in range(3)
    ]
    await store.submit(engine, theirs, command(), LIMITS, T0)
    seen: list[ledger_pb2.LedgerEntry] = []
    token = ""
    for _ in range(3):
        page = await stub.ListLedgerEntries(
            creation_service_pb2.ListLedgerEntriesRequest(page_size=2, page_token=token),
            metadata=user_token(mine),
        )
        seen.extend(page.ledger_entries)
        token = page.next_page_token
        if not token:
            break
    assert not token
    # Three reserves, newest first, and the welcome grant (made with the first), and none
    # of the other user's.
    assert [e.job_id for e in seen if e.job_id] == [j.job_id for j in reversed(made)]
    assert [e.kind for e in seen].count(KIND.LEDGER_ENTRY_KIND_GRANT) == 1
    assert len({e.entry_id for e in seen}) == 4
    times = [e.create_time.ToDatetime() for e in seen]
    assert times == sorted(times, reverse=True)

    # A token is the caller's: another user cannot page with it.
    first = await stub.ListLedgerEntries(
        creation_service_pb2.ListLedgerEntriesRequest(page_size=1), metadata=user_token(mine)
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListLedgerEntries(
            creation_service_pb2.ListLedgerEntriesRequest(page_token=first.next_page_token),
            metadata=user_token(theirs),
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_PAGE_TOKEN"
    violations = bad_request(caught.value)
    assert violations is not None and violations.field_violations[0].field == "page_token"


async def list_all(
    stub: creation_service_pb2_grpc.CreationServiceStub, user: str, page_size: int
) -> list[ledger_pb2.LedgerEntry]:
    """Every entry of ``user``, page by page."""
    seen: list[ledger_pb2.LedgerEntry] = []
    token = ""
    while True:
        page = await stub.ListLedgerEntries(
            creation_service_pb2.ListLedgerEntriesRequest(page_size=page_size, page_token=token),
            metadata=user_token(user),
        )
        seen.extend(page.ledger_entries)
        token = page.next_page_token
        if not token:
            return seen


async def test_a_first_submits_welcome_grant_is_older_than_the_reserve_it_paid_for(
    engine: AsyncEngine, stub: creation_service_pb2_grpc.CreationServiceStub
) -> None:
    """The first submit grants the welcome points and reserves the price in one statement,
    at one timestamp: the grant came first, so it is listed as the older entry."""
    user = new_user()
    job = (await store.submit(engine, user, command(), LIMITS, T0)).job
    entries = await list_all(stub, user, 100)
    assert [(e.kind, e.job_id) for e in entries] == [
        (KIND.LEDGER_ENTRY_KIND_RESERVE, job.job_id),
        (KIND.LEDGER_ENTRY_KIND_GRANT, ""),
    ]
    assert entries[0].create_time == entries[1].create_time
    assert entries[0].entry_id > entries[1].entry_id


async def test_ledger_pages_follow_the_entries_sequence_not_their_clocks(
    engine: AsyncEngine, stub: creation_service_pb2_grpc.CreationServiceStub
) -> None:
    """Entries are made by processes with their own clocks, so a later entry can carry an
    earlier time: the list is newest first by sequence (entry_id), one total order, and
    its pages, one entry each, neither repeat nor skip one."""
    user = new_user()
    clocks = [T0 + timedelta(seconds=30), T0, T0 + timedelta(seconds=10), T0]
    for n, now in enumerate(clocks):
        await ledger.grant_points(engine, user, 1 + n, f"op:{n}", "promo", 0, now)
    entries = await list_all(stub, user, 1)
    assert [e.amount for e in entries] == [4, 3, 2, 1]
    ids = [e.entry_id for e in entries]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 4

    # A token of the earlier (create_time, entry_id) order positions nothing: refused.
    earlier = KeysetCodec(
        "ledgerEntries", OldCursor, created_at=Timestamp(), entry_id=Integer()
    ).encode(OldCursor(T0, ids[1]), user)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListLedgerEntries(
            creation_service_pb2.ListLedgerEntriesRequest(page_token=earlier),
            metadata=user_token(user),
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_PAGE_TOKEN"


@dataclass(frozen=True)
class OldCursor:
    created_at: datetime
    entry_id: int
