"""notify's settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.kit.settings import DEFAULT_PORTS, CommonSettings, EnvReader, ListenSettings


@dataclass(frozen=True)
class NotifySettings:
    common: CommonSettings
    listen: ListenSettings
    redis_url: str
    poll_period_seconds: float

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NotifySettings:
        reader = EnvReader(environ)
        settings = cls(
            common=CommonSettings.read(reader),
            listen=ListenSettings.read(reader, "notify", DEFAULT_PORTS["notify"]),
            redis_url=reader.string("REDIS_URL", ""),
            poll_period_seconds=reader.seconds("POLL_PERIOD", 2.0, minimum=0.1, maximum=60),
        )
        reader.finish()
        return settings
