"""A handler whose inference stacks its micro-batch (tests only).

Each photo is decoded at its own size, so a micro-batch holding a landscape and a portrait
photo fails to stack (``stack expects each tensor to be equal size``: a failure of company,
each photo alone is served), and a grayscale photo fails at inference on its own (a
RuntimeError with no 4xx meaning: 500, alone as in any batch). The answer is each photo's
per-channel mean, which depends on the photo alone. KServe instances carry base64. The
body ``SLOW`` takes ``SLOW_S`` in preprocess (logging ``SLOW_ENTERED`` first) and answers
zeros: a request the test knows is in the pipeline.
"""

from __future__ import annotations

import base64
import io
import logging
import time
from typing import Any

import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor
from ts.torch_handler.image_classifier import ImageClassifier

from ts_microbatch import MicroBatchingMixin

logger = logging.getLogger(__name__)

SLOW = b"SLOW"
SLOW_S = 2.0
SLOW_ENTERED = "stacking handler: a SLOW request is in preprocess"


class StackingHandler(MicroBatchingMixin, ImageClassifier):  # type: ignore[misc]
    def preprocess(self, data: list[Any]) -> list[torch.Tensor]:
        rows = []
        for row in data:
            body = row.get("data") or row.get("body")
            if isinstance(body, str):  # a KServe instance: base64
                body = base64.b64decode(body, validate=True)
            if bytes(body) == SLOW:
                logger.warning(SLOW_ENTERED)
                time.sleep(SLOW_S)
                rows.append(torch.zeros(3, 48, 64))
                continue
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
