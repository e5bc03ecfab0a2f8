"""media's settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.kit.settings import DEFAULT_PORTS, CommonSettings, EnvReader, ListenSettings


@dataclass(frozen=True)
class MediaSettings:
    common: CommonSettings
    listen: ListenSettings
    max_upload_bytes: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MediaSettings:
        reader = EnvReader(environ)
        settings = cls(
            common=CommonSettings.read(reader),
            listen=ListenSettings.read(reader, "media", DEFAULT_PORTS["media"]),
            max_upload_bytes=reader.integer(
                "MAX_UPLOAD_BYTES", 20 * 1024 * 1024, minimum=1024, maximum=512 * 1024 * 1024
            ),
        )
        reader.finish()
        return settings
