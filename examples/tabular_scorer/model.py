"""A fraud scorer: an MLP over 128 transaction features, the probability of fraud out."""

import torch
from torch import nn

N_FEATURES = 128


class FraudMLP(nn.Module):
    """128 -> 256 -> 128 -> 1, ReLU between, a sigmoid at the end: one score per row."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(N_FEATURES, 256),
            nn.ReLU(),
            nn.Linear(256, 128),
            nn.ReLU(),
            nn.Linear(128, 1),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.layers(features)).squeeze(-1)
