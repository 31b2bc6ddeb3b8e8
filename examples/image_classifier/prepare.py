"""The ResNet-18 example's artifacts, made without downloading anything.

``write_weights`` copies the given torchvision weights or makes untrained ones, and says so
loudly; ``write_labels`` writes the ImageNet class names that torchvision ships;
``make_jpeg`` makes photo-like sample and test images.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys

import numpy as np
from PIL import Image

STANDARD_WEIGHTS = "resnet18-f37072fd.pth"


def make_jpeg(seed: int, size: tuple[int, int] = (720, 720), quality: int = 85) -> bytes:
    """A photo-like JPEG: smooth random colour fields plus grain, different for each seed."""
    rng = np.random.default_rng(seed)
    low = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    image = Image.fromarray(low).resize(size, Image.BICUBIC)
    pixels = np.asarray(image, dtype=np.int16) + rng.integers(-14, 15, size=(size[1], size[0], 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def write_weights(out_dir: str, weights: str | None) -> str:
    import torch
    from torchvision.models import resnet18

    path = os.path.join(out_dir, "resnet18.pth")
    if weights:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        resnet18(weights=None).load_state_dict(state)  # fails loudly on a wrong file
        shutil.copyfile(weights, path)
        print(f"Using the weights in {weights}")
    else:
        torch.manual_seed(0)
        torch.save(resnet18(weights=None).state_dict(), path)
        bar = "!" * 78
        print(
            f"{bar}\n!! No {STANDARD_WEIGHTS} given: created UNTRAINED ResNet-18 weights.\n"
            f"!! Predictions will be meaningless. Pass WEIGHTS=/path/{STANDARD_WEIGHTS}\n{bar}",
            file=sys.stderr,
        )
    return path


def write_labels(out_dir: str) -> str:
    from torchvision.models import ResNet18_Weights

    categories = ResNet18_Weights.IMAGENET1K_V1.meta["categories"]
    path = os.path.join(out_dir, "index_to_name.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({str(i): name for i, name in enumerate(categories)}, f, indent=0)
    return path
