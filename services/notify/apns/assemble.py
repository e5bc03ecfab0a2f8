"""Builds the sender from its settings (the key is read once, at start)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.clock import Clock, system_clock
from services.kit.settings import SettingsError
from services.notify.apns.client import ApnsClient
from services.notify.apns.keys import KeyProblem, load_signing_key
from services.notify.apns.provider_token import ProviderToken
from services.notify.apns.sender import Sender
from services.notify.apns.settings import ApnsSettings
from services.notify.store.sender import PushStore


def build_sender(
    settings: ApnsSettings, engine: AsyncEngine, clock: Clock = system_clock
) -> tuple[Sender, Callable[[], Coroutine[Any, Any, None]]]:
    """The sender and what closes its connections."""
    try:
        key = load_signing_key(settings.key_path)
    except KeyProblem as problem:
        # Reported like any bad setting: the process stops before serving, naming it.
        raise SettingsError(f"invalid settings:\n  ATELIER_APNS_KEY_PATH: {problem}") from None
    token = ProviderToken(
        key, settings.key_id, settings.team_id, settings.token_refresh_seconds, clock
    )
    client = ApnsClient(settings)
    return Sender(settings, PushStore(engine), client, token, clock), client.close
