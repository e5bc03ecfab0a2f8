"""The HTTP/2 connection to APNs: one multiplexed connection per host, a request per push."""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Mapping

from services.notify.apns.http2 import ConnectionLost, Http2Client
from services.notify.apns.outcomes import Answer, unregistered_at
from services.notify.apns.settings import ApnsSettings

# apns-id is derived from push_id, so every resend of one push carries the same id.
_APNS_ID_NAMESPACE = uuid.UUID("7b1d3c2e-5f0a-4d8e-9a61-3c0f2b9e4a17")


def apns_id_for(push_id: int) -> str:
    return str(uuid.uuid5(_APNS_ID_NAMESPACE, str(push_id)))


class ApnsClient:
    def __init__(self, settings: ApnsSettings) -> None:
        self._settings = settings
        tls = ssl.create_default_context(cafile=settings.ca_file or None)
        # HTTP/2 multiplexes: one connection per host carries every stream.
        self._http = Http2Client(tls, connect_timeout=settings.request_timeout_seconds)

    async def send(
        self,
        environment: str,
        device_token: str,
        headers: Mapping[str, str],
        body: bytes,
        apns_id: str,
        provider_token: str,
    ) -> Answer:
        url = f"{self._settings.base_url(environment)}/3/device/{device_token}"
        request_headers = [
            *((name, value) for name, value in headers.items() if name.startswith("apns-")),
            ("apns-id", apns_id),
            ("authorization", f"bearer {provider_token}"),
        ]
        try:
            response = await self._http.post(
                url, request_headers, body, self._settings.request_timeout_seconds
            )
        except TimeoutError:
            return Answer(0, "Timeout", apns_id)
        except ConnectionLost:
            # Its text names the host only, never the URL (which holds the device token).
            return Answer(0, "ConnectionLost", apns_id)
        answered_id = response.headers.get("apns-id", apns_id)
        if response.status == 200:
            return Answer(200, "", answered_id, connection=response.connection)
        reason, timestamp = _reason(response.body)
        return Answer(
            response.status,
            reason,
            answered_id,
            unregistered_at(timestamp),
            connection=response.connection,
        )

    def reconnect(self, environment: str, answer: Answer) -> bool:
        """The next push to ``environment`` goes on a new connection, unless the one that
        gave ``answer`` was already replaced. APNs ties provider-token updates to a
        connection: a fresh one takes the current token."""
        return self._http.retire(self._settings.base_url(environment), answer.connection)

    async def close(self) -> None:
        await self._http.close()


def _reason(content: bytes) -> tuple[str, object]:
    try:
        body = json.loads(content)
    except ValueError:
        return "", None
    if not isinstance(body, dict):
        return "", None
    reason = body.get("reason")
    return (reason if isinstance(reason, str) else ""), body.get("timestamp")
