"""Images in and out of a hosted vendor.

In: the user's photo as a data URI (inline: works whatever our storage is), or media's
short-lived signed URL when the vendor can reach our storage.

Out: the vendor's output URL (both Replicate and fal keep outputs for a short time only)
is downloaded with a size cap, its content type checked against what Pillow finds in the
bytes, and handed back as an OutputImage the attempt lands through media. An output that
is gone (404/403/410) is OUTPUT_EXPIRED: terminal, see docs/providers.md for why. A CDN
that did not answer is a call failure: the attempt polls again later, and the request
(already paid for) is kept.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import warnings
from urllib.parse import unquote_to_bytes

import httpx
from PIL import Image

from services.creation.providers.base import (
    Failed,
    GenerationRequest,
    OutputImage,
    ProviderError,
)
from services.creation.providers.hosted.http import USER_AGENT
from services.kit.sizes import byte_size

# What we land through media, by the format Pillow finds.
ACCEPTED = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
# Declared types that name an accepted one, or say nothing.
_TYPE_ALIASES = {
    "image/jpg": "image/jpeg",
    "binary/octet-stream": "",
    "application/octet-stream": "",
}
# Answers of an output host that mean "this output is gone for good".
GONE = frozenset({403, 404, 410})


def input_reference(request: GenerationRequest) -> str | None:
    """What the vendor is told to read the input from: the signed URL when the attempt got
    one, else the bytes inline; None for a job without an input."""
    if request.input_url:
        return request.input_url
    image = request.input_image
    if image is None:
        return None
    encoded = base64.b64encode(image.data).decode("ascii")
    return f"data:{image.content_type or 'application/octet-stream'};base64,{encoded}"


class OutputFetcher:
    """Downloads outputs from wherever a vendor put them. Its client carries no vendor
    credential: an output host is not the API and must never see our key."""

    def __init__(
        self,
        max_bytes: int,
        *,
        timeout: float,
        connect_timeout: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._max_bytes = max_bytes
        self._client = httpx.AsyncClient(
            http2=transport is None,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            headers={"User-Agent": USER_AGENT},
            follow_redirects=True,
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def fetch_all(self, urls: list[str]) -> list[OutputImage] | Failed:
        outputs: list[OutputImage] = []
        for url in urls:
            fetched = await self.fetch(url)
            if isinstance(fetched, Failed):
                return fetched
            outputs.append(fetched)
        return outputs

    async def fetch(self, url: str) -> OutputImage | Failed:
        """One output's bytes, checked; Failed when it is gone or unusable; raises
        ProviderError when its host did not answer (try again later)."""
        if url.startswith("data:"):
            data = _data_uri(url)
            if data is None:
                return Failed("OUTPUT_INVALID", "the output is a malformed data URI", False)
            return await _checked(data, None)
        if not url.startswith(("https://", "http://")):
            return Failed("OUTPUT_INVALID", "the output is not an http(s) URL", retryable=False)
        try:
            async with self._client.stream("GET", url) as response:
                if response.status_code in GONE:
                    return Failed(
                        "OUTPUT_EXPIRED",
                        f"the output URL answered HTTP {response.status_code}",
                        retryable=False,
                    )
                if response.status_code != 200:
                    raise ProviderError(
                        "UNAVAILABLE",
                        f"the output host answered HTTP {response.status_code}",
                        retryable=True,
                    )
                length = response.headers.get("content-length", "")
                if length.isdigit() and int(length) > self._max_bytes:
                    return _too_large(self._max_bytes)
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self._max_bytes:
                        return _too_large(self._max_bytes)
                content_type = response.headers.get("content-type")
        except httpx.TransportError as error:
            code = "TIMEOUT" if isinstance(error, httpx.TimeoutException) else "UNAVAILABLE"
            raise ProviderError(
                code, f"output download: {type(error).__name__}", retryable=True
            ) from None
        return await _checked(bytes(body), content_type)


def _too_large(max_bytes: int) -> Failed:
    return Failed("OUTPUT_INVALID", f"the output is larger than {byte_size(max_bytes)}", False)


def _data_uri(url: str) -> bytes | None:
    header, comma, payload = url.partition(",")
    if not comma:
        return None
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            return None
    return unquote_to_bytes(payload)


async def _checked(data: bytes, content_type: str | None) -> OutputImage | Failed:
    # Decoding costs CPU in proportion to the pixels: off the event loop.
    return await asyncio.to_thread(check_image, data, content_type)


def check_image(data: bytes, content_type: str | None) -> OutputImage | Failed:
    """The bytes as an OutputImage when Pillow reads a whole image of an accepted format
    whose type agrees with the declared one (when one was declared)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                found = image.format or ""
                width, height = image.size
                image.verify()  # the structure (PNG checksums, ...)
            with Image.open(io.BytesIO(data)) as image:
                image.load()  # and every pixel: a truncated file fails here
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Warning) as error:
        return Failed(
            "OUTPUT_INVALID", f"the output is not a readable image ({type(error).__name__})", False
        )
    mime = ACCEPTED.get(found)
    if mime is None:
        return Failed("OUTPUT_INVALID", f"the output is a {found or 'unknown'} image", False)
    declared = (content_type or "").split(";")[0].strip().lower()
    declared = _TYPE_ALIASES.get(declared, declared)
    if declared and declared != mime:
        return Failed("OUTPUT_INVALID", f"the output says {declared} but holds {mime}", False)
    return OutputImage(data=data, content_type=mime, width=width, height=height)
