"""Type checks shared by the modules that read what a handler returned."""

from __future__ import annotations

import sys
from typing import Any


def is_tensor(value: Any) -> bool:
    """True for a ``torch.Tensor``, without importing torch: no tensor can exist unless torch
    is loaded, and the core must import without it."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)
