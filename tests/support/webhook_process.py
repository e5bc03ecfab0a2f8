"""A webhook deliverer as a process of its own, for tests that kill it (kill -9):
``python -m tests.support.webhook_process DATABASE_URL SETTINGS_JSON``. Prints "ready"
once it listens for new deliveries."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace

from sqlalchemy.ext.asyncio import create_async_engine

from services.creation.media_client import MediaClient
from services.creation.webhooks.deliverer import WebhookDeliverer
from services.creation.webhooks.settings import WebhookSettings
from services.kit.db import asyncpg_url
from services.kit.settings import DEV_SERVICE_TOKEN


async def main(url: str, changes: dict[str, object]) -> None:
    for name in ("retry_schedule", "allowed_networks"):
        if name in changes:
            changes[name] = tuple(changes[name])  # type: ignore[arg-type]
    settings = replace(WebhookSettings(), **changes)  # type: ignore[arg-type]
    engine = create_async_engine(asyncpg_url(url))
    media = MediaClient("127.0.0.1:9", DEV_SERVICE_TOKEN)  # never called: no outputs
    deliverer = WebhookDeliverer(engine, media, settings, url)
    task = asyncio.create_task(deliverer.run())
    await deliverer.listener.connected.wait()
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
