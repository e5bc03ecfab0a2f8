"""Real photos for the provider tests, drawn with Pillow: a gradient with a red block in
the top-left corner and a blue disc, so styles have colours and edges to work on."""

from __future__ import annotations

import io

from PIL import Image, ImageChops, ImageDraw, ImageStat

# EXIF tag 0x0112: how a viewer must turn the stored pixels to show them upright.
ORIENTATION = 0x0112


def scene(width: int = 96, height: int = 64) -> Image.Image:
    image = Image.new("RGB", (width, height))
    image.putdata(
        [
            ((x * 255) // width, (y * 255) // height, 160 - (x * 80) // width)
            for y in range(height)
            for x in range(width)
        ]
    )
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, width // 4, height // 4), fill=(220, 20, 20))
    draw.ellipse(
        (width // 2, height // 3, width // 2 + height // 2, height // 3 + height // 2),
        fill=(20, 40, 220),
    )
    return image


def encode(image: Image.Image, fmt: str = "PNG", orientation: int | None = None) -> bytes:
    buffer = io.BytesIO()
    if orientation is None:
        image.save(buffer, fmt)
    else:
        exif = Image.Exif()
        exif[ORIENTATION] = orientation
        image.save(buffer, fmt, exif=exif.tobytes())
    return buffer.getvalue()


def decode(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return image.convert("RGB")


def mean_difference(a: Image.Image, b: Image.Image) -> float:
    """Mean absolute difference per channel, 0-255."""
    return sum(ImageStat.Stat(ImageChops.difference(a, b)).mean) / 3
