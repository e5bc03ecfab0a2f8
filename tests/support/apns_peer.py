"""The APNs peer (services/dev/apns_peer.py) for tests: a provider key, a running peer,
sender settings pointed at it, and rows written straight into the push tables."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.dev.apns_peer import ApnsPeer, PeerRules, ensure_dev_key
from services.kit.clock import SettableClock
from services.notify.apns.settings import ApnsSettings

KEY_ID = "KEYID12345"
TEAM_ID = "TEAMID1234"
BUNDLE_ID = "com.example.atelier"


def provider_key(directory: Path) -> tuple[Path, ec.EllipticCurvePublicKey]:
    private_path, public_path = ensure_dev_key(directory)
    public = serialization.load_pem_public_key(public_path.read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey)
    return private_path, public


@asynccontextmanager
async def running_peer(directory: Path) -> AsyncIterator[tuple[ApnsPeer, Path]]:
    """A peer on a free port and the private key whose tokens it accepts."""
    key_path, public = provider_key(directory / "key")
    peer = ApnsPeer(PeerRules(public, KEY_ID, TEAM_ID, BUNDLE_ID), directory / "peer")
    await peer.start()
    try:
        yield peer, key_path
    finally:
        await peer.close()


def settings_for(peer: ApnsPeer, key_path: Path, **overrides: Any) -> ApnsSettings:
    """Both environments served by the peer (mismatches are simulated per token)."""
    settings = ApnsSettings(
        enabled=True,
        key_path=str(key_path),
        key_id=KEY_ID,
        team_id=TEAM_ID,
        bundle_id=BUNDLE_ID,
        production_url=peer.url,
        sandbox_url=peer.url,
        ca_file=peer.ca_file,
        batch_size=100,
        lease_seconds=30,
        request_timeout_seconds=5,
        backoff_base_seconds=0.05,
        backoff_max_seconds=0.2,
        poll_seconds=0.05,
    )
    return replace(settings, **overrides)


def device_token() -> str:
    return secrets.token_hex(32)


async def insert_token(
    engine: AsyncEngine,
    *,
    environment: str = "sandbox",
    kind: str = "device",
    registered_at: datetime | None = None,
) -> tuple[uuid.UUID, str]:
    """A token as registration stores it; other kinds hang off a device of their own, and
    an activity token belongs to one job's activity (the schema insists on both)."""
    device_id = None
    if kind != "device":
        device_id, _ = await insert_token(
            engine, environment=environment, registered_at=registered_at
        )
    token_id, token = uuid.uuid4(), device_token()
    activity = kind == "activity"
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO notify.push_tokens (token_id, user_id, kind, token, environment,"
                " bundle_id, locale, device_id, job_id, activity_id, registered_at) VALUES"
                " (:token_id, 'user-1', :kind, :token, :environment, :bundle, 'en', :device_id,"
                " :job_id, :activity_id, :registered_at)"
            ),
            {
                "token_id": token_id,
                "kind": kind,
                "device_id": device_id,
                "job_id": uuid.uuid4() if activity else None,
                "activity_id": "activity-1" if activity else None,
                "token": token,
                "environment": environment,
                "bundle": BUNDLE_ID,
                "registered_at": registered_at or datetime.now(UTC),
            },
        )
    return token_id, token


def alert(title: str = "Your picture is ready") -> tuple[dict[str, str], dict[str, Any]]:
    headers = {
        "apns-push-type": "alert",
        "apns-topic": BUNDLE_ID,
        "apns-priority": "10",
        "apns-expiration": "0",
    }
    return headers, {"aps": {"alert": {"title": title}, "sound": "default"}}


def live_activity_update(progress: float) -> tuple[dict[str, str], dict[str, Any]]:
    headers = {
        "apns-push-type": "liveactivity",
        "apns-topic": BUNDLE_ID + ".push-type.liveactivity",
        "apns-priority": "5",
    }
    aps = {"event": "update", "timestamp": 1_800_000_000, "content-state": {"p": progress}}
    return headers, {"aps": aps}


async def insert_push(
    engine: AsyncEngine,
    token_id: uuid.UUID,
    message: tuple[dict[str, str], dict[str, Any]] | None = None,
    *,
    kind: str = "alert",
    version: int = 1,
    job_id: uuid.UUID | None = None,
) -> int:
    headers, payload = message or alert()
    async with engine.begin() as connection:
        push_id = await connection.scalar(
            text(
                "INSERT INTO notify.pushes (token_id, job_id, version, kind, priority, headers,"
                " payload, next_attempt_at, created_at) VALUES (:token_id, :job_id, :version,"
                " :kind, :priority, CAST(:headers AS jsonb), CAST(:payload AS jsonb), now(),"
                " now()) RETURNING push_id"
            ),
            {
                "token_id": token_id,
                "job_id": job_id or uuid.uuid4(),
                "version": version,
                "kind": kind,
                "priority": int(headers.get("apns-priority", "10")),
                "headers": json.dumps(headers),
                "payload": json.dumps(payload),
            },
        )
    assert isinstance(push_id, int)
    return push_id


async def push_row(engine: AsyncEngine, push_id: int) -> dict[str, Any]:
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text("SELECT * FROM notify.pushes WHERE push_id = :id"), {"id": push_id}
            )
        ).one()
    return dict(row._mapping)


async def token_row(engine: AsyncEngine, token_id: uuid.UUID) -> dict[str, Any]:
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text("SELECT * FROM notify.push_tokens WHERE token_id = :id"), {"id": token_id}
            )
        ).one()
    return dict(row._mapping)


async def attempts_of(engine: AsyncEngine, push_id: int) -> list[dict[str, Any]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text("SELECT * FROM notify.push_attempts WHERE push_id = :id ORDER BY at"),
            {"id": push_id},
        )
    return [dict(row._mapping) for row in rows]


async def end_lease(engine: AsyncEngine, push_id: int) -> None:
    """The lease's (or the backoff's) time passes, instead of waiting it out."""
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE notify.pushes SET next_attempt_at = now() WHERE push_id = :id"),
            {"id": push_id},
        )


def shared_clock(peer: ApnsPeer) -> SettableClock:
    """A clock the sender and the peer both read (a provider token's age is the peer's
    to judge): tests move it past APNs' 20-minute and one-hour rules."""
    clock = SettableClock()
    peer.rules.clock = lambda: clock().timestamp()
    return clock
