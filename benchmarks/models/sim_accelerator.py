"""Accelerator stand-in: a batch of n costs a + b*n milliseconds of wall time.

A SIMULATION. On a GPU, a forward pass occupies the device while the CPU is free and the
GIL is released; time.sleep behaves the same way on a CPU-only machine. The costs come from
sim_accelerator.json beside this file (shipped in the .mar as an extra file):

    {"fixed_ms": 2, "per_item_ms": 0.5, "compute": "none"}

``compute`` is what the inference thread does with torch on the CPU besides the wait:
``none`` (a slice of the input: nothing), or ``mean`` (a mean over each input, as any real
model does some torch work on its inference thread, on a GPU too: copies, softmax, top-k).
The two differ in more than that work's cost: an OpenMP team that ran a region spins
afterwards (ts_microbatch.core.intra_op), so a stand-in that computes nothing hides it.
"""

import json
import os
import time

import torch
from torch import nn

_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sim_accelerator.json")
COMPUTE = ("none", "mean")


class SimulatedAccelerator(nn.Module):
    def __init__(self):
        super().__init__()
        with open(_CONFIG) as f:
            cost = json.load(f)
        self.fixed_ms = float(cost["fixed_ms"])
        self.per_item_ms = float(cost["per_item_ms"])
        self.compute = cost.get("compute", "none")
        if self.compute not in COMPUTE:
            raise ValueError(f"compute: got {self.compute!r}, expected one of {COMPUTE}")
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        n = x.shape[0]
        if self.compute == "mean":
            logits = torch.zeros(n, 1000) + x.mean(dim=(1, 2, 3)).unsqueeze(1)
        else:
            # Cheap logits that depend on the input, so that answers are per image.
            logits = x.flatten(1)[:, :1000]
        time.sleep((self.fixed_ms + self.per_item_ms * n) / 1000.0)
        return logits * self.scale
