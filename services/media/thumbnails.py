"""Small previews of generated images, so a history grid downloads kilobytes, not the
full pictures: longest side at most 256 px, the EXIF orientation applied (a phone's
portrait stays upright), transparency kept.

WebP rather than JPEG: about a third smaller at the same visual quality, it keeps a
PNG's alpha channel, and every client we serve decodes it (iOS 14+, Android, browsers).

The bytes were already checked by images.inspect (format, pixel count, a full decode);
the header checks run again here all the same, so this module is safe on its own.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass
from typing import IO

from PIL import Image, ImageOps

from services.media.images import open_checked, rejecting

THUMBNAIL_MAX_SIDE = 256
THUMBNAIL_CONTENT_TYPE = "image/webp"
# Visually clean at this size; higher buys bytes, not looks.
_WEBP_QUALITY = 80
# WebP's method 4 (of 0-6) is its default balance of encoding time and size.
_WEBP_METHOD = 4


@dataclass(frozen=True)
class Thumbnail:
    data: bytes
    content_type: str
    width: int
    height: int


def make_thumbnail(
    file: IO[bytes], content_type: str, max_pixels: int, max_side: int = THUMBNAIL_MAX_SIDE
) -> Thumbnail:
    """A thumbnail of the image in ``file`` (from its start). Raises ContentRejected for
    bytes Pillow cannot read. Blocking."""
    with open_checked(file, content_type, max_pixels) as image, rejecting(max_pixels):
        # A JPEG decodes straight at the smallest DCT scale that still covers the box:
        # a 24-megapixel photo costs a fraction of a full decode.
        image.draft(None, (max_side, max_side))
        # The orientation is read before resizing, which leaves the EXIF block behind.
        upright = ImageOps.exif_transpose(image)
        upright.thumbnail((max_side, max_side), Image.Resampling.LANCZOS, reducing_gap=3.0)
        small = upright.convert("RGBA" if _has_alpha(upright) else "RGB")
        out = io.BytesIO()
        small.save(out, "WEBP", quality=_WEBP_QUALITY, method=_WEBP_METHOD)
        return Thumbnail(out.getvalue(), THUMBNAIL_CONTENT_TYPE, small.width, small.height)


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or (
        image.mode == "P" and "transparency" in image.info
    )


class Thumbnailer:
    """Runs :func:`make_thumbnail` in a worker thread, a bounded number at a time (a
    decode's memory grows with the image's pixels)."""

    def __init__(self, max_pixels: int, concurrency: int = 2) -> None:
        self._max_pixels = max_pixels
        self._slots = asyncio.Semaphore(concurrency)

    async def make(self, file: IO[bytes], content_type: str) -> Thumbnail:
        async with self._slots:
            return await asyncio.to_thread(make_thumbnail, file, content_type, self._max_pixels)
