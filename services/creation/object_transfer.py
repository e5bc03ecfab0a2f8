"""The data plane of the in-process worker: an input's bytes fetched from the signed GET
URL media hands out, an output's bytes sent to the signed PUT URL a reservation names
(S3 itself, or media's object listener for the local backend). Image bytes never cross
media's gRPC listener: only the reservation and the commit do (media_client.py).

What the answers mean to an attempt: a refusal of the object (4xx: gone, too large, not
what the URL was signed for) is the asset's (AssetUnreadable, AssetRefused); no answer,
a 5xx or a 429 is the store being unavailable now (MediaUnavailable: the attempt hands
its job back rather than fail it)."""

from __future__ import annotations

import ssl

import httpx

from services.creation.errors import MediaUnavailable
from services.creation.media_client import AssetRefused, AssetUnreadable, OutputUpload
from services.kit.sizes import byte_size

# Moving an image's bytes takes longer than a metadata call; a store that does not start
# answering within the connect timeout is down.
TRANSFER_TIMEOUT_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 2.0
READ_CHUNK_BYTES = 256 * 1024
# What the store said when it could not take or serve an object now.
OBJECT_STORE_UNAVAILABLE = "OBJECT_STORE_UNAVAILABLE"


def _unavailable(status: int | None = None) -> MediaUnavailable:
    cause = OBJECT_STORE_UNAVAILABLE if status is None else f"{OBJECT_STORE_UNAVAILABLE}_{status}"
    return MediaUnavailable(cause=cause)


def _store_is_busy(status: int) -> bool:
    return status >= 500 or status == 429


class ObjectTransfer:
    """One pooled HTTP client for every attempt of the process. It trusts the system's CAs,
    and ``ca_file``'s too when given (ATELIER_OBJECT_CA_FILE: URLs signed for an edge or a
    store with a private CA)."""

    def __init__(
        self, timeout_seconds: float = TRANSFER_TIMEOUT_SECONDS, ca_file: str = ""
    ) -> None:
        tls = ssl.create_default_context()
        if ca_file:
            tls.load_verify_locations(cafile=ca_file)
        self._client = httpx.AsyncClient(
            verify=tls,
            timeout=httpx.Timeout(timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS),
            limits=httpx.Limits(max_connections=128, max_keepalive_connections=64),
            # The URLs are media's or the object store's: no proxy sits between them.
            trust_env=False,
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def download(self, url: str, max_bytes: int, what: str) -> tuple[bytes, str]:
        """The object's bytes and content type, refused past ``max_bytes`` (before they
        are all read when the store says its length)."""
        try:
            async with self._client.stream("GET", url) as response:
                if _store_is_busy(response.status_code):
                    raise _unavailable(response.status_code)
                status = response.status_code
                if status != 200:
                    raise AssetUnreadable(f"{what}: the object store answered {status}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                    raise AssetUnreadable(f"{what} is larger than {byte_size(max_bytes)}")
                data = bytearray()
                async for chunk in response.aiter_bytes(READ_CHUNK_BYTES):
                    data += chunk
                    if len(data) > max_bytes:
                        raise AssetUnreadable(f"{what} is larger than {byte_size(max_bytes)}")
                content_type = response.headers.get("content-type", "")
        except httpx.TransportError:
            raise _unavailable() from None
        return bytes(data), content_type.split(";")[0].strip().lower()

    async def upload(self, upload: OutputUpload, data: bytes) -> None:
        """PUTs an output's bytes with exactly the headers the signed URL asks for. A 412
        says the object is there already (an earlier PUT under the same reservation whose
        answer was lost, or a worker killed before its commit): the commit checks it."""
        try:
            response = await self._client.request(
                upload.method or "PUT", upload.url, headers=upload.headers, content=data
            )
        except httpx.TransportError:
            raise _unavailable() from None
        status = response.status_code
        if status in (200, 201, 204, 412):
            return
        if _store_is_busy(status):
            raise _unavailable(status)
        refusal = f"HTTP {status} {_reason(response)}".strip()
        raise AssetRefused(f"the object store refused the upload: {refusal}")


def _reason(response: httpx.Response) -> str:
    """media's listener answers a google.rpc.Status with an ErrorInfo reason; S3 an XML
    error with a Code. Either way a short word for the job's error message."""
    text = response.text[:2000]
    if response.headers.get("content-type", "").startswith("application/json"):
        try:
            error = response.json().get("error")
        except ValueError:
            error = None
        if isinstance(error, str):
            return error
    start = text.find("<Code>")
    if start >= 0:
        end = text.find("</Code>", start)
        if end > start:
            return text[start + len("<Code>") : end]
    return ""
