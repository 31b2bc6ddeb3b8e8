"""Padding a micro-batch to an allowed size, and dropping the padded outputs.

A compiled or fixed-shape model sees only ``allowed_micro_batch_sizes``: a micro-batch of
another size is padded after preprocess by repeating its last real item (as TF Serving's
``batching_session`` pads to ``allowed_batch_sizes``: a real row is always a valid input,
zeros may not be), and the model's outputs past the real items are dropped before
postprocess, so no request sees them.

What can be padded, batch-major (the first dimension is the request): a list, a
``torch.Tensor`` or ``numpy.ndarray``, and tuples and mappings of those (a tokenizer's
``{"input_ids": ..., "attention_mask": ...}``), padded element by element.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import StageOutputError


def padded_size(allowed: tuple[int, ...] | None, n: int) -> int:
    """The smallest allowed size that holds ``n`` items; ``n`` without allowed sizes."""
    if allowed is None:
        return n
    return next((size for size in allowed if size >= n), n)


def pad(payload: Any, n: int, size: int, where: str) -> Any:
    """``payload`` of ``n`` items grown to ``size`` by repeating its last item.

    Raises:
        StageOutputError: ``payload`` is not batch-major with ``n`` items (``where`` names
            the stage that produced it).
    """
    return _map(payload, n, where, lambda x: _pad_leaf(x, size - n))


def unpad(output: Any, n: int, size: int, where: str) -> Any:
    """The first ``n`` items of ``output``, which has ``size`` (a padded micro-batch's)."""
    return _map(output, size, where, lambda x: x[:n])


def _map(value: Any, n: int, where: str, leaf: Any) -> Any:
    if isinstance(value, Mapping):
        mapped = {key: _map(item, n, f"{where}[{key!r}]", leaf) for key, item in value.items()}
        try:  # keep the mapping's own type (a tokenizer's BatchEncoding) where it allows
            return type(value)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_map(item, n, f"{where}[{i}]", leaf) for i, item in enumerate(value))
    if isinstance(value, list) or _is_array(value):
        rows = len(value)
        if rows != n:
            raise StageOutputError(
                f"{where} has {rows} rows for a micro-batch of {n}: with "
                "allowed_micro_batch_sizes its first dimension must be the request"
            )
        return leaf(value)
    raise StageOutputError(
        f"{where} is a {type(value).__name__}: with allowed_micro_batch_sizes it must be a "
        "list, tensor or array (or a tuple or mapping of them) with one row per request"
    )


def _pad_leaf(value: Any, extra: int) -> Any:
    if isinstance(value, list):
        return value + [value[-1]] * extra
    if isinstance(value, np.ndarray):
        return np.concatenate([value, np.repeat(value[-1:], extra, axis=0)])
    torch = sys.modules["torch"]  # _is_array admitted it, so torch is imported
    return torch.cat([value, value[-1:].expand(extra, *value.shape[1:])])


def _is_array(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(value, torch.Tensor) and value.dim() > 0
