"""ResNet-18 model definition for the .mar: its state dict is torchvision's resnet18's."""

from torchvision.models.resnet import BasicBlock, ResNet


class ResNet18(ResNet):
    def __init__(self) -> None:
        super().__init__(BasicBlock, [2, 2, 2, 2])
