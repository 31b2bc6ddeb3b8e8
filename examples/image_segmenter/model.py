"""DeepLabV3 with a MobileNetV3-Large backbone (torchvision's
``deeplabv3_mobilenet_v3_large``, 21 Pascal VOC classes) for the .mar: its state dict is the
torchvision model's, under ``segmenter.``.

Built without weights (nothing is downloaded); ``build_mar.py`` packs untrained ones or
yours. The model takes one stacked (N, 3, H, W) tensor of any H and W and answers logits
at that size, so images of one size stack and run together with nothing padded.
"""

from typing import Any

import torch
from torch import nn
from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large


class MobileNetSegmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # aux_loss=False: the auxiliary head only trains; torchvision's own weights load
        # without it (build_mar.py drops their aux_classifier keys).
        self.segmenter = deeplabv3_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=21, aux_loss=False
        )

    def forward(self, images: torch.Tensor) -> Any:
        return self.segmenter(images)  # {"out": (N, 21, H, W) logits}
