"""The data plane of the in-process worker: an input's bytes fetched from the signed GET
URL media hands out, an output's bytes sent to the signed PUT URL a reservation names
(S3 itself, or media's object listener for the local backend). Image bytes never cross
media's gRPC listener: only the reservation and the commit do (media_client.py).

What the answers mean to an attempt: a refusal of the object (4xx: gone, too large, not
what the URL was signed for) is the asset's (AssetUnreadable, AssetRefused); no answer,
a 5xx or a 429 is the store being unavailable now (MediaUnavailable: the attempt hands
its job back rather than fail it)."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp
from yarl import URL

from services.creation.errors import MediaUnavailable
from services.creation.media_client import AssetRefused, AssetUnreadable, OutputUpload
from services.kit.sizes import byte_size

# Moving an image's bytes takes longer than a metadata call; a store that does not start
# answering within the connect timeout is down.
TRANSFER_TIMEOUT_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 2.0
# aiohttp has no timeout on writes: an upload to a store that takes the connection and
# then reads nothing (frozen) would wait for ever. Each upload gets the read timeout plus
# the time its bytes take at this slowest rate we wait for.
SLOWEST_UPLOAD_BYTES_PER_SECOND = 1 << 20
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
    store with a private CA).

    aiohttp's client, not httpx's: httpx's pool looks at every pooled connection (a poll
    of its socket each) for every request it places, which was half of a worker
    process's CPU on the bench's job path with the pool as large as the concurrency
    (docs/benchmarks.md, 2026-12-04). The session is opened on first use, inside the
    event loop it belongs to."""

    def __init__(
        self,
        timeout_seconds: float = TRANSFER_TIMEOUT_SECONDS,
        ca_file: str = "",
        direct: tuple[str, str] | None = None,
    ) -> None:
        """``direct``: (a public base URL, a direct one): a URL under the first goes to
        the same path and query under the second (ATELIER_OBJECT_*_BASE_URL: the local
        backend's URLs name the edge, but this process can reach media's object listener
        itself, without a proxy's hop and CPU on each GET and PUT)."""
        self._direct = (
            None if direct is None else (direct[0].rstrip("/") + "/", direct[1].rstrip("/") + "/")
        )
        self._tls = ssl.create_default_context()
        if ca_file:
            self._tls.load_verify_locations(cafile=ca_file)
        # No whole-transfer limit: a large object may take long while bytes keep coming;
        # each connect and each read must answer in time.
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=timeout_seconds
        )
        self._timeout_seconds = timeout_seconds
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=128, ssl=self._tls),
                timeout=self._timeout,
                # The URLs are media's or the object store's: no proxy sits between them.
                trust_env=False,
            )
        return self._session

    def _url(self, url: str) -> URL:
        """The URL exactly as signed (encoded: never quoted again), on the direct origin
        when it is under the public base."""
        if self._direct is not None and url.startswith(self._direct[0]):
            url = self._direct[1] + url[len(self._direct[0]) :]
        return URL(url, encoded=True)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def download(self, url: str, max_bytes: int, what: str) -> tuple[bytes, str]:
        """The object's bytes and content type, refused past ``max_bytes`` (before they
        are all read when the store says its length)."""
        try:
            async with self._client().get(self._url(url)) as response:
                status = response.status
                if _store_is_busy(status):
                    raise _unavailable(status)
                if status != 200:
                    raise AssetUnreadable(f"{what}: the object store answered {status}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                    raise AssetUnreadable(f"{what} is larger than {byte_size(max_bytes)}")
                data = bytearray()
                async for chunk in response.content.iter_chunked(READ_CHUNK_BYTES):
                    data += chunk
                    if len(data) > max_bytes:
                        raise AssetUnreadable(f"{what} is larger than {byte_size(max_bytes)}")
                content_type = response.headers.get("content-type", "")
        except (aiohttp.ClientError, TimeoutError):
            raise _unavailable() from None
        return bytes(data), content_type.split(";")[0].strip().lower()

    async def upload(self, upload: OutputUpload, data: bytes) -> None:
        """PUTs an output's bytes with exactly the headers the signed URL asks for. A 412
        says the object is there already (an earlier PUT under the same reservation whose
        answer was lost, or a worker killed before its commit): the commit checks it."""
        deadline = self._timeout_seconds + len(data) / SLOWEST_UPLOAD_BYTES_PER_SECOND
        try:
            async with (
                asyncio.timeout(deadline),
                self._client().request(
                    upload.method or "PUT",
                    self._url(upload.url),
                    headers=upload.headers,
                    data=data,
                ) as response,
            ):
                status = response.status
                if status in (200, 201, 204, 412):
                    return
                if _store_is_busy(status):
                    raise _unavailable(status)
                body = (await response.read())[:2000].decode("utf-8", "replace")
                content_type = response.headers.get("content-type", "")
        except (aiohttp.ClientError, TimeoutError):
            raise _unavailable() from None
        refusal = f"HTTP {status} {_reason(body, content_type)}".strip()
        raise AssetRefused(f"the object store refused the upload: {refusal}")


def _reason(text: str, content_type: str) -> str:
    """media's listener answers a google.rpc.Status with an ErrorInfo reason; S3 an XML
    error with a Code. Either way a short word for the job's error message."""
    if content_type.startswith("application/json"):
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        error = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(error, str):
            return error
    start = text.find("<Code>")
    if start >= 0:
        end = text.find("</Code>", start)
        if end > start:
            return text[start + len("<Code>") : end]
    return ""
