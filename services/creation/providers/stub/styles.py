"""The stub's "generation": the input photo restyled with Pillow. Blocking; run it in a
worker thread.

Deterministic: the same input, style and output count give the same bytes, so a process
that never saw a request can recompute its result (the stub resumes after a crash). The
image is turned upright first (EXIF orientation), then scaled and cropped (centred) to fill
the size the job asked for, as a model returns what it was asked; each style looks visibly
different, and an unknown style is passed through unchanged.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable

from PIL import (
    Image,
    ImageChops,
    ImageDraw,
    ImageEnhance,
    ImageFilter,
    ImageOps,
    UnidentifiedImageError,
)

from services.creation.providers.base import OutputImage

_DECODERS = ("JPEG", "PNG", "WEBP")


class InputUnreadable(Exception):
    """The input is not a decodable image within the pixel limit."""


# Every filter here is linear in the pixels (no median or mode filter, which sort a window
# per pixel): the stub must stay cheap next to the engine it exercises.


def _natural(image: Image.Image) -> Image.Image:
    # A light touch: a little more contrast, colour and crispness.
    image = ImageEnhance.Contrast(image).enhance(1.2)
    image = ImageEnhance.Color(image).enhance(1.25)
    return ImageEnhance.Sharpness(image).enhance(1.5)


def _watercolor(image: Image.Image) -> Image.Image:
    # Soft washes: blurred, few tones, lifted towards the paper's white.
    image = ImageOps.posterize(image.filter(ImageFilter.GaussianBlur(2)), 3)
    image = Image.blend(image, Image.new("RGB", image.size, (250, 246, 236)), 0.3)
    return image.filter(ImageFilter.SMOOTH)


def _edges(image: Image.Image) -> Image.Image:
    """Dark lines where the picture has edges, white elsewhere (grayscale)."""
    gray = ImageOps.grayscale(image).filter(ImageFilter.SMOOTH)
    lines = gray.filter(ImageFilter.FIND_EDGES)
    # Edges are faint: scale them up (clipped at white), then draw them dark on white.
    return ImageOps.invert(lines.point(lambda v: min(255, v * 4)))


def _anime(image: Image.Image) -> Image.Image:
    # Flat, bright colours with dark outlines.
    flat = ImageOps.posterize(image.filter(ImageFilter.SMOOTH_MORE), 2)
    flat = ImageEnhance.Color(flat).enhance(1.8)
    outline = _edges(image).point(lambda v: 255 if v > 160 else 0)
    return ImageChops.multiply(flat, outline.convert("RGB"))


def _noir(image: Image.Image) -> Image.Image:
    # Black and white, hard contrast.
    gray = ImageEnhance.Contrast(ImageOps.grayscale(image)).enhance(2.2)
    return gray.convert("RGB")


def _sketch(image: Image.Image) -> Image.Image:
    # Pencil lines on paper.
    return _edges(image).convert("RGB")


def _oil(image: Image.Image) -> Image.Image:
    # Thick, blended strokes with hard borders, rich colour.
    image = image.filter(ImageFilter.SMOOTH_MORE).filter(ImageFilter.SMOOTH_MORE)
    image = ImageOps.posterize(image, 4).filter(ImageFilter.EDGE_ENHANCE_MORE)
    return ImageEnhance.Color(image).enhance(1.5)


STYLES: dict[str, Callable[[Image.Image], Image.Image]] = {
    "natural": _natural,
    "watercolor": _watercolor,
    "anime": _anime,
    "noir": _noir,
    "sketch": _sketch,
    "oil": _oil,
}


def _neutral(image: Image.Image) -> Image.Image:
    return image


def _variant(image: Image.Image, index: int) -> Image.Image:
    """Output ``index`` of several, told apart at a glance: each brighter than the one
    before, and every other one mirrored (same size and orientation)."""
    if index == 0:
        return image
    variant = ImageEnhance.Brightness(image).enhance(1 + 0.2 * index)
    return ImageOps.mirror(variant) if index % 2 else variant


def _decode(data: bytes, max_pixels: int) -> tuple[Image.Image, str]:
    try:
        with Image.open(io.BytesIO(data), formats=_DECODERS) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise InputUnreadable(
                    f"the input has {width}x{height} pixels; at most {max_pixels} are accepted"
                )
            upright = ImageOps.exif_transpose(image)
            upright.load()
            return upright, image.format or "PNG"
    except Image.DecompressionBombError:
        raise InputUnreadable(f"the input has more than {max_pixels} pixels") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        raise InputUnreadable("the input is not a readable JPEG, PNG or WebP image") from None


def paint(prompt: str, size: tuple[int, int]) -> Image.Image:
    """The stub's text-to-image: a picture that depends on the prompt alone (the same
    prompt paints the same picture): a diagonal blend of two colours taken from the
    prompt's hash, with a disc of a third."""
    digest = hashlib.sha256(prompt.encode()).digest()
    width, height = size
    first = Image.new("RGB", size, (digest[0], digest[1], digest[2]))
    second = Image.new("RGB", size, (digest[3], digest[4], digest[5]))
    ramp = Image.linear_gradient("L").resize(size).rotate(digest[6] % 4 * 90)
    picture = Image.composite(first, second, ramp.resize(size))
    radius = min(width, height) * (20 + digest[7] % 20) // 100
    cx = width * (25 + digest[8] % 50) // 100
    cy = height * (25 + digest[9] % 50) // 100
    ImageDraw.Draw(picture).ellipse(
        (cx - radius, cy - radius, cx + radius, cy + radius),
        fill=(digest[10], digest[11], digest[12]),
    )
    return picture


def _fill(image: Image.Image, size: tuple[int, int] | None) -> Image.Image:
    """``image`` scaled to cover ``size`` and cropped to it around its centre (None:
    as it is)."""
    if size is None or image.size == size:
        return image
    return ImageOps.fit(image, size, method=Image.Resampling.LANCZOS, centering=(0.5, 0.5))


def render(
    data: bytes,
    style_id: str,
    num_outputs: int,
    max_pixels: int,
    size: tuple[int, int] | None = None,
    prompt: str | None = None,
) -> list[OutputImage]:
    """``num_outputs`` restyled copies of the image in ``data``, each ``size`` (width,
    height) when given, else the input's; raises InputUnreadable. With ``prompt`` (a
    request without an input), the prompt's own picture is painted instead (PNG)."""
    if prompt is not None:
        image, source_format = paint(prompt, size or (512, 512)), "PNG"
    else:
        image, source_format = _decode(data, max_pixels)
    image = _fill(image, size)
    alpha = image.getchannel("A") if "A" in image.getbands() else None
    styled = STYLES.get(style_id, _neutral)(image.convert("RGB"))
    # A JPEG photo stays a JPEG; anything else (transparency, WebP) becomes a PNG.
    as_jpeg = source_format == "JPEG" and alpha is None
    outputs = []
    for index in range(num_outputs):
        picture = _variant(styled, index)
        if alpha is not None:
            picture = picture.convert("RGBA")
            picture.putalpha(alpha)
        buffer = io.BytesIO()
        if as_jpeg:
            picture.save(buffer, format="JPEG", quality=90)
        else:
            picture.save(buffer, format="PNG")
        outputs.append(
            OutputImage(
                data=buffer.getvalue(),
                content_type="image/jpeg" if as_jpeg else "image/png",
                width=picture.width,
                height=picture.height,
            )
        )
    return outputs
