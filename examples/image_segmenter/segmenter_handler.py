"""A segmenter with micro-batching: TorchServe's ``ImageSegmenter`` behind the mixin.

``ImageSegmenter`` resizes every photo to 256 on its short side and crops its centre to
224x224, so a mask covers the middle of a landscape photo only, and its answer is a nested
list of [class, probability] per pixel (1.4 MB of JSON for its 224x224 crop). Here:

- preprocess keeps each photo at its own aspect ratio, scaled down so its longer side is
  at most ``max_side`` (a setting), and returns a list (a stage may pass any object);
- ``item_shape`` answers the size the model will see, so ``shape_groups: exact`` puts
  photos that preprocess brings to one size in one micro-batch (640x480, 800x600 and
  1024x768 are all 520x390 at the default cap);
- inference stacks each same-size group of its micro-batch into one tensor and runs it:
  nothing is padded, whatever grouping the config asks for;
- postprocess answers one compact mask per photo: the per-pixel class as a PNG (one byte a
  pixel, at the size the model saw: the photo's under the cap) in base64, and the pixel
  count of each class present.

Settings, in the ``handler:`` section of model-config.yaml: ``max_side`` (520 by default,
the size torchvision's segmentation references evaluate at).
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import torch
from PIL import Image
from torchvision import transforms as T
from ts.torch_handler.image_segmenter import ImageSegmenter

from ts_microbatch import InvalidInputError, MicroBatchingMixin
from ts_microbatch.torchserve.images import image_shape


class SegmenterHandler(MicroBatchingMixin, ImageSegmenter):  # type: ignore[misc]
    max_side = 520
    image_processing = T.Compose(
        [T.ToTensor(), T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])]
    )

    def initialize(self, context: Any) -> None:
        settings = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        max_side = settings.get("max_side", self.max_side)
        if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 1:
            # Read before the model loads: a bad value fails registration, not a request.
            raise ValueError(f"handler.max_side: got {max_side!r}, expected an integer >= 1")
        self.max_side = max_side
        super().initialize(context)

    def item_shape(self, item: Any) -> tuple[int, int] | None:
        """The (width, height) the model sees: the header's size under the cap."""
        shape = image_shape(item)
        return None if shape is None else capped(shape, self.max_side)

    def preprocess(self, data: list[Any]) -> list[torch.Tensor]:
        """One normalized (3, H, W) tensor per request at its capped size: a list."""
        images = []
        for row in data:
            image = _image(row)
            size = capped(image.size, self.max_side)
            if size != image.size:
                image = image.resize(size, Image.BILINEAR)
            images.append(self.image_processing(image))
        return images

    def inference(self, data: list[torch.Tensor], *args: Any, **kwargs: Any) -> list[Any]:
        """(21, H, W) logits per image: one forward per same-size group of the list."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, image in enumerate(data):
            groups.setdefault(tuple(image.shape), []).append(index)
        logits: list[Any] = [None] * len(data)
        with torch.inference_mode():
            for indices in groups.values():
                batch = torch.stack([data[i] for i in indices]).to(self.device)
                for index, out in zip(indices, self.model(batch)["out"]):
                    logits[index] = out
        return logits

    def postprocess(self, data: list[torch.Tensor]) -> list[dict[str, Any]]:
        return [self.answer(out) for out in data]

    def answer(self, logits: torch.Tensor) -> dict[str, Any]:
        """The mask's PNG (the class index per pixel) and each present class's pixels."""
        classes = logits.argmax(0).to(torch.uint8)
        counts = torch.bincount(classes.flatten(), minlength=logits.shape[0]).tolist()
        names = self.mapping or {}
        png = io.BytesIO()
        Image.fromarray(classes.cpu().numpy()).save(png, "PNG")
        return {
            "width": int(classes.shape[1]),
            "height": int(classes.shape[0]),
            "mask": base64.b64encode(png.getvalue()).decode("ascii"),
            "classes": {names.get(str(i), str(i)): n for i, n in enumerate(counts) if n},
        }


def capped(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """``size`` scaled down so its longer side is ``max_side`` (never up), rounded."""
    width, height = size
    scale = max_side / max(width, height)
    if scale >= 1:
        return (width, height)
    return (max(1, math.floor(width * scale + 0.5)), max(1, math.floor(height * scale + 0.5)))


def _image(row: Any) -> Image.Image:
    body = row.get("data") or row.get("body") if isinstance(row, dict) else row
    if isinstance(body, str):
        body = base64.b64decode(body)
    if not isinstance(body, (bytes, bytearray)) or not body:
        raise InvalidInputError("the request body is empty: send an image")
    return Image.open(io.BytesIO(body)).convert("RGB")
