"""Is it really an image of the declared type, and a safe one to decode? Pillow answers,
in a worker thread so the event loop keeps serving (small images: on the loop).

Only the JPEG, PNG and WebP decoders are ever tried. The pixel count is checked from the
header before any pixel is decoded (a decompression bomb is a few KB that claims
gigapixels). Then the image is decoded in full, so truncated or corrupt data is caught
here rather than by whoever uses the asset; JPEG is decoded at 1/8 scale (every block is
still entropy-decoded), which keeps memory small for large photos.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from PIL import Image, UnidentifiedImageError

from services.media.domain import CONTENT_TYPES
from services.media.errors import ContentRejected, Reason

_FORMATS = tuple(CONTENT_TYPES.values())
_NAMES = {fmt: mime for mime, fmt in CONTENT_TYPES.items()}
# Up to this many pixels (a 256x256 image: well under a millisecond) an image in memory is
# decoded on the event loop; larger ones in a worker thread.
INLINE_DECODE_PIXELS = 256 * 256


@dataclass(frozen=True)
class Dimensions:
    width: int
    height: int


@contextlib.contextmanager
def rejecting(max_pixels: int) -> Iterator[None]:
    """Pillow's complaints about the bytes become ContentRejected."""
    try:
        yield
    except Image.DecompressionBombError:
        # Pillow's own limit (far above ours) fired while reading the header.
        raise ContentRejected(
            Reason.IMAGE_TOO_LARGE, f"the image has more than {max_pixels} pixels"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        raise ContentRejected(
            Reason.NOT_AN_IMAGE, "the bytes are not a readable JPEG, PNG or WebP image"
        ) from None


def open_checked(file: IO[bytes], content_type: str, max_pixels: int) -> Image.Image:
    """The image's header, read and checked (format, pixel count); nothing decoded yet.
    The caller closes the image. Raises ContentRejected."""
    expected = CONTENT_TYPES[content_type]
    file.seek(0)
    with rejecting(max_pixels):
        image = Image.open(file, formats=_FORMATS)
    try:
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
    except BaseException:
        image.close()
        raise
    return image


def _decode(image: Image.Image, max_pixels: int) -> None:
    """Decodes every pixel (JPEG at the coarsest DCT scale): truncated or corrupt data
    shows here. Raises ContentRejected. Blocking."""
    with rejecting(max_pixels):
        if image.format == "JPEG":
            width, height = image.size
            # Pillow picks the coarsest DCT scale that still covers the size asked.
            image.draft(None, (max(1, width // 8), max(1, height // 8)))
        image.load()


def inspect(file: IO[bytes], content_type: str, max_pixels: int) -> Dimensions:
    """Checks the image in ``file`` (from its start); raises ContentRejected. Blocking."""
    with open_checked(file, content_type, max_pixels) as image:
        # Read before decoding: a JPEG draft shrinks the size Pillow reports.
        width, height = image.size
        _decode(image, max_pixels)
        return Dimensions(width, height)


class ImageInspector:
    """Runs :func:`inspect` off the event loop, a bounded number at a time: decoding costs
    memory in proportion to the pixels, so concurrent decodes are capped. A small image
    held in memory is checked on the loop itself: decoding a few thousand pixels costs
    less than the hop to a thread and back."""

    def __init__(self, max_pixels: int, concurrency: int = 2) -> None:
        self._max_pixels = max_pixels
        self._slots = asyncio.Semaphore(concurrency)

    @property
    def max_pixels(self) -> int:
        return self._max_pixels

    async def inspect(
        self, file: IO[bytes], content_type: str, in_memory: bool = False
    ) -> Dimensions:
        """``in_memory``: ``file`` is an io.BytesIO (reading its header never blocks)."""
        if in_memory:
            with open_checked(file, content_type, self._max_pixels) as image:
                width, height = image.size
                if width * height <= INLINE_DECODE_PIXELS:
                    _decode(image, self._max_pixels)
                    return Dimensions(width, height)
                async with self._slots:
                    await asyncio.to_thread(_decode, image, self._max_pixels)
                return Dimensions(width, height)
        async with self._slots:
            return await asyncio.to_thread(inspect, file, content_type, self._max_pixels)
