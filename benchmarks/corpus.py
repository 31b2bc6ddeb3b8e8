"""The request bodies the benchmarks send: photos generated here, at the sizes users send.

Photo-like JPEGs (smooth colour fields plus sensor-like grain: ``prepare.make_jpeg``) at
camera and screen sizes with stated qualities, a phone portrait stored sideways with an
EXIF orientation tag, thumbnails, and a PNG screenshot (flat panels, hard edges, text-like
strokes: what PNG is used for). ``MIX`` is the weighted mix benchmark-ab.py sends as
``"mix"``: each body gets that share of the clients.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import prepare
from PIL import Image, ImageDraw


class Body(NamedTuple):
    name: str
    data: bytes
    content_type: str
    description: str


def _portrait_stored_sideways(seed: int) -> bytes:
    upright = Image.open(io.BytesIO(prepare.make_jpeg(seed, size=(3024, 4032), quality=92)))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display, as phones store portraits
    buf = io.BytesIO()
    upright.transpose(Image.Transpose.ROTATE_90).save(buf, "JPEG", quality=92, exif=exif)
    return buf.getvalue()


def _screenshot(seed: int, size: tuple[int, int] = (1280, 800)) -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", size, (245, 245, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, size[0], 48), fill=(40, 60, 90))  # title bar
    draw.rectangle((0, 48, 220, size[1]), fill=(225, 228, 232))  # sidebar
    for row in range(60, size[1] - 20, 22):  # lines of "text"
        x = 240
        while x < size[0] - 60:
            word = int(rng.integers(20, 90))
            draw.rectangle((x, row, x + word, row + 9), fill=(60, 60, 60))
            x += word + 8
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


JPEG, PNG = "image/jpeg", "image/png"
# name: (maker, content type, description)
SPECS: dict[str, tuple[Callable[[], bytes], str, str]] = {
    "720px": (lambda: prepare.make_jpeg(0), JPEG, "720x720 JPEG, q85 (the default test image)"),
    "12mp": (lambda: prepare.make_jpeg(1, (4032, 3024), 92), JPEG, "4032x3024 JPEG, q92"),
    "12mp-portrait-exif": (
        lambda: _portrait_stored_sideways(6),
        JPEG,
        "3024x4032 portrait stored sideways, EXIF orientation 6, q92",
    ),
    "1080p": (lambda: prepare.make_jpeg(2, (1920, 1080)), JPEG, "1920x1080 JPEG, q85"),
    "720p": (lambda: prepare.make_jpeg(3, (1280, 720)), JPEG, "1280x720 JPEG, q85"),
    "vga": (lambda: prepare.make_jpeg(4, (640, 480)), JPEG, "640x480 JPEG, q85"),
    "thumb": (lambda: prepare.make_jpeg(5, (160, 120)), JPEG, "160x120 JPEG thumbnail, q85"),
    "screenshot": (lambda: _screenshot(7), PNG, "1280x800 PNG screenshot, RGB"),
}


@cache
def bodies() -> dict[str, Body]:
    """Every body by name; made once per process (the 12 MP ones take a second)."""
    return {
        name: Body(name, make(), content_type, description)
        for name, (make, content_type, description) in SPECS.items()
    }


# The mix: what an app that takes photos and screenshots sends. Shares of the clients.
MIX: dict[str, float] = {
    "12mp": 0.20,
    "12mp-portrait-exif": 0.15,
    "1080p": 0.20,
    "720p": 0.15,
    "vga": 0.10,
    "thumb": 0.10,
    "screenshot": 0.10,
}


def names() -> tuple[str, ...]:
    """Body names benchmark-ab.py accepts: each body, and "mix"."""
    return (*SPECS, "mix")


def split(total: int, weights: dict[str, float], minimum: int = 1) -> dict[str, int]:
    """``total`` shared out in proportion to ``weights`` (largest remainders), each at
    least ``minimum``."""
    raw = {k: total * w / sum(weights.values()) for k, w in weights.items()}
    parts = {k: max(minimum, int(v)) for k, v in raw.items()}
    by_remainder = sorted(raw, key=lambda k: raw[k] - int(raw[k]), reverse=True)
    for key in by_remainder:
        if sum(parts.values()) >= total:
            break
        parts[key] += 1
    return parts


def write(out_dir: Path) -> dict[str, Path]:
    """Every body as a file in ``out_dir``; name -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for body in bodies().values():
        suffix = ".png" if body.content_type == "image/png" else ".jpg"
        paths[body.name] = out_dir / f"{body.name}{suffix}"
        paths[body.name].write_bytes(body.data)
    return paths
