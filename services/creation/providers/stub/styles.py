"""The stub's "generation": the input photo restyled with Pillow. Blocking; run it in a
worker thread.

Deterministic: the same input, style and output count give the same bytes, so a process
that never saw a request can recompute its result (the stub resumes after a crash). The
image is turned upright first (EXIF orientation), keeps its size, and each style looks
visibly different; an unknown style is passed through unchanged.
"""

from __future__ import annotations

import io
from collections.abc import Callable

from PIL import Image, ImageChops, ImageEnhance, ImageFilter, ImageOps, UnidentifiedImageError

from services.creation.providers.base import OutputImage

_DECODERS = ("JPEG", "PNG", "WEBP")


class InputUnreadable(Exception):
    """The input is not a decodable image within the pixel limit."""


# The slow filters (median, mode) work on a copy of at most this many pixels, scaled back
# up after: brush strokes need no more detail, and a 12 MP photo renders in well under 1 s.
_SMOOTHING_PIXELS = 500_000


def _smoothed(image: Image.Image, smooth: Callable[[Image.Image], Image.Image]) -> Image.Image:
    width, height = image.size
    scale = (_SMOOTHING_PIXELS / (width * height)) ** 0.5
    if scale >= 1:
        return smooth(image)
    small = image.resize((max(1, int(width * scale)), max(1, int(height * scale))))
    return smooth(small).resize(image.size, Image.Resampling.BICUBIC)


def _natural(image: Image.Image) -> Image.Image:
    # A light touch: stretch the levels, a little more colour and crispness.
    image = ImageOps.autocontrast(image, cutoff=1)
    image = ImageEnhance.Color(image).enhance(1.25)
    return ImageEnhance.Sharpness(image).enhance(1.5)


def _watercolor(image: Image.Image) -> Image.Image:
    # Soft washes: smoothed, few tones, lifted towards the paper's white.
    image = _smoothed(
        image, lambda i: i.filter(ImageFilter.MedianFilter(5)).filter(ImageFilter.SMOOTH_MORE)
    )
    image = ImageOps.posterize(image, 3)
    image = image.filter(ImageFilter.GaussianBlur(1))
    return Image.blend(image, Image.new("RGB", image.size, (250, 246, 236)), 0.3)


def _edges(image: Image.Image) -> Image.Image:
    """Dark lines where the picture has edges, white elsewhere (grayscale)."""
    gray = ImageOps.grayscale(image).filter(ImageFilter.SMOOTH)
    lines = gray.filter(ImageFilter.FIND_EDGES)
    return ImageOps.invert(ImageOps.autocontrast(lines))


def _anime(image: Image.Image) -> Image.Image:
    # Flat, bright colours with dark outlines.
    flat = ImageOps.posterize(_smoothed(image, lambda i: i.filter(ImageFilter.MedianFilter(3))), 2)
    flat = ImageEnhance.Color(flat).enhance(1.8)
    outline = _edges(image).point(lambda v: 255 if v > 160 else 0)
    return ImageChops.multiply(flat, outline.convert("RGB"))


def _noir(image: Image.Image) -> Image.Image:
    # Black and white, hard contrast.
    gray = ImageOps.autocontrast(ImageOps.grayscale(image), cutoff=3)
    return ImageEnhance.Contrast(gray).enhance(1.8).convert("RGB")


def _sketch(image: Image.Image) -> Image.Image:
    # Pencil lines on paper.
    return _edges(image).convert("RGB")


def _oil(image: Image.Image) -> Image.Image:
    # Thick, blended strokes, rich colour.
    image = _smoothed(image, lambda i: i.filter(ImageFilter.ModeFilter(5)))
    image = image.filter(ImageFilter.EDGE_ENHANCE)
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
    """Output ``index`` of several: each a little brighter than the one before."""
    if index == 0:
        return image
    return ImageEnhance.Brightness(image).enhance(1 + 0.08 * index)


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


def render(data: bytes, style_id: str, num_outputs: int, max_pixels: int) -> list[OutputImage]:
    """``num_outputs`` restyled copies of the image in ``data``; raises InputUnreadable."""
    image, source_format = _decode(data, max_pixels)
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
