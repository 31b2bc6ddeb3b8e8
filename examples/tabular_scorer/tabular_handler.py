"""A fraud scorer with micro-batching: 128 features as JSON in, a score out.

A request is a JSON object ``{"features": [128 numbers]}`` (any other keys, such as a
transaction id, are ignored), sent as ``application/json`` or as raw bytes. A KServe v1
instance (``{"instances": [...]}``, ``kserve: true`` in micro_batching.json) is either such
an object or the bare list of 128 numbers; a KServe v2 ``FP32`` input of shape ``[n, 128]``
is n rows. The answer is ``{"score": <probability>}``.

A body that is not JSON (or not UTF-8), has no ``features`` list, has a list of another
length, or holds a value that is not a finite number a float32 can carry (a string, null,
a boolean, a list, NaN, Infinity, 1e39) gets its own 400 naming what is wrong; the other
requests of its batch are scored as they would be alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import InvalidInputError, MicroBatchingMixin

N_FEATURES = 128
# The largest finite float32: a larger number becomes inf in the model's input tensor.
FLOAT32_MAX = 3.4028234663852886e38
# JSON numbers reach the handler as these (bool is an int subclass: checked by exact type).
NUMBER_TYPES = (int, float)


class TabularScorerHandler(MicroBatchingMixin, BaseHandler):  # type: ignore[misc]
    def preprocess(self, data: list[Any]) -> torch.Tensor:
        rows = [read_features(row) for row in data]
        return torch.tensor(rows, dtype=torch.float32, device=self.device)

    def inference(self, data: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(data)  # type: ignore[no-any-return]

    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        return [{"score": score} for score in data.float().tolist()]


def read_features(row: Any) -> list[float]:
    """The 128 features of one row: a plain body (bytes, str, or the object TorchServe
    parsed from JSON), a KServe v1 instance or a v2 row.

    Raises:
        InvalidInputError: the row is not one of those, or its features are not 128 finite
            float32 numbers; the message says which and where.
    """
    body = row
    if isinstance(row, dict) and ("data" in row or "body" in row):
        body = row["data"] if row.get("data") is not None else row.get("body")
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"the request body is not UTF-8 JSON ({exc})") from exc
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError as exc:
            raise InvalidInputError(f"the request body is not JSON ({exc})") from exc
    if isinstance(body, dict):
        if "features" not in body:
            raise InvalidInputError(
                'send a JSON object {"features": [128 numbers]}; got keys '
                f"{sorted(map(str, body))[:5]}"
            )
        body = body["features"]
    if not isinstance(body, list):
        raise InvalidInputError(
            f'"features" must be a list of {N_FEATURES} numbers; got {type(body).__name__}'
        )
    return checked(body)


def checked(features: Sequence[Any]) -> list[float]:
    """``features`` as floats when they are 128 numbers a float32 holds finitely."""
    if len(features) != N_FEATURES:
        raise InvalidInputError(
            f'"features" has {len(features)} values; the model takes {N_FEATURES}'
        )
    for i, value in enumerate(features):
        if type(value) not in NUMBER_TYPES:
            raise InvalidInputError(f"features[{i}] is {_described(value)}, not a number")
        # abs() first: a huge int would overflow float(); NaN fails both comparisons.
        if not abs(value) <= FLOAT32_MAX or not math.isfinite(value):
            shown = repr(value) if isinstance(value, float) else "an integer that large"
            raise InvalidInputError(
                f"features[{i}] is {shown}: send finite numbers within float32's range"
            )
    return [float(value) for value in features]


def _described(value: Any) -> str:
    """What a value that is not a number is, briefly (never the whole of a long value)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return "the string " + json.dumps(value if len(value) <= 20 else value[:20] + "...")
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
