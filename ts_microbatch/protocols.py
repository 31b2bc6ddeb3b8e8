"""KServe v1 and Open Inference Protocol v2 bodies: every instance one pipeline item.

``unpack`` turns the requests of a frontend batch into pipeline items: a plain
``/predictions`` body is one item, as before; a KServe v1 body (``{"instances": [...]}``)
or an OIP v2 JSON body (``{"id"?, "inputs": [{"name", "shape", "datatype", "data"}]}``)
gives one item per instance, so a request of 64 instances is cut into micro-batches of its
own and 32 single-instance requests share micro-batches. ``regroup`` puts the items'
outcomes back together, one answer per request in its protocol's shape. A malformed body
fails its own request (400, ``{"error": ...}`` as KServe servers answer) without entering
the pipeline, and a bad instance fails its own request and nothing else (the protocols
have no per-instance status).

Items are rows in TorchServe's own shape (``{"data": ...}``), so a handler's preprocess
reads them as it reads plain requests: a v1 instance ``{"b64": s}`` becomes ``{"data": s}``,
any other dict instance is passed unchanged (``{"data": "<base64>"}`` in KServe's image
examples), and a value that is not a dict becomes ``{"data": value}``. A v2 BYTES element
is ``{"data": element}``; a numeric input of shape ``[n, ...]`` gives n instances of shape
``[...]`` as nested lists.

This module runs inside the worker and needs only numpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import RequestError

PLAIN, V1, V2 = "plain", "v1", "v2"

# Open Inference Protocol datatypes (the KServe v2 REST spec) and their numpy types.
V2_DATATYPES = {
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
    "BYTES": None,
}


class ProtocolError(RequestError):
    """A KServe v1 or v2 body that cannot be unpacked (HTTP 400)."""

    status_code = 400


@dataclass
class Request:
    """Where one request's items sit in the flattened list, and how to answer it."""

    protocol: str
    start: int
    count: int
    error: ProtocolError | None = None  # malformed: no items, answered with this
    request_id: str | None = None  # v2 "id"


def _body(row: Any) -> Any:
    if isinstance(row, dict):
        body = row.get("data")
        return body if body is not None else row.get("body")
    return row


def _json_body(body: Any) -> Any:
    """A dict for JSON bodies (TorchServe parses application/json already; other content
    types arrive as bytes); anything else unchanged."""
    # Only a prefix is looked at: TorchServe hands bodies over as bytearrays, whose
    # lstrip() would copy a whole photo for every plain request.
    if isinstance(body, (bytes, bytearray)) and bytes(body[:64]).lstrip()[:1] == b"{":
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return body  # not JSON after all: a plain body for the handler to judge
    return body


def unpack(rows: list[Any]) -> tuple[list[Request], list[Any]]:
    """The requests of a batch and the pipeline items their instances become."""
    requests: list[Request] = []
    items: list[Any] = []
    for row in rows:
        body = _json_body(_body(row))
        start = len(items)
        if isinstance(body, dict) and "instances" in body:
            request = Request(V1, start, 0)
            instances = _v1_instances(body, request)
        elif isinstance(body, dict) and "inputs" in body:
            request = Request(V2, start, 0, request_id=_v2_id(body))
            instances = _v2_instances(body, request)
        else:
            requests.append(Request(PLAIN, start, 1))
            items.append(row)
            continue
        items.extend(instances)
        request.count = len(instances)
        requests.append(request)
    return requests, items


def _v1_instances(body: dict[str, Any], request: Request) -> list[Any]:
    instances = body["instances"]
    if not isinstance(instances, list) or not instances:
        request.error = ProtocolError('"instances" must be a non-empty list')
        return []
    rows = []
    for instance in instances:
        if isinstance(instance, dict) and list(instance) == ["b64"]:
            rows.append({"data": instance["b64"]})
        elif isinstance(instance, dict):
            rows.append(instance)
        else:
            rows.append({"data": instance})
    return rows


def _v2_id(body: dict[str, Any]) -> str | None:
    value = body.get("id")
    return value if isinstance(value, str) and value else None


def _v2_instances(body: dict[str, Any], request: Request) -> list[Any]:
    try:
        return _v2_rows(body)
    except ProtocolError as exc:
        request.error = exc
        return []


def _v2_rows(body: dict[str, Any]) -> list[Any]:
    inputs = body["inputs"]
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError('"inputs" must be a list of one input (one tensor per request)')
    tensor = inputs[0]
    missing = [k for k in ("name", "shape", "datatype", "data") if k not in tensor]
    if missing:
        raise ProtocolError(f"input is missing {', '.join(repr(k) for k in missing)}")
    name, shape, datatype, data = (tensor[k] for k in ("name", "shape", "datatype", "data"))
    if datatype not in V2_DATATYPES:
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
    if not isinstance(data, list):
        raise ProtocolError(f"input {name!r}: data must be a list")
    if datatype == "BYTES":
        if math.prod(shape) != len(data) or len(shape) != 1:
            raise ProtocolError(
                f"input {name!r}: shape {shape} does not match {len(data)} BYTES elements "
                "(expected shape [n], one element per instance)"
            )
        return [{"data": element} for element in data]
    try:
        array = np.asarray(data, dtype=V2_DATATYPES[datatype])
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"input {name!r}: data is not {datatype} ({exc})") from exc
    if array.size != math.prod(shape):
        raise ProtocolError(
            f"input {name!r}: shape {shape} holds {math.prod(shape)} values, data has {array.size}"
        )
    array = array.reshape(shape)
    return [{"data": array[i].tolist()} for i in range(shape[0])]


@dataclass
class Answer:
    """One request's answer: its body and, for an error, its status."""

    body: Any
    status: int | None = None  # None: 200
    phrase: str = ""


def regroup(
    request: Request,
    outputs: list[Any],
    errors: list[tuple[int, str, str] | None],
    model_name: str | None = None,
    model_version: str | None = None,
) -> Answer:
    """The answer of a v1 or v2 ``request`` from its items' outputs and errors.

    Args:
        outputs: one output per item (anything for a failed item).
        errors: per item, None or (status, phrase, message).
    """
    if request.error is not None:
        return Answer({"error": str(request.error)}, request.error.status_code, "Bad Request")
    for index, error in enumerate(errors):
        if error is not None:
            status, phrase, message = error
            return Answer({"error": f"instance {index}: {message}"}, status, phrase)
    if request.protocol == V1:
        return Answer({"predictions": outputs})
    response: dict[str, Any] = {"model_name": model_name, "id": request.request_id}
    if model_version:
        response["model_version"] = model_version
    response["outputs"] = [_v2_output(outputs)]
    return Answer(response)


def _v2_output(outputs: list[Any]) -> dict[str, Any]:
    """Numbers (or equal-shaped lists of them) as FP32 of shape [n, ...]; anything else as
    BYTES of shape [n], one JSON text per instance (a dict of class to probability, say)."""
    numeric = all(
        isinstance(o, (int, float)) and not isinstance(o, bool) or isinstance(o, list)
        for o in outputs
    )
    if numeric:
        try:
            array = np.asarray(outputs, dtype=np.float32)
        except (TypeError, ValueError):
            array = None
        if array is not None and array.dtype != object:
            return {
                "name": "predictions",
                "shape": list(array.shape),
                "datatype": "FP32",
                "data": array.reshape(-1).tolist(),
            }
    texts = [o if isinstance(o, str) else json.dumps(o) for o in outputs]
    return {"name": "predictions", "shape": [len(texts)], "datatype": "BYTES", "data": texts}
