"""An image model's answer against the same photo's answer alone, within the tolerance
docs/images.md states (#exact-and-equal): which request gets which answer and the rows the
model sees are exact; the floats are equal within the CPU kernels' batch dependence
(benchmarks/dev/batch_exactness.py measures it). A row answered with another photo's
answer differs far beyond these."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from PIL import Image

# The detector example rounds boxes to 0.1 px and scores to 0.001: a last-digit change can
# carry a rounded value across a boundary, one step, never more.
BOX_PX = 0.1
SCORE = 0.001
# The segmenter: at most this fraction of a mask's pixels may change class
# (benchmarks/dev/results/batch_exactness/ has what was measured).
MASK_FLIPPED_FRACTION = 1e-3
_EPSILON = 1e-9  # rounding of the difference of two rounded decimals


def boxes_close(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    """The detector example's boxes: same count, labels and order; coordinates within
    BOX_PX, scores within SCORE."""
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if a.keys() != b.keys():
            return False
        for key, value in b.items():
            limit = SCORE if key == "score" else BOX_PX
            pairs = [(a[key], value)] if key == "score" else list(zip(a[key], value))
            if any(abs(x - y) > limit + _EPSILON for x, y in pairs):
                return False
    return True


def mask_of(answer: dict[str, Any]) -> np.ndarray:
    """The class index per pixel of a segmenter answer (its base64 PNG)."""
    png = base64.b64decode(answer["mask"])
    return np.asarray(Image.open(io.BytesIO(png)))


def flipped_fraction(got: dict[str, Any], want: dict[str, Any]) -> float:
    """The fraction of pixels whose class differs (1.0 when the sizes differ)."""
    a, b = mask_of(got), mask_of(want)
    if a.shape != b.shape or (got["width"], got["height"]) != (want["width"], want["height"]):
        return 1.0
    return float((a != b).mean())


def masks_close(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Same size; at most MASK_FLIPPED_FRACTION of the pixels of another class, and each
    class's count off by no more than the pixels that changed."""
    fraction = flipped_fraction(got, want)
    if fraction > MASK_FLIPPED_FRACTION:
        return False
    changed = round(fraction * got["width"] * got["height"])
    names = set(got["classes"]) | set(want["classes"])
    return all(abs(got["classes"].get(n, 0) - want["classes"].get(n, 0)) <= changed for n in names)
