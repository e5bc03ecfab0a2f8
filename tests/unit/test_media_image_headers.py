"""An output's header judged alone (services/media/image_headers.py): the size of every
WebP flavour from its first chunk, PNG and JPEG through Pillow's parsers, a bomb refused
from the header's claim, the wrong format named, and a head too short asked to grow."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from services.media.errors import ContentRejected
from services.media.image_headers import NeedMore, header_dimensions
from services.media.images import Dimensions
from tests.support.media import image_bytes, pixel_bomb_png


def webp(mode: str, lossless: bool, size: tuple[int, int] = (321, 123)) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, "WEBP", lossless=lossless)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "data",
    [
        webp("RGB", lossless=False),  # VP8
        webp("RGB", lossless=True),  # VP8L
        webp("RGBA", lossless=False),  # VP8X (alpha)
    ],
)
def test_a_webp_size_is_read_from_its_first_chunk(data: bytes) -> None:
    assert header_dimensions(data[:64], "image/webp", 10**6, whole=False) == Dimensions(321, 123)


@pytest.mark.parametrize(("fmt", "content_type"), [("PNG", "image/png"), ("JPEG", "image/jpeg")])
def test_png_and_jpeg_sizes_come_from_their_headers(fmt: str, content_type: str) -> None:
    data = image_bytes(fmt, 300, 200)
    assert header_dimensions(data, content_type, 10**6, whole=True) == Dimensions(300, 200)


def test_a_bomb_is_refused_from_its_claim() -> None:
    bomb = pixel_bomb_png(20_000, 20_000)
    with pytest.raises(ContentRejected) as refused:
        header_dimensions(bomb[:1024], "image/png", 50_000_000, whole=False)
    assert refused.value.reason == "IMAGE_TOO_LARGE"
    big_webp = webp("RGB", lossless=True, size=(8000, 8000))
    with pytest.raises(ContentRejected) as refused:
        header_dimensions(big_webp[:64], "image/webp", 50_000_000, whole=False)
    assert refused.value.reason == "IMAGE_TOO_LARGE"


@pytest.mark.parametrize(
    ("data", "declared"),
    [
        (image_bytes("PNG"), "image/webp"),
        (image_bytes("JPEG"), "image/png"),
        (webp("RGB", lossless=False), "image/jpeg"),
    ],
)
def test_another_format_than_declared_is_refused(data: bytes, declared: str) -> None:
    with pytest.raises(ContentRejected) as refused:
        header_dimensions(data, declared, 10**6, whole=True)
    assert refused.value.reason == "CONTENT_TYPE_MISMATCH"


def test_a_short_head_asks_for_more_and_a_whole_non_image_is_refused() -> None:
    jpeg = image_bytes("JPEG", 300, 200)
    with pytest.raises(NeedMore):
        header_dimensions(jpeg[:40], "image/jpeg", 10**6, whole=False)
    with pytest.raises(ContentRejected) as refused:
        header_dimensions(b"GIF89a" + b"\x00" * 100, "image/png", 10**6, whole=True)
    assert refused.value.reason == "NOT_AN_IMAGE"
