"""Faster R-CNN with a MobileNetV3 backbone (torchvision's
``fasterrcnn_mobilenet_v3_large_320_fpn``) for the .mar: its state dict is the torchvision
model's, under ``detector.``.

Built without weights (nothing is downloaded); ``build_mar.py`` packs untrained ones or
yours. ``box_score_thresh`` is 0 so the model returns its 100 best boxes per image whatever
their scores: the handler keeps those over its ``threshold`` (untrained weights score every
box near 1/91).
"""

from typing import Any

from torch import nn
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn


class MobileNetDetector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.detector = fasterrcnn_mobilenet_v3_large_320_fpn(
            weights=None, weights_backbone=None, box_score_thresh=0.0
        )

    def forward(self, images: Any) -> Any:
        # A list of (3, H, W) tensors of any sizes, or one (N, 3, H, W) tensor; torchvision
        # resizes each image and pads the batch to its largest.
        return self.detector(list(images))
