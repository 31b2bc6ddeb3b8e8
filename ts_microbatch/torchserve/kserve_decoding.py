"""KServe bodies read into instances: a v1 ``instances`` list, or the one tensor of an
Open Inference Protocol v2 ``inputs`` list cut along its first dimension, each instance a
row in TorchServe's own shape (``{"data": ...}``). A value that would change on the way
(numpy would read "1" as 1, wrap 300 into INT8) is refused: ``ProtocolError``, 400.

Called only for a body already decided to be KServe's, where a row is read as a request
(``_submission``: which bodies are KServe requests, the per-request guard); kept apart from
the answers (``kserve``, ``kserve_encoding``): this module only converts. ``kserve``
re-exports ``ProtocolError`` and ``V2_DATATYPES``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ..core.errors import RequestError
from .kserve_encoding import V2_NUMERIC

# Open Inference Protocol datatypes (the KServe v2 REST spec) and their numpy types.
V2_DATATYPES: dict[str, Any] = {**V2_NUMERIC, "BYTES": None}
V2_KEYS = ("name", "shape", "datatype", "data")


class ProtocolError(RequestError):
    """A KServe v1 or v2 body that cannot be unpacked (HTTP 400)."""

    status_code = 400


def v1_instances(instances: Any) -> list[Any]:
    """A v1 body's ``instances`` as rows: ``{"b64": s}`` becomes ``{"data": s}``, any other
    dict is passed unchanged, any other value becomes ``{"data": value}``."""
    if not isinstance(instances, list) or not instances:
        raise ProtocolError('"instances" must be a non-empty list')
    rows = []
    for instance in instances:
        if isinstance(instance, dict) and list(instance) == ["b64"]:
            rows.append({"data": instance["b64"]})
        elif isinstance(instance, dict):
            rows.append(instance)
        else:
            rows.append({"data": instance})
    return rows


def v2_instances(inputs: Any) -> list[Any]:
    """A v2 body's one input of shape ``[n, ...]`` as n rows: a numeric instance its nested
    list, a BYTES one its element (one per instance) or its nested list of elements."""
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError('"inputs" must be a list of one input (one tensor per request)')
    tensor = inputs[0]
    missing = [k for k in V2_KEYS if k not in tensor]
    if missing:
        raise ProtocolError(f"input is missing {', '.join(repr(k) for k in missing)}")
    name, shape, datatype, data = (tensor[k] for k in V2_KEYS)
    if not isinstance(datatype, str) or datatype not in V2_DATATYPES:
        raise ProtocolError(
            f"input {name!r}: unknown datatype {datatype!r}; expected one of "
            + ", ".join(V2_DATATYPES)
        )
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise ProtocolError(f"input {name!r}: shape must be a list of sizes, got {shape!r}")
    if shape[0] == 0:
        raise ProtocolError(f"input {name!r}: shape {shape} holds no instance")
    if not isinstance(data, list):
        raise ProtocolError(f"input {name!r}: data must be a list")
    flat, types = _flatten(data, shape, name)
    if datatype == "BYTES":
        return _bytes_rows(flat, types, shape, name)
    array = _numeric(flat, types, datatype, name).reshape(shape)
    return [{"data": array[i].tolist()} for i in range(shape[0])]


def _flatten(data: list[Any], shape: list[int], name: Any) -> tuple[list[Any], set[type]]:
    """The elements of ``data`` in row-major order (OIP sends it flat, or nested as the
    shape) and the set of their types."""
    size = math.prod(shape)
    types = set(map(type, data))  # one pass in C: a large tensor is 150,000 numbers
    if list not in types:
        if len(data) != size:
            raise ProtocolError(
                f"input {name!r}: shape {shape} holds {size} values, data has {len(data)}"
            )
        return data, types
    level: list[Any] = [data]
    for dim in shape:
        if not all(type(x) is list and len(x) == dim for x in level):
            raise ProtocolError(f"input {name!r}: nested data does not have shape {shape}")
        level = list(itertools.chain.from_iterable(level))
    types = set(map(type, level))
    if list in types:
        raise ProtocolError(f"input {name!r}: nested data is deeper than shape {shape}")
    return level, types


def _bytes_rows(flat: list[Any], types: set[type], shape: list[int], name: Any) -> list[Any]:
    if not types <= {str}:
        raise ProtocolError(f"input {name!r}: BYTES data must be strings")
    n = shape[0]
    per = len(flat) // n
    if per == 1:  # shape [n], [n, 1], ...: one element per instance
        return [{"data": element} for element in flat]
    instances = np.array(flat, dtype=object).reshape(shape)
    return [{"data": instances[i].tolist()} for i in range(n)]


# The JSON types each kind of datatype accepts: numpy would read "1" as 1, true as 1 and
# truncate 1.5 to 1 without a word.
_JSON_TYPES: dict[str, tuple[set[type], str]] = {
    "b": ({bool}, "true or false"),
    "i": ({int}, "integers"),
    "u": ({int}, "integers"),
    "f": ({int, float}, "numbers"),
}


def _numeric(flat: list[Any], types: set[type], datatype: str, name: Any) -> np.ndarray[Any, Any]:
    """``flat`` as an array of ``datatype``, refusing values that would change on the way
    (numpy would wrap 300 into INT8)."""
    target = np.dtype(V2_DATATYPES[datatype])
    allowed, expected = _JSON_TYPES[target.kind]
    if not types <= allowed:
        raise ProtocolError(f"input {name!r}: data is not {datatype}: expected {expected}")
    if not flat:
        return np.zeros(0, dtype=target)
    if target.kind in "iu":
        # The JSON ints as given: numpy would read [2**64 - 1, -1] as float64 ("-1.0").
        info = np.iinfo(target)
        low, high = min(flat), max(flat)
        if low < info.min or high > info.max:
            raise ProtocolError(
                f"input {name!r}: data is not {datatype}: {low if low < info.min else high} "
                f"is out of range {info.min}..{info.max}"
            )
        return np.asarray(flat, dtype=target)
    values = np.asarray(flat, dtype=np.float64)
    if target == values.dtype:
        return values
    with np.errstate(all="ignore"):
        converted = values.astype(target)
    if not np.array_equal(np.isfinite(converted), np.isfinite(values)):
        raise ProtocolError(f"input {name!r}: data is not {datatype}: a value is out of range")
    return converted
