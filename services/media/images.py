"""Is it really an image of the declared type, and a safe one to decode? Pillow answers,
in a worker thread so the event loop keeps serving.

Only the JPEG, PNG and WebP decoders are ever tried. The pixel count is checked from the
header before any pixel is decoded (a decompression bomb is a few KB that claims
gigapixels). Then the image is decoded in full, so truncated or corrupt data is caught
here rather than by whoever uses the asset; JPEG is decoded at 1/8 scale (every block is
still entropy-decoded), which keeps memory small for large photos.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import IO

from PIL import Image, UnidentifiedImageError

from services.media.errors import ContentRejected, Reason
from services.media.model import CONTENT_TYPES

_FORMATS = tuple(CONTENT_TYPES.values())
_NAMES = {fmt: mime for mime, fmt in CONTENT_TYPES.items()}


@dataclass(frozen=True)
class Dimensions:
    width: int
    height: int


def inspect(file: IO[bytes], content_type: str, max_pixels: int) -> Dimensions:
    """Checks the image in ``file`` (from its start); raises ContentRejected. Blocking."""
    expected = CONTENT_TYPES[content_type]
    file.seek(0)
    try:
        with Image.open(file, formats=_FORMATS) as image:
            width, height = image.size
            if image.format != expected:
                found = _NAMES.get(image.format or "", "another format")
                raise ContentRejected(
                    Reason.CONTENT_TYPE_MISMATCH,
                    f"the bytes are {found}, but {content_type} was declared",
                )
            if width * height > max_pixels:
                raise ContentRejected(
                    Reason.IMAGE_TOO_LARGE,
                    f"the image has {width}x{height} pixels; at most {max_pixels} are accepted",
                )
            if image.format == "JPEG":
                # Pillow picks the coarsest DCT scale that still covers the size asked.
                image.draft(None, (max(1, width // 8), max(1, height // 8)))
            image.load()
    except Image.DecompressionBombError:
        # Pillow's own limit (far above ours) fired while reading the header.
        raise ContentRejected(
            Reason.IMAGE_TOO_LARGE, f"the image has more than {max_pixels} pixels"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        raise ContentRejected(
            Reason.NOT_AN_IMAGE, "the bytes are not a readable JPEG, PNG or WebP image"
        ) from None
    return Dimensions(width, height)


class ImageInspector:
    """Runs :func:`inspect` off the event loop, a bounded number at a time: decoding costs
    memory in proportion to the pixels, so concurrent decodes are capped."""

    def __init__(self, max_pixels: int, concurrency: int = 2) -> None:
        self._max_pixels = max_pixels
        self._slots = asyncio.Semaphore(concurrency)

    async def inspect(self, file: IO[bytes], content_type: str) -> Dimensions:
        async with self._slots:
            return await asyncio.to_thread(inspect, file, content_type, self._max_pixels)
