"""Builds the sender from its settings (the key is read once, at start)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.clock import Clock, system_clock
from services.notify.apns.client import ApnsClient
from services.notify.apns.keys import load_signing_key
from services.notify.apns.provider_token import ProviderToken
from services.notify.apns.sender import Sender
from services.notify.apns.settings import ApnsSettings
from services.notify.apns.store import PushStore


def build_sender(
    settings: ApnsSettings, engine: AsyncEngine, clock: Clock = system_clock
) -> tuple[Sender, Callable[[], Coroutine[Any, Any, None]]]:
    """The sender and what closes its connections."""
    key = load_signing_key(settings.key_path)
    token = ProviderToken(
        key, settings.key_id, settings.team_id, settings.token_refresh_seconds, clock
    )
    client = ApnsClient(settings)
    return Sender(settings, PushStore(engine), client, token, clock), client.close
