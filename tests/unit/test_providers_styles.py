"""The stub's Pillow styles: each restyles the photo visibly and differently, keeps its
size and upright orientation, and refuses inputs it must not decode."""

from __future__ import annotations

import io
import itertools

import pytest
from PIL import Image, ImageChops

from services.creation.providers.stub.styles import STYLES, InputUnreadable, render
from tests.support.media import pixel_bomb_png
from tests.support.pictures import decode, encode, mean_difference, scene

LIMIT = 40_000_000
SEEDED = ["natural", "watercolor", "anime", "noir"]


def rendered(style: str, data: bytes | None = None, outputs: int = 1) -> list[Image.Image]:
    return [decode(o.data) for o in render(data or encode(scene()), style, outputs, LIMIT)]


def test_every_seeded_style_has_its_own_transform() -> None:
    assert set(SEEDED) <= set(STYLES)


@pytest.mark.parametrize("style", sorted(STYLES))
def test_each_style_changes_the_photo_visibly(style: str) -> None:
    (output,) = rendered(style)
    assert output.size == scene().size
    assert mean_difference(output, scene()) > 6


def test_the_styles_differ_from_one_another() -> None:
    outputs = {style: rendered(style)[0] for style in STYLES}
    for a, b in itertools.combinations(sorted(outputs), 2):
        assert mean_difference(outputs[a], outputs[b]) > 4, (a, b)


def test_noir_and_sketch_are_black_and_white_and_watercolor_is_not() -> None:
    def gray(image: Image.Image) -> bool:
        red, green, blue = image.split()
        same = ImageChops.difference(red, green), ImageChops.difference(green, blue)
        return all(difference.getbbox() is None for difference in same)

    for style in ("noir", "sketch"):
        assert gray(rendered(style)[0]), style
    assert not gray(rendered("watercolor")[0])


def test_an_unknown_style_passes_the_photo_through() -> None:
    (output,) = rendered("no-such-style")
    assert mean_difference(output, scene()) == 0


def test_the_outputs_are_as_many_as_asked_and_differ() -> None:
    outputs = render(encode(scene()), "natural", 4, LIMIT)
    assert len(outputs) == 4
    assert len({o.data for o in outputs}) == 4
    assert all((o.width, o.height) == (96, 64) for o in outputs)


def test_the_same_request_renders_the_same_bytes() -> None:
    data = encode(scene(), "JPEG")
    assert render(data, "anime", 2, LIMIT) == render(data, "anime", 2, LIMIT)


def test_a_jpeg_stays_a_jpeg_and_a_png_a_png() -> None:
    (jpeg,) = render(encode(scene(), "JPEG"), "oil", 1, LIMIT)
    (png,) = render(encode(scene(), "PNG"), "oil", 1, LIMIT)
    (webp,) = render(encode(scene(), "WEBP"), "oil", 1, LIMIT)
    assert jpeg.content_type == "image/jpeg" and jpeg.data.startswith(b"\xff\xd8")
    assert png.content_type == "image/png" and png.data.startswith(b"\x89PNG")
    assert webp.content_type == "image/png"


def test_transparency_is_kept() -> None:
    photo = scene().convert("RGBA")
    photo.putpixel((90, 60), (0, 0, 0, 0))
    (output,) = render(encode(photo), "watercolor", 1, LIMIT)
    with Image.open(io.BytesIO(output.data)) as image:
        assert image.mode == "RGBA" and image.getpixel((90, 60))[3] == 0


@pytest.mark.parametrize("orientation", [6, 8, 3])
def test_an_exif_rotated_jpeg_comes_out_upright(orientation: int) -> None:
    upright = scene(96, 64)
    # Store the pixels turned so that a viewer obeying the tag shows them upright.
    stored = {
        6: upright.transpose(Image.Transpose.ROTATE_90),
        8: upright.transpose(Image.Transpose.ROTATE_270),
        3: upright.transpose(Image.Transpose.ROTATE_180),
    }[orientation]
    (output,) = render(encode(stored, "JPEG", orientation), "natural", 1, LIMIT)
    assert (output.width, output.height) == (96, 64)
    picture = decode(output.data)
    assert picture.size == (96, 64)
    # The red block is still in the top-left corner, where the viewer saw it.
    red, green, blue = picture.getpixel((4, 4))
    assert red > 150 and green < 90 and blue < 90
    # And the whole picture matches the upright photo's rendering (but for JPEG noise).
    (expected,) = rendered("natural", encode(upright, "JPEG"))
    assert mean_difference(picture, expected) < 4


def test_an_image_over_the_pixel_limit_is_refused_before_decoding() -> None:
    with pytest.raises(InputUnreadable, match="8000x6000 pixels; at most 40000000"):
        render(pixel_bomb_png(8000, 6000), "natural", 1, LIMIT)


@pytest.mark.parametrize("data", [b"", b"not an image", encode(scene(), "GIF"), b"\x89PNG\r\n"])
def test_bytes_that_are_not_a_jpeg_png_or_webp_are_refused(data: bytes) -> None:
    with pytest.raises(InputUnreadable, match="not a readable JPEG, PNG or WebP"):
        render(data, "natural", 1, LIMIT)


def bands(width: int, height: int, edge: int) -> Image.Image:
    """Green, with a red band ``edge`` px wide on the left and a blue one on the right."""
    image = Image.new("RGB", (width, height), (20, 200, 20))
    image.paste((220, 20, 20), (0, 0, edge, height))
    image.paste((20, 20, 220), (width - edge, 0, width, height))
    return image


def test_the_output_fills_the_size_asked_cropped_around_the_centre() -> None:
    # 800x600 scaled to 683x512 covers 512x512; 85 px go on each side, and the 80 px
    # bands (68 px once scaled) with them.
    photo = encode(bands(800, 600, 80))
    (output,) = render(photo, "no-such-style", 1, LIMIT, (512, 512))
    picture = decode(output.data)
    assert picture.size == (output.width, output.height) == (512, 512)
    for x in (0, 255, 511):
        red, green, blue = picture.getpixel((x, 256))
        assert green > 180 and red < 60 and blue < 60, (x, picture.getpixel((x, 256)))


@pytest.mark.parametrize(
    ("source", "asked"),
    [((800, 600), (512, 512)), ((96, 64), (768, 1024)), ((600, 800), (640, 320))],
)
def test_every_output_is_the_size_asked_whatever_the_input(
    source: tuple[int, int], asked: tuple[int, int]
) -> None:
    outputs = render(encode(scene(*source), "JPEG"), "watercolor", 2, LIMIT, asked)
    assert [decode(o.data).size for o in outputs] == [asked, asked]
    assert [(o.width, o.height) for o in outputs] == [asked, asked]
