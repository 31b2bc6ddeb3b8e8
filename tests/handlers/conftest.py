"""Real handlers on a real (untrained) ResNet-18, with a TorchServe Context built by hand."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from ts.context import Context

from tests.conftest import ROOT, load_module
from ts_microbatch.tools import tune

prepare = load_module("examples/image_classifier/prepare.py", "ts_microbatch_example_prepare")
make_jpeg = prepare.make_jpeg


@pytest.fixture(autouse=True, scope="module")
def fresh_model_module() -> Iterator[None]:
    """A TorchServe worker serves one model, so its loader imports the model file by its
    plain name ("model"); this process loads several models, and a module must not get the
    one another module's model left in sys.modules."""
    sys.modules.pop("model", None)
    yield
    sys.modules.pop("model", None)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A model directory laid out as TorchServe extracts a .mar."""
    directory = tmp_path_factory.mktemp("resnet18")
    shutil.copy(os.path.join(ROOT, "examples/image_classifier/model.py"), directory / "model.py")
    torch.manual_seed(0)
    from torchvision.models import resnet18

    torch.save(resnet18(weights=None).state_dict(), directory / "resnet18.pth")
    prepare.write_labels(str(directory))
    shutil.copy(
        os.path.join(ROOT, "configs/micro_batching.json"), directory / "micro_batching.json"
    )
    sys.path.insert(0, str(directory))  # TorchServe puts the model dir on sys.path
    yield directory
    sys.path.remove(str(directory))


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


__all__ = [
    "bomb_png",
    "jpeg_rows",
    "json",
    "load_handler_module",
    "make_context",
    "make_jpeg",
    "new_batch",
    "statuses",
    "top5",
]
