"""Handler outputs in the types a KServe answer carries: JSON values for v1, one tensor of
an Open Inference Protocol datatype (or BYTES texts) for v2. ``ts_microbatch.torchserve.kserve``
builds the answers; this module only converts.

Whatever a handler returned: tensors and arrays become nested lists (v1) or a tensor of
their own dtype (v2), numpy scalars Python numbers, bytes ``{"b64": ...}`` (v1, as
TensorFlow Serving and KServe do) or UTF-8 text (v2); what has no form raises, and the
caller fails that request alone.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core._types import is_tensor

# The numpy types of the Open Inference Protocol's numeric datatypes (KServe v2 REST).
V2_NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
_V2_NAMES = {np.dtype(t): name for name, t in V2_NUMERIC.items()}


def to_json(value: Any) -> Any:
    """``value`` as JSON values: tensors and arrays as nested lists, numpy scalars as Python
    numbers, bytes as ``{"b64": ...}``, tuples (named or not) as lists.

    Raises:
        TypeError: a value JSON has no form for (complex numbers, sets, other objects).
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {_json_key(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    array = _as_array(value)
    if array is not None:
        return to_json(array.tolist())
    if isinstance(value, np.generic):
        return to_json(value.item())
    raise TypeError(f"an output of type {type(value).__name__} has no JSON form")


def _json_key(key: Any) -> Any:
    if isinstance(key, np.generic):
        key = key.item()
    if key is None or isinstance(key, (str, bool, int, float)):
        return key
    raise TypeError(f"a dict key of type {type(key).__name__} has no JSON form")


def _as_array(value: Any) -> np.ndarray[Any, Any] | None:
    """A tensor or an array as a numpy array (half precisions widened to FP32, which JSON
    clients read: KServe refuses FP16 in JSON); None for anything else."""
    if is_tensor(value):
        import torch  # loaded: is_tensor said so

        tensor = value.detach().cpu()
        if tensor.dtype in (torch.float16, torch.bfloat16):
            tensor = tensor.float()
        return tensor.resolve_conj().resolve_neg().numpy()  # type: ignore[no-any-return]
    if isinstance(value, np.ndarray):
        return value.astype(np.float32) if value.dtype == np.float16 else value
    return None


def _numeric_array(output: Any) -> np.ndarray[Any, Any] | None:
    """One instance's output as a numeric array of a v2 datatype, or None if it is not one.

    Python numbers take the widest exact type (INT64, FP64, BOOL); tensors and arrays keep
    their dtype."""
    array = _as_array(output)
    if array is None:
        if isinstance(output, np.generic):
            array = np.asarray(output)
        elif isinstance(output, (bool, int, float, list, tuple)):
            try:
                array = np.asarray(output)
            except Exception:  # ragged or mixed lists are simply not numeric
                return None
        else:
            return None
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return array if array.dtype in _V2_NAMES else None


def v2_output(outputs: list[Any]) -> dict[str, Any]:
    """One tensor of shape [n, ...] in the outputs' own datatype when every instance's
    output is numeric and of one shape (integers of several types in one that holds every
    value exactly); else BYTES of shape [n], one text per instance (a string as it is,
    bytes as UTF-8, anything else as JSON)."""
    arrays = [_numeric_array(o) for o in outputs]
    if arrays and all(a is not None for a in arrays):
        numeric = [a for a in arrays if a is not None]
        if len({a.shape for a in numeric}) == 1:
            dtype = _common_dtype(numeric)
            if dtype is not None and dtype in _V2_NAMES:
                stacked = np.stack([a.astype(dtype) for a in numeric])
                return {
                    "name": "predictions",
                    "shape": list(stacked.shape),
                    "datatype": _V2_NAMES[dtype],
                    "data": stacked.reshape(-1).tolist(),
                }
    texts = [_text(o) for o in outputs]
    return {"name": "predictions", "shape": [len(texts)], "datatype": "BYTES", "data": texts}


def _common_dtype(arrays: list[np.ndarray[Any, Any]]) -> np.dtype[Any] | None:
    """The dtype that holds every array exactly. numpy's common type of uint64 and int64
    is float64, which rounds 2**63 + 1: integers take int64 or uint64 when their values
    fit, else None (BYTES texts)."""
    dtype = np.result_type(*arrays)
    if dtype.kind != "f" or not all(a.dtype.kind in "biu" for a in arrays):
        return dtype
    filled = [a for a in arrays if a.size]
    low = min((int(a.min()) for a in filled), default=0)
    high = max((int(a.max()) for a in filled), default=0)
    for candidate in (np.dtype(np.int64), np.dtype(np.uint64)):
        info = np.iinfo(candidate)
        if info.min <= low and high <= info.max:
            return candidate
    return None


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, (bytes, bytearray, memoryview)):
        # JSON carries text only; KServe refuses bytes that are not UTF-8 alike.
        return bytes(output).decode("utf-8")
    return json.dumps(to_json(output))
