"""A detector with micro-batching: TorchServe's ``ObjectDetector`` behind the mixin.

Photos come in many sizes. TorchServe's ``VisionHandler.preprocess`` stacks a batch's
images into one tensor, which fails as soon as two sizes meet; torchvision's detectors take
a list of images of any sizes and pad them to the largest of the list themselves. So
preprocess here keeps the images as a list (a stage may pass any object to the next), and
inference hands the list to the model. With ``shape_groups: aspect`` in the config the
pipeline also puts only images of one aspect ratio in a micro-batch, which the detector
resizes to one size: nothing is padded, and every image's boxes are the ones it gets alone
(docs/images.md says what changes without it).

Settings, in the ``handler:`` section of model-config.yaml: ``threshold``, the lowest score
of a box answered (ObjectDetector's 0.5 by default; the example's untrained weights score
every box near 1/91, so its build sets 0), and ``decimals``, the places box coordinates
are rounded to in the answer (scores get two more).
"""

from __future__ import annotations

import base64
import io
from typing import Any

import torch
from PIL import Image
from ts.torch_handler.object_detector import ObjectDetector

from ts_microbatch import InvalidInputError, MicroBatchingMixin


class DetectorHandler(MicroBatchingMixin, ObjectDetector):  # type: ignore[misc]
    decimals = 2

    def initialize(self, context: Any) -> None:
        settings = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        self.threshold = float(settings.get("threshold", ObjectDetector.threshold))
        self.decimals = int(settings.get("decimals", self.decimals))
        super().initialize(context)

    def preprocess(self, data: list[Any]) -> list[torch.Tensor]:
        """One (3, H, W) tensor per request, of its own size: a list, never stacked."""
        return [self.image_processing(_image(row)) for row in data]

    def inference(self, data: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            return self.model([image.to(self.device) for image in data])

    def postprocess(self, data: list[dict[str, torch.Tensor]]) -> list[Any]:
        answers = super().postprocess(data)
        return [[_rounded(box, self.decimals) for box in boxes] for boxes in answers]


def _image(row: Any) -> Image.Image:
    body = row.get("data") or row.get("body") if isinstance(row, dict) else row
    if isinstance(body, str):
        body = base64.b64decode(body)
    if not isinstance(body, (bytes, bytearray)) or not body:
        raise InvalidInputError("the request body is empty: send an image")
    return Image.open(io.BytesIO(body)).convert("RGB")


def _rounded(box: dict[str, Any], decimals: int) -> dict[str, Any]:
    """ObjectDetector's ``{label: [x1, y1, x2, y2], "score": s}``, rounded."""
    return {
        key: round(value, decimals + 2) if key == "score" else [round(v, decimals) for v in value]
        for key, value in box.items()
    }
