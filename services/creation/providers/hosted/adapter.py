"""What a hosted adapter holds: its vendor's API client (with our key), the output
fetcher (without it), and the refusal of every call while the key is missing."""

from __future__ import annotations

from typing import Any, Self

import httpx

from services.creation.providers.base import ProviderError
from services.creation.providers.hosted.http import Call, transport_error, vendor_client
from services.creation.providers.hosted.images import OutputFetcher
from services.creation.settings import CreationSettings, ProviderSettings, VendorSettings


class HostedAdapter:
    """The shared half of the Replicate and fal adapters. ``key_setting`` names the
    setting a missing key is reported by (never the key itself)."""

    key_setting = ""
    auth_scheme = ""

    def __init__(
        self,
        settings: ProviderSettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        output_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        vendor = self.vendor_of(settings)
        self.configured = vendor.configured
        self._base_url = vendor.base_url
        self._client = vendor_client(
            vendor.base_url,
            f"{self.auth_scheme} {vendor.api_key}",
            connect_timeout=settings.connect_timeout_seconds,
            request_timeout=settings.request_timeout_seconds,
            transport=transport,
        )
        self._outputs = OutputFetcher(
            settings.output_max_bytes,
            timeout=settings.download_timeout_seconds,
            connect_timeout=settings.connect_timeout_seconds,
            transport=output_transport,
        )

    @classmethod
    def from_settings(cls, settings: CreationSettings) -> Self:
        return cls(settings.providers)

    @staticmethod
    def vendor_of(settings: ProviderSettings) -> VendorSettings:
        raise NotImplementedError

    def _require_key(self, call: Call) -> None:
        if not self.configured:
            raise ProviderError(
                "AUTH_REJECTED", f"{call.value}: {self.key_setting} is not set", retryable=False
            )

    async def _send(self, call: Call, method: str, path: str, **options: Any) -> httpx.Response:
        """One API call; no HTTP answer at all becomes the call's ProviderError."""
        try:
            return await self._client.request(method, path, **options)
        except httpx.TransportError as error:
            raise transport_error(error, call) from None

    async def close(self) -> None:
        await self._client.aclose()
        await self._outputs.close()
