"""Draws the playground's icon, web/playground/favicon.ico (16, 32 and 48 px): a rounded
square in the page's accent colour with a white brush stroke and a dot of paint. Our own
drawing, made with Pillow; run it again after changing it:
`.venv/bin/python scripts/make_favicon.py`."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

OUT = Path(__file__).resolve().parents[1] / "web" / "playground" / "favicon.ico"
ACCENT = (61, 90, 254, 255)  # --accent in style.css
WHITE = (255, 255, 255, 255)
SIDE = 192  # drawn large, scaled down smoothly


def icon() -> Image.Image:
    image = Image.new("RGBA", (SIDE, SIDE), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    draw.rounded_rectangle((0, 0, SIDE - 1, SIDE - 1), radius=SIDE // 5, fill=ACCENT)
    # A brush stroke from the lower left up to the right, and a drop of paint.
    draw.line((44, 140, 128, 56), fill=WHITE, width=30)
    draw.ellipse((30, 126, 58, 154), fill=WHITE)
    draw.ellipse((114, 42, 142, 70), fill=WHITE)
    draw.ellipse((128, 118, 160, 150), fill=(255, 214, 0, 255))
    return image


def main() -> None:
    icon().save(OUT, format="ICO", sizes=[(16, 16), (32, 32), (48, 48)])
    print(f"{OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
