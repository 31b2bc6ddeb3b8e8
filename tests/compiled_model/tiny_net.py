"""A model small enough for inductor to compile in about a second on a CPU."""

import torch


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
