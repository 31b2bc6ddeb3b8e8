"""Padding a micro-batch to an allowed size, and dropping the padded outputs.

A compiled or fixed-shape model sees only ``allowed_micro_batch_sizes``: a micro-batch of
another size is padded by repeating its last real item (as TF Serving's
``batching_session`` pads to ``allowed_batch_sizes``: a real row is always a valid input,
zeros may not be), and the outputs past the real items are dropped, so no request sees them.

Where the padding happens is the ``pad`` setting, because only the handler knows what is
batch-major:

* ``"requests"`` (the default): the last *request* is repeated before preprocess and the
  padded answers are dropped after postprocess. Both ends are lists with one entry per
  request by the handler contract, so nothing can be mistaken for a batch dimension. It
  costs the padded items' preprocess and postprocess.
* ``"tensors"``: the handler declares that what its preprocess returns and what its
  inference returns are batch-major (every list, tensor or array in them, inside tuples,
  named tuples and mappings, has one row per request). Only inference sees the padded
  size. A flat tensor whose length merely equals the micro-batch size (token ids with
  offsets, say) would be padded wrongly, which is why warm-up checks a padded run against
  unpadded answers before the worker is ready (``MicroBatching.warm_up``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ConfigError, StageOutputError

PAD_MODES = ("requests", "tensors")


def padded_range(
    names: Sequence[str], allowed: Sequence[int] | None, padded: Sequence[str] | None
) -> range:
    """The indices of the ``padded`` stages of the pipeline ``names``: consecutive ones,
    given exactly when ``allowed`` sizes are (an empty range when neither is).

    Raises:
        ConfigError: only one of them is given, or the stages are not consecutive ones.
    """
    if allowed is None and padded is None:
        return range(0)
    indices = [names.index(name) for name in padded or () if name in names]
    if (
        allowed is None
        or padded is None
        or not indices
        or len(indices) != len(padded)
        or indices != list(range(indices[0], indices[0] + len(indices)))
    ):
        raise ConfigError(
            f"padded_stages: got {padded!r} with allowed_sizes {allowed!r}, expected both or "
            f"neither, the stages consecutive ones of {', '.join(names)}"
        )
    return range(indices[0], indices[-1] + 1)


def padded_size(allowed: tuple[int, ...] | None, n: int) -> int:
    """The smallest allowed size that holds ``n`` items; ``n`` without allowed sizes."""
    if allowed is None:
        return n
    return next((size for size in allowed if size >= n), n)


def pad_rows(rows: list[Any], size: int) -> list[Any]:
    """A list of requests grown to ``size`` by repeating its last one."""
    return rows + [rows[-1]] * (size - len(rows))


def pad(payload: Any, n: int, size: int, where: str) -> Any:
    """Batch-major ``payload`` of ``n`` items grown to ``size`` by repeating its last item.

    Raises:
        StageOutputError: ``payload`` is not batch-major with ``n`` items (``where`` names
            the stage that produced it).
    """
    return _map(payload, n, where, lambda x: _pad_leaf(x, size - n))


def unpad(output: Any, n: int, size: int, where: str) -> Any:
    """The first ``n`` items of batch-major ``output``, which has ``size`` rows."""
    return _map(output, size, where, lambda x: x[:n])


def _map(value: Any, n: int, where: str, leaf: Callable[[Any], Any]) -> Any:
    """``leaf`` applied to every batch-major part of ``value``, its containers' types kept."""
    if value is None:
        return None  # an absent part (an optional output); nothing to pad
    if isinstance(value, Mapping):
        mapped = {key: _map(item, n, f"{where}[{key!r}]", leaf) for key, item in value.items()}
        try:  # keep the mapping's own type (a tokenizer's BatchEncoding) where it allows
            return type(value)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if isinstance(value, tuple):
        items = [_map(item, n, f"{where}[{i}]", leaf) for i, item in enumerate(value)]
        return _rebuild_tuple(value, items)
    if isinstance(value, list) or _is_array(value):
        rows = len(value)
        if rows != n:
            raise StageOutputError(
                f"{where} has {rows} rows for a micro-batch of {n}: with pad: tensors "
                "every list, tensor and array in it must have one row per request"
            )
        return leaf(value)
    raise StageOutputError(
        f"{where} is a {type(value).__name__}: with pad: tensors it must be a list, tensor "
        "or array (or a tuple or mapping of them) with one row per request; use pad: requests"
    )


def _rebuild_tuple(original: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...]:
    kind = type(original)
    if kind is tuple:
        return tuple(items)
    if hasattr(original, "_fields"):  # a namedtuple
        return kind(*items)
    # A structseq such as torch.return_types.topk is built from one sequence.
    return kind(items)


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


def same_answer(a: Any, b: Any, rtol: float = 1e-3, atol: float = 1e-5) -> bool:
    """Whether two answers are equal, numbers within tolerance (kernels differ by size)."""
    if isinstance(a, Mapping):
        return (
            isinstance(b, Mapping)
            and a.keys() == b.keys()
            and all(same_answer(a[k], b[k], rtol, atol) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same_answer(x, y, rtol, atol) for x, y in zip(a, b))
        )
    if isinstance(a, (str, bytes, bytearray)) or a is None:
        return bool(a == b)
    try:
        left = np.asarray(_to_numpy(a), dtype=float)
        right = np.asarray(_to_numpy(b), dtype=float)
    except (TypeError, ValueError):
        return bool(a == b)
    return left.shape == right.shape and bool(np.allclose(left, right, rtol=rtol, atol=atol))


def _to_numpy(value: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value
