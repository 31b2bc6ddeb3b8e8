"""Test inputs and contexts for the handler tests: JPEGs (as base64 the way encoders wrap
it, behind big APP segments), a decompression bomb, a TorchServe Context built by hand, the
example handler module."""

from __future__ import annotations

import base64
import io
import struct
from pathlib import Path
from typing import Any

from PIL import Image
from ts.context import Context

from tests.helpers import load_module
from ts_microbatch.tools import inprocess

prepare = load_module("examples/image_classifier/prepare.py", "ts_microbatch_example_prepare")
make_jpeg = prepare.make_jpeg


def make_context(model_dir: Path, batch: int, yaml_config: dict[str, Any] | None = None) -> Context:
    manifest = {
        "model": {
            "modelName": "resnet18",
            "serializedFile": "resnet18.pth",
            "modelFile": "model.py",
        }
    }
    return inprocess.make_context(model_dir, batch, manifest, yaml_config or {})


new_batch = inprocess.fresh_batch


def statuses(context: Context, batch: int) -> list[int]:
    return [context.get_response_status(i)[0] for i in range(batch)]


def jpeg_rows(
    n: int, size: tuple[int, int] = (320, 240), first_seed: int = 0
) -> list[dict[str, bytes]]:
    return [{"body": make_jpeg(first_seed + i, size=size)} for i in range(n)]


def bomb_png(width: int = 12_000, height: int = 12_000) -> bytes:
    """A small file that decodes to width*height pixels."""
    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, "PNG")
    return buf.getvalue()


def load_handler_module() -> Any:
    return load_module("handlers/micro_batching_handler.py", "micro_batching_handler")


def top5(result: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(result.items(), key=lambda kv: -kv[1])


def wrapped(data: bytes, columns: int, newline: str = "\n") -> str:
    """``data`` in base64, cut into lines of ``columns`` characters as encoders write it."""
    text = base64.b64encode(data).decode("ascii")
    return "".join(text[i : i + columns] + newline for i in range(0, len(text), columns))


def padded_to(data: bytes, remainder: int) -> bytes:
    """``data`` with zero bytes after it so that its length is ``remainder`` mod 3: its
    base64 then ends in no "=" (0), "==" (1) or "=" (2); PIL ignores bytes after the image."""
    return data + b"\0" * ((remainder - len(data)) % 3)


def with_app_segments(jpeg: bytes, total: int) -> bytes:
    """``jpeg`` with APP15 segments of ``total`` bytes in all between its SOI and the rest,
    so its frame header (SOF) sits ``total`` bytes further on, as behind a big EXIF, ICC
    profile or extended XMP block."""
    segments, left = [], total
    while left > 0:
        size = min(left, 65533)  # a segment's length field counts itself: at most 65535
        segments.append(b"\xff\xef" + struct.pack(">H", size + 2) + b"\x5a" * size)
        left -= size
    return jpeg[:2] + b"".join(segments) + jpeg[2:]
