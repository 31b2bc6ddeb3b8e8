"""An image request's width and height, read from its header without decoding it.

What ``shape_groups`` groups images by when the handler defines no ``item_shape``
(``ts_microbatch.core.shapes``): PIL opens an image lazily, reading only its header, so
this costs microseconds even for a 12 MP photo. A body sent as base64 text (a KServe
instance, a JSON ``data`` field) is decoded only as far as the header needs. The shape is
the stored one: an EXIF orientation tag is not applied (TorchServe's ``VisionHandler`` does
not apply it either; a handler that turns photos upright defines ``item_shape``).
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping
from typing import Any

# Base64 characters decoded to find a header first: 96 KiB of image, past any EXIF block
# (at most 64 KiB) in front of a JPEG's frame header.
_HEADER_CHARS = 128 * 1024


def image_shape(item: Any) -> tuple[int, int] | None:
    """``item``'s (width, height) from its image header; None when its body is not an
    image PIL can open (the stage that decodes it reports what is wrong)."""
    body = item.get("data", item.get("body")) if isinstance(item, Mapping) else item
    if isinstance(body, str):
        return _shape_of_base64(body)
    if isinstance(body, (bytes, bytearray, memoryview)):
        return _shape_of_bytes(bytes(body) if isinstance(body, memoryview) else body)
    return None


def _shape_of_bytes(data: bytes | bytearray) -> tuple[int, int] | None:
    from PIL import Image  # the handler's dependency, loaded only when shapes are read

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Exception:  # not an image, or a header PIL cannot read
        return None
    return (int(width), int(height))


def _shape_of_base64(text: str) -> tuple[int, int] | None:
    head = text[: _HEADER_CHARS - _HEADER_CHARS % 4]
    try:
        shape = _shape_of_bytes(base64.b64decode(head, validate=True))
        if shape is None and len(head) < len(text):
            shape = _shape_of_bytes(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return None
    return shape
