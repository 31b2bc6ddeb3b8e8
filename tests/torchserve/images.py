"""Test inputs and contexts for the handler tests: JPEGs, a decompression bomb, a TorchServe
Context built by hand, the example handler module."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image
from ts.context import Context

from tests.helpers import load_module
from ts_microbatch.tools import tune

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
    return tune.make_context(model_dir, batch, manifest, yaml_config or {})


new_batch = tune.fresh_batch


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
