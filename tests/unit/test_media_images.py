"""Pillow's verdict on uploaded bytes: the three accepted formats pass with their
dimensions; anything else, a mismatch with the declared type, a broken image and a
decompression bomb are each refused with their own reason."""

from __future__ import annotations

import io
import threading

import pytest

from services.media.errors import ContentRejected, Reason
from services.media.images import Dimensions, ImageInspector, inspect
from tests.support.media import image_bytes, pixel_bomb_png

LIMIT = 50_000_000


def check(data: bytes, content_type: str, max_pixels: int = LIMIT) -> Dimensions:
    return inspect(io.BytesIO(data), content_type, max_pixels)


def reason_for(data: bytes, content_type: str, max_pixels: int = LIMIT) -> str:
    with pytest.raises(ContentRejected) as caught:
        check(data, content_type, max_pixels)
    return caught.value.reason


@pytest.mark.parametrize(
    ("fmt", "content_type"), [("JPEG", "image/jpeg"), ("PNG", "image/png"), ("WEBP", "image/webp")]
)
def test_accepted_formats_pass_with_their_dimensions(fmt: str, content_type: str) -> None:
    assert check(image_bytes(fmt, 120, 80), content_type) == Dimensions(120, 80)


def test_a_large_jpeg_is_decoded_in_full_at_reduced_scale() -> None:
    assert check(image_bytes("JPEG", 2001, 1003, quality=90), "image/jpeg") == Dimensions(
        2001, 1003
    )


@pytest.mark.parametrize(
    "data",
    [
        b"hello, this is plain text and certainly not an image\n" * 10,
        b"",
        b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        image_bytes("GIF"),
        image_bytes("BMP"),
    ],
    ids=["text", "empty", "svg", "gif", "bmp"],
)
def test_anything_but_jpeg_png_webp_is_not_an_image(data: bytes) -> None:
    assert reason_for(data, "image/png") == Reason.NOT_AN_IMAGE


@pytest.mark.parametrize(
    ("fmt", "declared"),
    [("PNG", "image/jpeg"), ("JPEG", "image/webp"), ("WEBP", "image/png")],
)
def test_bytes_of_another_accepted_format_are_a_mismatch(fmt: str, declared: str) -> None:
    assert reason_for(image_bytes(fmt), declared) == Reason.CONTENT_TYPE_MISMATCH


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_a_truncated_image_is_not_an_image(fmt: str) -> None:
    data = image_bytes(fmt, 300, 200)
    content_type = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}[fmt]
    assert reason_for(data[: len(data) // 2], content_type) == Reason.NOT_AN_IMAGE


def test_a_pixel_bomb_above_pillows_own_limit_is_refused() -> None:
    bomb = pixel_bomb_png(20_000, 20_000)  # 400 megapixels in ~50 KB
    assert len(bomb) < 100_000
    assert reason_for(bomb, "image/png") == Reason.IMAGE_TOO_LARGE


def test_our_pixel_limit_applies_before_any_decoding() -> None:
    bomb = pixel_bomb_png(8_000, 8_000)  # 64 megapixels: under Pillow's limit, over ours
    assert reason_for(bomb, "image/png", max_pixels=LIMIT) == Reason.IMAGE_TOO_LARGE
    assert reason_for(image_bytes("PNG", 100, 100), "image/png", max_pixels=9_999) == (
        Reason.IMAGE_TOO_LARGE
    )
    assert check(image_bytes("PNG", 100, 100), "image/png", max_pixels=10_000) == Dimensions(
        100, 100
    )


class ThreadRecordingFile(io.BytesIO):
    """Bytes that note which thread reads them."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.readers: set[int] = set()

    def read(self, size: int | None = -1, /) -> bytes:
        self.readers.add(threading.get_ident())
        return super().read(size)


async def test_the_inspector_runs_checks_off_the_event_loop() -> None:
    inspector = ImageInspector(max_pixels=LIMIT)
    loop_thread = threading.get_ident()
    image = ThreadRecordingFile(image_bytes("PNG", 33, 17))
    found = await inspector.inspect(image, "image/png")
    assert found == Dimensions(33, 17)
    # Pillow read the bytes, and never on the event loop's thread.
    assert image.readers
    assert loop_thread not in image.readers
    junk = ThreadRecordingFile(b"nope")
    with pytest.raises(ContentRejected):
        await inspector.inspect(junk, "image/png")
    assert junk.readers
    assert loop_thread not in junk.readers


async def in_memory_reason(data: bytes, content_type: str, max_pixels: int = LIMIT) -> str:
    inspector = ImageInspector(max_pixels=max_pixels)
    with pytest.raises(ContentRejected) as caught:
        await inspector.inspect(io.BytesIO(data), content_type, in_memory=True)
    return caught.value.reason


async def test_a_small_image_in_memory_is_checked_on_the_loop_with_every_check() -> None:
    inspector = ImageInspector(max_pixels=LIMIT)
    loop_thread = threading.get_ident()
    image = ThreadRecordingFile(image_bytes("PNG", 64, 48))
    assert await inspector.inspect(image, "image/png", in_memory=True) == Dimensions(64, 48)
    assert image.readers == {loop_thread}
    # The same verdicts as off the loop: truncation, type, pixel limits, bombs.
    for fmt, content_type in (("JPEG", "image/jpeg"), ("PNG", "image/png"), ("WEBP", "image/webp")):
        data = image_bytes(fmt, 120, 80)
        truncated = data[: len(data) // 2]
        assert await in_memory_reason(truncated, content_type) == Reason.NOT_AN_IMAGE
    assert await in_memory_reason(image_bytes("PNG"), "image/jpeg") == (
        Reason.CONTENT_TYPE_MISMATCH
    )
    assert await in_memory_reason(b"nope", "image/png") == Reason.NOT_AN_IMAGE
    assert await in_memory_reason(pixel_bomb_png(20_000, 20_000), "image/png") == (
        Reason.IMAGE_TOO_LARGE
    )
    assert await in_memory_reason(pixel_bomb_png(8_000, 8_000), "image/png") == (
        Reason.IMAGE_TOO_LARGE
    )
    assert await in_memory_reason(image_bytes("PNG", 100, 100), "image/png", 9_999) == (
        Reason.IMAGE_TOO_LARGE
    )


async def test_a_larger_image_in_memory_is_decoded_off_the_loop() -> None:
    inspector = ImageInspector(max_pixels=LIMIT)
    loop_thread = threading.get_ident()
    data = image_bytes("JPEG", 1001, 603, quality=90)
    image = ThreadRecordingFile(data)
    # The full size, not the reduced scale the JPEG was decoded at.
    assert await inspector.inspect(image, "image/jpeg", in_memory=True) == Dimensions(1001, 603)
    assert image.readers - {loop_thread}
    assert await in_memory_reason(data[: len(data) // 2], "image/jpeg") == Reason.NOT_AN_IMAGE
