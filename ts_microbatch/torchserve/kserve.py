"""KServe v1 and Open Inference Protocol v2 answers: every instance was one pipeline item.

Which bodies are KServe requests, and their instances, are decided where a row is read as a
request (``ts_microbatch.torchserve._submission``, with ``kserve_decoding``), so a plain
body never enters these modules. ``regroup`` puts a KServe request's items' outcomes back
together, one answer per request in its protocol's shape; a bad instance fails its own
request and nothing else (the protocols have no per-instance status).

Items are rows in TorchServe's own shape (``{"data": ...}``), so a handler's preprocess
reads them as it reads plain requests: a v1 instance ``{"b64": s}`` becomes ``{"data": s}``,
any other dict instance is passed unchanged (``{"data": "<base64>"}`` in KServe's image
examples), and a value that is not a dict becomes ``{"data": value}``. A v2 input of shape
``[n, ...]`` gives n instances: a numeric one ``{"data": <nested list of shape [...]>}``, a
BYTES one ``{"data": element}`` when each instance holds one element (shape ``[n]``,
``[n, 1]``), else ``{"data": <nested list of its elements>}``
(``ts_microbatch.torchserve.kserve_decoding``).

Answers are encoded as each protocol says, whatever the handler returned: v1 predictions
as JSON values (tensors and arrays as nested lists, numpy scalars as numbers, bytes as
``{"b64": ...}`` as TensorFlow Serving and KServe do); a v2 output as one tensor whose
datatype is the outputs' own (a tensor's or array's dtype; ``INT64``, ``FP64`` or ``BOOL``
for Python numbers), else ``BYTES`` with one text per instance
(``ts_microbatch.torchserve.kserve_encoding``).

This module runs inside the worker and needs only numpy (torch is used when loaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._submission import V1, Request
from .kserve_decoding import V2_DATATYPES as V2_DATATYPES
from .kserve_decoding import ProtocolError as ProtocolError
from .kserve_encoding import to_json, v2_output
from .status import exception_text, reason_phrase


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

    Raises:
        Exception: an output the protocol cannot carry (a complex tensor, an object, bytes
            that are not UTF-8 in a v2 BYTES output); the caller fails this request alone.
    """
    if request.error is not None:
        error = request.error
        message = exception_text(error)
        return Answer({"error": message}, error.status_code, reason_phrase(error.status_code))
    for index, error_tuple in enumerate(errors):
        if error_tuple is not None:
            status, phrase, message = error_tuple
            return Answer({"error": f"instance {index}: {message}"}, status, phrase)
    if request.protocol == V1:
        return Answer({"predictions": [to_json(o) for o in outputs]})
    response: dict[str, Any] = {"model_name": model_name, "id": request.request_id}
    if model_version:
        response["model_version"] = model_version
    response["outputs"] = [v2_output(outputs)]
    return Answer(response)
