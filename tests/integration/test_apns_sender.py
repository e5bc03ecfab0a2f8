"""The sender against the real HTTP/2 APNs peer and real PostgreSQL (rows written straight
into the push tables of migration 0003)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.dev.apns_peer import ApnsPeer, ensure_dev_key
from services.dev.processes import free_port
from services.kit.db import asyncpg_url
from services.notify.apns.assemble import build_sender
from services.notify.apns.client import apns_id_for
from services.notify.apns.sender import BAD_DEVICE_TOKENS, Sender
from services.notify.apns.settings import ApnsSettings
from services.notify.store import PushStore
from tests.support.apns_peer import (
    BUNDLE_ID,
    KEY_ID,
    TEAM_ID,
    attempts_of,
    end_lease,
    insert_push,
    insert_token,
    live_activity_update,
    push_row,
    running_peer,
    settings_for,
    shared_clock,
    token_row,
)
from tests.support.databases import migrated_database
from tests.support.push_tables import empty_push_tables

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def notify_url(postgres_admin_url: str) -> Iterator[str]:
    with migrated_database(postgres_admin_url, "notify") as url:
        yield url


@pytest.fixture
async def engine(notify_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(notify_url))
    await empty_push_tables(engine)
    yield engine
    await engine.dispose()


@pytest.fixture
async def peer_and_key(tmp_path: Path) -> AsyncIterator[tuple[ApnsPeer, Path]]:
    async with running_peer(tmp_path) as running:
        yield running


@pytest.fixture
async def peer(peer_and_key: tuple[ApnsPeer, Path]) -> ApnsPeer:
    return peer_and_key[0]


@pytest.fixture
async def sender(peer_and_key: tuple[ApnsPeer, Path], engine: AsyncEngine) -> AsyncIterator[Sender]:
    peer, key_path = peer_and_key
    built, close = build_sender(settings_for(peer, key_path), engine)
    yield built
    await close()


async def test_an_accepted_push_is_sent_once_with_its_derived_apns_id(
    engine: AsyncEngine, peer: ApnsPeer, sender: Sender
) -> None:
    token_id, token = await insert_token(engine)
    push_id = await insert_push(engine, token_id)

    assert await sender.send_due() == 1

    received = peer.received_by(token)
    assert len(received) == 1
    assert received[0].apns_id == apns_id_for(push_id)
    assert received[0].headers["apns-topic"] == "com.example.atelier"
    row = await push_row(engine, push_id)
    assert (row["status"], row["apns_id"], row["last_http_status"]) == (
        "sent",
        apns_id_for(push_id),
        200,
    )
    assert row["sent_at"] is not None
    attempts = await attempts_of(engine, push_id)
    assert [(a["attempt"], a["http_status"], a["apns_id"]) for a in attempts] == [
        (1, 200, apns_id_for(push_id))
    ]
    # Sent as of the claim that took it, before its request (not when its outcome was
    # recorded): an activity's next update is throttled from here.
    assert row["sent_at"] <= attempts[0]["at"]
    assert await sender.send_due() == 0


async def test_a_live_activity_update_goes_to_the_liveactivity_topic(
    engine: AsyncEngine, peer: ApnsPeer, sender: Sender
) -> None:
    token_id, token = await insert_token(engine, kind="activity")
    push_id = await insert_push(engine, token_id, live_activity_update(0.5), kind="la_update")

    await sender.send_due()

    assert (await push_row(engine, push_id))["status"] == "sent"
    [received] = peer.received_by(token)
    assert received.headers["apns-push-type"] == "liveactivity"
    assert received.payload["aps"]["content-state"] == {"p": 0.5}


async def test_unregistered_retires_the_token_and_drops_its_later_pushes(
    engine: AsyncEngine, peer: ApnsPeer, sender: Sender
) -> None:
    token_id, token = await insert_token(
        engine, registered_at=datetime.now(UTC) - timedelta(days=1)
    )
    peer.fail(token, 410, "Unregistered", times=None, timestamp=datetime.now(UTC))
    first = await insert_push(engine, token_id, version=1)

    await sender.send_due()

    row = await push_row(engine, first)
    assert (row["status"], row["last_http_status"], row["last_reason"]) == (
        "dropped",
        410,
        "Unregistered",
    )
    token_state = await token_row(engine, token_id)
    assert (token_state["status"], token_state["status_reason"]) == ("retired", "Unregistered")
    later = await insert_push(engine, token_id, version=2)
    exchanges_before = len(peer.state.answers)

    await sender.send_due()

    assert (await push_row(engine, later))["status"] == "dropped"
    assert len(peer.state.answers) == exchanges_before  # nothing more went to Apple


async def test_unregistered_keeps_a_token_registered_again_after_apples_timestamp(
    engine: AsyncEngine, peer: ApnsPeer, sender: Sender
) -> None:
    token_id, token = await insert_token(engine, registered_at=datetime.now(UTC))
    peer.fail(token, 410, "Unregistered", timestamp=datetime.now(UTC) - timedelta(hours=1))
    push_id = await insert_push(engine, token_id)

    await sender.send_due()

    assert (await push_row(engine, push_id))["status"] == "dropped"
    assert (await token_row(engine, token_id))["status"] == "active"


async def test_bad_device_token_on_a_production_token_is_reported_as_environment_mismatch(
    engine: AsyncEngine, peer: ApnsPeer, sender: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    token_id, token = await insert_token(engine, environment="production")
    peer.fail(token, 400, "BadDeviceToken")
    push_id = await insert_push(engine, token_id)
    metric = BAD_DEVICE_TOKENS.labels("production", "environment_mismatch")
    before = metric._value.get()

    with caplog.at_level(logging.WARNING):
        await sender.send_due()

    assert (await push_row(engine, push_id))["status"] == "dropped"
    token_state = await token_row(engine, token_id)
    assert (token_state["status"], token_state["status_reason"]) == ("bad", "BadDeviceToken")
    assert metric._value.get() == before + 1
    [record] = [r for r in caplog.records if "apns_bad_device_token" in r.getMessage()]
    logged = record.getMessage() + repr(getattr(record, "fields", ""))
    assert "environment_mismatch" in logged
    assert "production" in logged
    assert token not in caplog.text  # the whole device token is never logged


async def test_expired_provider_token_is_refreshed_and_the_push_retried_once(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    peer, key_path = peer_and_key
    clock = shared_clock(peer)
    sender, close = build_sender(settings_for(peer, key_path), engine, clock)
    token_id, token = await insert_token(engine)
    await insert_push(engine, token_id, version=1)
    await sender.send_due()
    first_jwt = peer.received_by(token)[0].provider_token
    clock.advance(25 * 60)  # old enough to replace (APNs: at most every 20 minutes)
    peer.expire_provider_tokens()
    push_id = await insert_push(engine, token_id, version=2)

    try:
        await sender.send_due()
    finally:
        await close()

    row = await push_row(engine, push_id)
    assert (row["status"], row["attempts"]) == ("sent", 1)
    assert [(a["http_status"], a["reason"]) for a in await attempts_of(engine, push_id)] == [
        (403, "ExpiredProviderToken"),
        (200, ""),
    ]
    second_jwt = peer.received_by(token)[1].provider_token
    assert second_jwt != first_jwt
    assert "apns_provider_token_expired" in caplog.text
    for secret in (first_jwt, second_jwt, token):
        assert secret not in caplog.text


@pytest.mark.parametrize(
    ("status", "reason"), [(429, "TooManyRequests"), (500, "InternalServerError")]
)
async def test_throttled_or_failing_apple_is_retried_with_backoff_until_accepted(
    engine: AsyncEngine, peer: ApnsPeer, sender: Sender, status: int, reason: str
) -> None:
    token_id, token = await insert_token(engine)
    peer.fail(token, status, reason, times=2)
    push_id = await insert_push(engine, token_id)

    await sender.send_due()
    row = await push_row(engine, push_id)
    assert (row["status"], row["last_http_status"]) == ("pending", status)
    [exchange] = await attempts_of(engine, push_id)
    # Backed off by at least half the base delay (0.05 s, jittered), not immediately due.
    assert row["next_attempt_at"] - exchange["at"] >= timedelta(seconds=0.025)
    for _ in range(2):
        await end_lease(engine, push_id)  # the backoff's time passes
        assert await sender.send_due() == 1

    row = await push_row(engine, push_id)
    assert (row["status"], row["attempts"]) == ("sent", 3)
    assert [a["http_status"] for a in await attempts_of(engine, push_id)] == [status, status, 200]
    assert len(peer.received_by(token)) == 1


async def test_retries_stop_at_max_attempts_as_failed(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path]
) -> None:
    peer, key_path = peer_and_key
    sender, close = build_sender(settings_for(peer, key_path, max_attempts=2), engine)
    token_id, token = await insert_token(engine)
    peer.fail(token, 503, "ServiceUnavailable", times=None)
    push_id = await insert_push(engine, token_id)
    try:
        assert await sender.send_due() == 1
        await end_lease(engine, push_id)
        assert await sender.send_due() == 1
        await end_lease(engine, push_id)
        assert await sender.send_due() == 0  # failed: never claimed again
    finally:
        await close()

    row = await push_row(engine, push_id)
    assert (row["status"], row["attempts"], row["last_http_status"]) == ("failed", 2, 503)


async def test_two_senders_never_send_one_push_twice(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path]
) -> None:
    peer, key_path = peer_and_key
    token_id, _ = await insert_token(engine)
    push_ids = [await insert_push(engine, token_id, version=v) for v in range(300)]
    settings = settings_for(peer, key_path, batch_size=20)
    first, close_first = build_sender(settings, engine)
    second, close_second = build_sender(settings, engine)
    tasks = [asyncio.create_task(s.run()) for s in (first, second)]
    try:
        await peer.wait_for(lambda: len(peer.state.received) >= len(push_ids), seconds=30)
    finally:
        for s in (first, second):
            await s.stop(0)
        await asyncio.gather(*tasks)
        await close_first()
        await close_second()

    sent_ids = [r.apns_id for r in peer.state.received]
    assert len(sent_ids) == len(set(sent_ids)) == len(push_ids)
    assert set(sent_ids) == {apns_id_for(p) for p in push_ids}
    jwts = {r.provider_token for r in peer.state.received}
    assert len(jwts) == 2  # one JWT per sender, reused for all its pushes


async def test_a_payload_over_apples_limit_is_failed_without_sending(
    engine: AsyncEngine, peer: ApnsPeer, sender: Sender
) -> None:
    token_id, _ = await insert_token(engine)
    headers, payload = live_activity_update(0.1)
    payload["aps"]["content-state"] = {"blob": "x" * 5000}
    push_id = await insert_push(engine, token_id, (headers, payload), kind="la_update")

    await sender.send_due()

    row = await push_row(engine, push_id)
    assert (row["status"], row["last_reason"]) == ("failed", "PayloadTooLarge")
    assert peer.state.answers == []


async def test_an_unreachable_apple_is_retried_later_with_no_status_recorded(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path]
) -> None:
    peer, key_path = peer_and_key
    closed = f"https://127.0.0.1:{free_port()}"
    sender, close = build_sender(
        settings_for(peer, key_path, production_url=closed, sandbox_url=closed), engine
    )
    token_id, _ = await insert_token(engine)
    push_id = await insert_push(engine, token_id)
    try:
        await sender.send_due()
    finally:
        await close()

    row = await push_row(engine, push_id)
    assert (row["status"], row["last_http_status"], row["last_reason"]) == (
        "pending",
        None,
        "ConnectionLost",
    )
    [exchange] = await attempts_of(engine, push_id)
    assert (exchange["http_status"], exchange["reason"]) == (None, "ConnectionLost")


async def test_a_push_claimed_by_a_sender_that_died_is_resent_once_after_the_lease(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path]
) -> None:
    peer, key_path = peer_and_key
    settings = settings_for(peer, key_path)
    sender, close = build_sender(settings, engine)
    token_id, token = await insert_token(engine)
    push_id = await insert_push(engine, token_id)
    # A sender claims the push (and, say, sends it), then dies before recording anything.
    [claimed] = await PushStore(engine).claim(10, settings.lease_seconds)
    try:
        assert await sender.send_due() == 0  # leased: nobody else takes it meanwhile
        await end_lease(engine, push_id)
        assert await sender.send_due() == 1
    finally:
        await close()

    row = await push_row(engine, push_id)
    assert (row["status"], row["attempts"]) == ("sent", 2)
    [received] = peer.received_by(token)
    # The resend carries the push's one apns-id, so Apple and our logs can tell.
    assert received.apns_id == apns_id_for(claimed.push_id)


async def test_a_dropped_connection_is_reopened_for_the_next_push(
    engine: AsyncEngine, peer: ApnsPeer, sender: Sender
) -> None:
    token_id, token = await insert_token(engine)
    await insert_push(engine, token_id, version=1)
    await sender.send_due()
    for transport in list(peer.connections):
        transport.close()
    later = await insert_push(engine, token_id, version=2)

    await sender.send_due()
    if len(peer.received_by(token)) < 2:
        # The close raced the send: that one round failed and is retried on a new connection.
        await end_lease(engine, later)
        await sender.send_due()

    assert len(peer.received_by(token)) == 2


@pytest.fixture
def peer_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, str], Path]]:
    """The peer as a process of its own (so it can be stopped), its address, the key."""
    key_path, public = ensure_dev_key(tmp_path / "key")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.dev.apns_peer",
            "--public-key",
            str(public),
            "--key-id",
            KEY_ID,
            "--team-id",
            TEAM_ID,
            "--bundle-id",
            BUNDLE_ID,
            "--state-dir",
            str(tmp_path / "peer"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        yield process, json.loads(process.stdout.readline()), key_path
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        process.wait(10)


async def test_a_frozen_apns_peer_costs_one_request_timeout_and_the_push_goes_after_it_thaws(
    engine: AsyncEngine, peer_process: tuple[subprocess.Popen[str], dict[str, str], Path]
) -> None:
    """The peer as a process of its own, stopped (SIGSTOP) while a push is due: the round
    ends within the request deadline, the push stays pending for a retry, and once the
    peer runs again the push is sent, with no restart of the sender."""
    process, ready, key_path = peer_process
    settings = ApnsSettings(
        enabled=True,
        key_path=str(key_path),
        key_id=KEY_ID,
        team_id=TEAM_ID,
        bundle_id=BUNDLE_ID,
        production_url=ready["url"],
        sandbox_url=ready["url"],
        ca_file=ready["ca_file"],
        lease_seconds=30,
        request_timeout_seconds=1,
        backoff_base_seconds=0.05,
        backoff_max_seconds=0.05,
        poll_seconds=0.05,
    )
    sender, close = build_sender(settings, engine)
    try:
        token_id, _ = await insert_token(engine)
        warm = await insert_push(engine, token_id)
        assert await sender.send_due() == 1  # connection open, provider token minted
        assert (await push_row(engine, warm))["status"] == "sent"

        process.send_signal(signal.SIGSTOP)
        push_id = await insert_push(engine, token_id, version=2)
        started = time.monotonic()
        await asyncio.wait_for(sender.send_due(), 10)  # a hang fails here
        assert time.monotonic() - started < 5  # the request deadline (1 s), not a hang
        frozen = await push_row(engine, push_id)
        assert (frozen["status"], frozen["last_http_status"]) == ("pending", None)

        process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 15
        while (await push_row(engine, push_id))["status"] == "pending":
            assert time.monotonic() < deadline, "the push never went after the thaw"
            await sender.send_due()
            await asyncio.sleep(0.05)  # the backoff is a time in the row, not an event
        assert (await push_row(engine, push_id))["status"] == "sent"
    finally:
        await close()
