"""A handler whose inference stacks its micro-batch (tests only).

Each photo is decoded at its own size, so a micro-batch holding a landscape and a portrait
photo fails to stack (``stack expects each tensor to be equal size``: a failure of company,
each photo alone is served), and a grayscale photo fails at inference on its own (a
RuntimeError with no 4xx meaning: 500, alone as in any batch). The answer is each photo's
per-channel mean, which depends on the photo alone. KServe instances carry base64.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor
from ts.torch_handler.image_classifier import ImageClassifier

from ts_microbatch import MicroBatchingMixin


class StackingHandler(MicroBatchingMixin, ImageClassifier):  # type: ignore[misc]
    def preprocess(self, data: list[Any]) -> list[torch.Tensor]:
        rows = []
        for row in data:
            body = row.get("data") or row.get("body")
            if isinstance(body, str):  # a KServe instance: base64
                body = base64.b64decode(body, validate=True)
            image = Image.open(io.BytesIO(bytes(body)))
            rows.append(pil_to_tensor(image).float())
        return rows

    def inference(self, data: list[torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        for tensor in data:
            if tensor.shape[0] != 3:
                raise RuntimeError(f"expected 3 channels, got {tensor.shape[0]}")
        return torch.stack(data).mean(dim=(2, 3))

    def postprocess(self, data: torch.Tensor) -> list[list[float]]:
        return [[round(float(v), 3) for v in row] for row in data]
