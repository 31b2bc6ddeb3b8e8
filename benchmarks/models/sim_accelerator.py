"""Accelerator stand-in: a batch of n costs a + b*n milliseconds of wall time, no CPU.

A SIMULATION. On a GPU, a forward pass occupies the device while the CPU is free and the
GIL is released; time.sleep behaves the same way on a CPU-only machine. The costs come from
sim_accelerator.json beside this file (shipped in the .mar as an extra file).
"""

import json
import os
import time

import torch
from torch import nn

_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sim_accelerator.json")


class SimulatedAccelerator(nn.Module):
    def __init__(self):
        super().__init__()
        with open(_CONFIG) as f:
            cost = json.load(f)
        self.fixed_ms = float(cost["fixed_ms"])
        self.per_item_ms = float(cost["per_item_ms"])
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        n = x.shape[0]
        time.sleep((self.fixed_ms + self.per_item_ms * n) / 1000.0)
        # Cheap logits that depend on the input, so that answers are per image.
        return x.flatten(1)[:, :1000] * self.scale
