"""The sender when APNs refuses its credentials, against the real HTTP/2 APNs peer and real
PostgreSQL: a refused token refresh (429 TooManyProviderTokenUpdates) recovers on fresh
connections to both hosts, a token is never replaced more often than every 20 minutes,
and a configuration error (403 InvalidProviderToken) holds pushes (bounded) with an alert
log line and a gauge until the credentials are fixed."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.dev.apns_peer import ApnsPeer
from services.kit.db import asyncpg_url
from services.notify.apns.assemble import build_sender
from services.notify.apns.sender import CREDENTIALS_REFUSED
from tests.support.apns_peer import (
    attempts_of,
    end_lease,
    insert_push,
    insert_token,
    push_row,
    running_peer,
    settings_for,
    shared_clock,
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


def refused(environment: str, reason: str) -> float:
    return float(CREDENTIALS_REFUSED.labels(environment, reason)._value.get())


async def test_a_refused_token_refresh_recovers_on_new_connections_to_both_hosts(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    peer, key_path = peer_and_key
    clock = shared_clock(peer)
    # Two origins (two connections, as production and sandbox are), one peer behind them.
    settings = settings_for(peer, key_path, production_url=f"https://localhost:{peer.port}")
    sender, close = build_sender(settings, engine, clock)
    tokens = {env: await insert_token(engine, environment=env) for env in ("sandbox", "production")}
    try:
        for token_id, _ in tokens.values():
            await insert_push(engine, token_id, version=1)
        assert await sender.send_due() == 2  # each host's connection now carries token 1
        assert len(peer.connections) == 2
        first_jwt = peer.state.received[0].provider_token

        clock.advance(25 * 60)
        peer.expire_provider_tokens()  # 403 ExpiredProviderToken to token 1 ...
        peer.refuse_token_updates()  # ... and 429 to token 2 on a connection that had 1
        pushes = {env: await insert_push(engine, t, version=2) for env, (t, _) in tokens.items()}
        with caplog.at_level(logging.WARNING):
            assert await sender.send_due() == 2

        for environment, push_id in pushes.items():
            row = await push_row(engine, push_id)
            assert (row["status"], row["last_http_status"], row["last_reason"]) == (
                "pending",
                429,
                "TooManyProviderTokenUpdates",
            )
            exchanges = [
                (a["http_status"], a["reason"]) for a in await attempts_of(engine, push_id)
            ]
            assert exchanges == [
                (403, "ExpiredProviderToken"),
                (429, "TooManyProviderTokenUpdates"),
            ]
            assert refused(environment, "TooManyProviderTokenUpdates") == 1
        assert "apns_token_update_refused" in caplog.text
        assert "apns_credentials_refused" in caplog.text

        # The backoff passes; no restart, no forced close from outside.
        for push_id in pushes.values():
            await end_lease(engine, push_id)
        assert await sender.send_due() == 2
    finally:
        await close()

    for environment, push_id in pushes.items():
        row = await push_row(engine, push_id)
        assert (row["status"], row["attempts"]) == ("sent", 2)
        assert refused(environment, "TooManyProviderTokenUpdates") == 0
    jwts = [r.provider_token for r in peer.state.received]
    assert len(set(jwts)) == 2  # one refresh for both hosts, never a second one
    assert jwts[-1] == jwts[-2] != first_jwt
    for secret in (first_jwt, jwts[-1], *(token for _, token in tokens.values())):
        assert secret not in caplog.text


async def test_a_token_younger_than_twenty_minutes_is_not_replaced_the_push_waits(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path]
) -> None:
    peer, key_path = peer_and_key
    clock = shared_clock(peer)
    sender, close = build_sender(settings_for(peer, key_path, max_attempts=1), engine, clock)
    token_id, token = await insert_token(engine)
    try:
        await insert_push(engine, token_id, version=1)
        await sender.send_due()
        clock.advance(5 * 60)
        peer.expire_provider_tokens()  # Apple says expired; the token is 5 minutes old
        push_id = await insert_push(engine, token_id, version=2)

        await sender.send_due()
        row = await push_row(engine, push_id)
        assert (row["status"], row["last_reason"]) == ("pending", "ExpiredProviderToken")
        assert len({r.provider_token for r in peer.state.received}) == 1
        assert [a["http_status"] for a in await attempts_of(engine, push_id)] == [403]

        clock.advance(15 * 60)  # twenty minutes since it was minted: now it may be replaced
        await end_lease(engine, push_id)
        await sender.send_due()
    finally:
        await close()

    row = await push_row(engine, push_id)
    assert (row["status"], row["attempts"]) == ("sent", 2)  # past max_attempts: it was held
    assert len({r.provider_token for r in peer.received_by(token)}) == 2


async def test_invalid_provider_token_holds_pushes_with_an_alert_until_the_key_is_fixed(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    peer, key_path = peer_and_key
    wrong = settings_for(peer, key_path, key_id="WRONGKEY01", max_attempts=2)
    sender, close = build_sender(wrong, engine)
    token_id, token = await insert_token(engine)
    push_id = await insert_push(engine, token_id)
    try:
        with caplog.at_level(logging.ERROR):
            for _ in range(3):  # more rounds than max_attempts
                assert await sender.send_due() == 1
                await end_lease(engine, push_id)
    finally:
        await close()

    row = await push_row(engine, push_id)
    assert (row["status"], row["attempts"], row["last_http_status"], row["last_reason"]) == (
        "pending",
        3,
        403,
        "InvalidProviderToken",
    )
    assert refused("sandbox", "InvalidProviderToken") == 1
    [alert] = [r for r in caplog.records if "apns_credentials_refused" in r.getMessage()]
    assert alert.levelno == logging.ERROR  # logged once per minute, not per push
    logged = alert.getMessage() + repr(getattr(alert, "fields", ""))
    assert "ATELIER_APNS_KEY_ID" in logged
    assert token not in caplog.text
    assert peer.state.received == []

    fixed, close = build_sender(settings_for(peer, key_path), engine)  # the key id fixed
    try:
        assert await fixed.send_due() == 1
    finally:
        await close()
    assert (await push_row(engine, push_id))["status"] == "sent"
    assert refused("sandbox", "InvalidProviderToken") == 0
    assert len(peer.received_by(token)) == 1


async def test_a_push_held_longer_than_the_bound_fails(
    engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path]
) -> None:
    peer, key_path = peer_and_key
    wrong = settings_for(peer, key_path, team_id="WRONGTEAM1", credentials_hold_seconds=60)
    sender, close = build_sender(wrong, engine)
    token_id, _ = await insert_token(engine)
    fresh = await insert_push(engine, token_id, version=1)
    stale = await insert_push(engine, token_id, version=2)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE notify.pushes SET created_at = now() - interval '2 minutes'"
                " WHERE push_id = :id"
            ),
            {"id": stale},
        )
    try:
        assert await sender.send_due() == 2
    finally:
        await close()

    assert (await push_row(engine, fresh))["status"] == "pending"
    row = await push_row(engine, stale)
    assert (row["status"], row["last_reason"]) == ("failed", "InvalidProviderToken")
