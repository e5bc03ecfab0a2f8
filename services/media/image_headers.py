"""What an image's first bytes say: its format and its size in pixels, checked against the
declared type and the pixel limit, without decoding a single pixel. A committed output
is judged by its header alone (its bytes are never read whole on the job's path): a
decompression bomb is refused here, from the few bytes that claim its gigapixels.

PNG and JPEG headers are read by Pillow's own parsers from the head of the object (a
JPEG's frame header may sit behind large metadata segments: the caller reads more and
asks again when ``NeedMore`` says so). Pillow opens a WebP only by handing the whole file
to libwebp, so a WebP's RIFF header is read here: its first chunk (VP8, VP8L or VP8X)
holds the canvas size at a fixed place.
"""

from __future__ import annotations

import io
import struct

from services.media.errors import ContentRejected, Reason
from services.media.images import Dimensions, open_checked

# Enough for almost every header; a JPEG behind big EXIF or ICC segments may need more.
FIRST_READ_BYTES = 64 * 1024
LONGEST_READ_BYTES = 1024 * 1024


class NeedMore(Exception):
    """The head ended before the header did: read more of the object and ask again."""


def _not_an_image() -> ContentRejected:
    return ContentRejected(
        Reason.NOT_AN_IMAGE, "the bytes are not a readable JPEG, PNG or WebP image"
    )


def header_dimensions(head: bytes, content_type: str, max_pixels: int, whole: bool) -> Dimensions:
    """The image's size from ``head`` (the object's first bytes; ``whole``: all of them).
    Raises ContentRejected (not the declared type, too many pixels, not an image) or
    NeedMore."""
    if content_type == "image/webp":
        dimensions = webp_dimensions(head)
    else:
        try:
            with open_checked(io.BytesIO(head), content_type, max_pixels) as image:
                return Dimensions(*image.size)
        except ContentRejected as rejected:
            if rejected.reason == Reason.NOT_AN_IMAGE and not whole:
                raise NeedMore() from None
            raise
    if dimensions is None:
        raise _not_an_image() if whole or len(head) >= 30 else NeedMore()
    if dimensions.width * dimensions.height > max_pixels:
        raise ContentRejected(
            Reason.IMAGE_TOO_LARGE,
            f"the image has {dimensions.width}x{dimensions.height} pixels;"
            f" at most {max_pixels} are accepted",
        )
    return dimensions


def webp_dimensions(head: bytes) -> Dimensions | None:
    """The canvas size a WebP's first chunk states; None when ``head`` is not one. A
    head of another format is CONTENT_TYPE_MISMATCH when it is PNG or JPEG."""
    if head[:8].startswith(b"\x89PNG") or head[:3] == b"\xff\xd8\xff":
        found = "image/png" if head.startswith(b"\x89PNG") else "image/jpeg"
        raise ContentRejected(
            Reason.CONTENT_TYPE_MISMATCH, f"the bytes are {found}, but image/webp was declared"
        )
    if len(head) < 30 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return None
    chunk = head[12:16]
    if chunk == b"VP8X":
        # Canvas width and height minus one, 24 bits each, little-endian.
        width = 1 + int.from_bytes(head[24:27], "little")
        height = 1 + int.from_bytes(head[27:30], "little")
        return Dimensions(width, height)
    if chunk == b"VP8 ":
        # A key frame's start code, then 14-bit width and height.
        if head[23:26] != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack("<HH", head[26:30])
        return Dimensions(width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L":
        # The signature byte, then width and height minus one, 14 bits each.
        if head[20] != 0x2F:
            return None
        bits = int.from_bytes(head[21:25], "little")
        return Dimensions(1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF))
    return None
