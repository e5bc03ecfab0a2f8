"""The previews media makes of generated outputs: WebP, longest side 256 px at most, the
aspect ratio kept, never enlarged, upright per the EXIF orientation, alpha kept, a large
photo shrunk whole, and hostile bytes refused with a reason rather than a crash."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from services.media.errors import ContentRejected, Reason
from services.media.thumbnails import THUMBNAIL_CONTENT_TYPE, Thumbnail, make_thumbnail
from tests.support.media import image_bytes, pixel_bomb_png

LIMIT = 50_000_000
RED = (255, 0, 0)
BLUE = (0, 0, 255)


def thumbnail_of(data: bytes, content_type: str, max_pixels: int = LIMIT) -> Thumbnail:
    return make_thumbnail(io.BytesIO(data), content_type, max_pixels)


def decoded(thumbnail: Thumbnail) -> Image.Image:
    image = Image.open(io.BytesIO(thumbnail.data))
    image.load()
    return image


def two_halves(width: int, height: int) -> Image.Image:
    """Red on the left half, blue on the right."""
    image = Image.new("RGB", (width, height), BLUE)
    image.paste(RED, (0, 0, width // 2, height))
    return image


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def near(pixel: tuple[int, ...], colour: tuple[int, int, int]) -> bool:
    return all(abs(a - b) < 40 for a, b in zip(pixel[:3], colour, strict=True))


@pytest.mark.parametrize(
    ("fmt", "content_type", "size", "expected"),
    [
        ("JPEG", "image/jpeg", (600, 300), (256, 128)),
        ("PNG", "image/png", (300, 900), (85, 256)),
        ("WEBP", "image/webp", (300, 300), (256, 256)),
        # Already small: kept at its size, never enlarged.
        ("PNG", "image/png", (120, 80), (120, 80)),
    ],
)
def test_the_longest_side_becomes_at_most_256_and_the_aspect_ratio_stays(
    fmt: str, content_type: str, size: tuple[int, int], expected: tuple[int, int]
) -> None:
    thumbnail = thumbnail_of(image_bytes(fmt, *size), content_type)
    image = decoded(thumbnail)
    assert image.format == "WEBP" and thumbnail.content_type == THUMBNAIL_CONTENT_TYPE
    assert image.size == expected == (thumbnail.width, thumbnail.height)


def test_the_exif_orientation_is_applied_so_a_portrait_stays_upright() -> None:
    # Stored as a 400x200 landscape, red left; orientation 6 says "turn 90° clockwise to
    # view": a 200x400 portrait with red on top.
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encoded(two_halves(400, 200), "JPEG", quality=95, exif=exif.tobytes())
    image = decoded(thumbnail_of(data, "image/jpeg")).convert("RGB")
    assert image.size == (128, 256)
    assert near(image.getpixel((64, 20)), RED)
    assert near(image.getpixel((64, 236)), BLUE)


def test_transparency_is_kept() -> None:
    clear = Image.new("RGBA", (400, 400), (0, 0, 0, 0))
    clear.paste((255, 0, 0, 255), (0, 0, 200, 400))
    image = decoded(thumbnail_of(encoded(clear, "PNG"), "image/png"))
    assert image.mode == "RGBA"
    assert image.getpixel((200, 128))[3] == 0
    assert image.getpixel((20, 128))[3] == 255


def test_a_large_photo_becomes_a_small_thumbnail() -> None:
    photo = encoded(two_halves(6000, 4000), "JPEG", quality=90)
    thumbnail = thumbnail_of(photo, "image/jpeg")
    assert (thumbnail.width, thumbnail.height) == (256, 171)
    assert len(thumbnail.data) < 20_000 < len(photo)
    image = decoded(thumbnail).convert("RGB")
    assert near(image.getpixel((10, 85)), RED) and near(image.getpixel((246, 85)), BLUE)


@pytest.mark.parametrize(
    ("data", "content_type", "reason"),
    [
        (b"\xff\xd8\xff\xe0 not really a jpeg", "image/jpeg", Reason.NOT_AN_IMAGE),
        (image_bytes("PNG", 50, 50)[:60], "image/png", Reason.NOT_AN_IMAGE),
        (image_bytes("PNG", 50, 50), "image/jpeg", Reason.CONTENT_TYPE_MISMATCH),
        (pixel_bomb_png(2000, 2000), "image/png", Reason.IMAGE_TOO_LARGE),
    ],
    ids=["garbage", "truncated", "mismatch", "bomb"],
)
def test_hostile_bytes_are_refused_with_a_reason(
    data: bytes, content_type: str, reason: str
) -> None:
    with pytest.raises(ContentRejected) as caught:
        thumbnail_of(data, content_type, max_pixels=1_000_000)
    assert caught.value.reason == reason
