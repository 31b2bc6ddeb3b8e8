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

Which bodies are KServe requests is the config's ``kserve`` key: ``"auto"`` (the default)
takes only a body of the strict v2 shape (a JSON object whose ``inputs`` is a list of one
object with name, shape, datatype and data), so ``{"inputs": "some text"}``,
``{"instances": ...}`` or a v2 body of several inputs (``input_ids`` and
``attention_mask``) sent to ``/predictions`` reaches the handler unchanged;
``True`` (what the KServe bundle sets) also takes any ``{"instances": ...}`` object as v1
and any ``{"inputs": ...}`` object as v2, answering the malformed ones 400; ``False`` none.
The binary data extension (``Inference-Header-Content-Length``, ``binary_data_size``) is
not supported: such a request gets 400 naming it rather than reaching the handler as raw
bytes (unless ``kserve`` is ``False``).

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

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import InvalidInputError, RequestError
from .kserve_decoding import V2_DATATYPES as V2_DATATYPES
from .kserve_decoding import V2_KEYS, v1_instances, v2_instances
from .kserve_decoding import ProtocolError as ProtocolError
from .kserve_encoding import to_json, v2_output
from .status import exception_text, reason_phrase

logger = logging.getLogger(__name__)

# What json.loads skips around a document, and a decoder as json.loads's own.
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()

PLAIN, V1, V2 = "plain", "v1", "v2"

BINARY_HEADER = "inference-header-content-length"
_BINARY_MESSAGE = (
    "the binary data extension (Inference-Header-Content-Length, binary_data_size) is not "
    "supported: send each input's data as JSON in the body"
)


@dataclass
class Request:
    """Where one request's items sit in the flattened list, and how to answer it."""

    protocol: str
    start: int
    count: int
    error: RequestError | None = None  # unreadable or malformed: no items, answered with it
    request_id: str | None = None  # v2 "id"
    body_size: int | None = None  # bytes or characters of a plain body, for error messages


def unpack(
    rows: list[Any], kserve: bool | str = "auto", context: Any = None
) -> tuple[list[Request], list[Any]]:
    """The requests of a batch and the pipeline items their instances become.

    Args:
        rows: the batch as TorchServe hands it to ``handle``, one row per request.
        kserve: which bodies are KServe requests: "auto", True or False (module docstring).
        context: the batch's context, for the request headers; None when there is none.
    """
    requests: list[Request] = []
    items: list[Any] = []
    if getattr(context, "request_count", None) not in (None, len(rows)):
        context = None  # rows are not requests (an envelope flattened them): no headers
    for index, row in enumerate(rows):
        request = Request(PLAIN, len(items), 0)
        # The one guard of this request: whatever reading its body raises (a RecursionError
        # from json.loads on deep nesting, an OverflowError from numpy on UINT8 -1, an error
        # nobody listed) is this request's error, and the other requests are read as usual.
        try:
            instances = _read(row, kserve, context, index, request)
        except Exception as exc:  # the per-request boundary
            request.error = _unreadable(exc, request.protocol)
            instances = []
        request.count = len(instances)
        requests.append(request)
        items.extend(instances)
    return requests, items


def _unreadable(exc: Exception, protocol: str) -> RequestError:
    if isinstance(exc, RequestError):
        return exc
    text = exception_text(exc)
    logger.info("a request body cannot be read: %s: %s", type(exc).__name__, text)
    code = 507 if isinstance(exc, MemoryError) else 400
    what = "request body" if protocol == PLAIN else f"KServe {protocol} body"
    error_type = InvalidInputError if protocol == PLAIN else ProtocolError
    error = error_type(f"the {what} cannot be read: {type(exc).__name__}: {text}", code)
    error.__cause__ = exc
    return error


def _headers(context: Any, index: int) -> dict[str, str]:
    """The request's HTTP headers (TorchServe passes them all), names lower-cased: HTTP
    names are case-insensitive and TorchServe keeps the client's spelling."""
    getter = getattr(context, "get_all_request_header", None)
    if getter is None:
        return {}
    try:
        headers = getter(index)
    except Exception:  # a context without per-request headers (mocks) has none
        return {}
    if not isinstance(headers, Mapping):
        return {}
    return {str(name).lower(): value for name, value in headers.items()}


def _read(row: Any, kserve: bool | str, context: Any, index: int, request: Request) -> list[Any]:
    """The items of one request; sets ``request``'s protocol (and v2 id) as it finds them."""
    raw = _body(row)
    if isinstance(raw, (bytes, bytearray, str)):
        request.body_size = len(raw)
    if kserve is False:
        return [row]
    # A binary-extension body opens with its JSON header; a photo's bytes cannot be one, so
    # the headers are not read for them (the per-request path of every image request).
    if not _raw_non_json(raw) and BINARY_HEADER in _headers(context, index):
        request.protocol = V2
        raise ProtocolError(_BINARY_MESSAGE)
    body = _json_body(raw)
    if not isinstance(body, dict):
        return [row]
    if _uses_binary_extension(body):
        request.protocol = V2
        raise ProtocolError(_BINARY_MESSAGE)
    if kserve == "auto":
        if not _is_strict_v2(body):
            return [row]
    elif "instances" in body:
        request.protocol = V1
        return v1_instances(body["instances"])
    elif "inputs" not in body:
        return [row]
    request.protocol = V2
    request.request_id = _v2_id(body)
    return v2_instances(body["inputs"])


def _body(row: Any) -> Any:
    if isinstance(row, dict):
        body = row.get("data")
        return body if body is not None else row.get("body")
    return row


def _raw_non_json(body: Any) -> bool:
    """Bytes that cannot be a JSON object: only a prefix is looked at, since TorchServe
    hands bodies over as bytearrays, whose lstrip() would copy a whole photo."""
    return isinstance(body, (bytes, bytearray)) and bytes(body[:64]).lstrip()[:1] != b"{"


def _json_body(body: Any) -> Any:
    """A dict for JSON bodies (TorchServe parses application/json already; other content
    types arrive as bytes); anything else unchanged."""
    if not isinstance(body, (bytes, bytearray)) or _raw_non_json(body):
        return body
    # One decode and one parse, as json.loads does them, that also find a v2 JSON header
    # followed by the binary data extension's raw tensors: a large body that is not JSON
    # is not read twice.
    encoding = json.detect_encoding(body)
    try:
        text = body.decode(encoding, "surrogatepass")
        complete = True
    except UnicodeDecodeError as exc:  # not JSON; the valid prefix may still be a header
        if body.find(b'"binary_data_size"', 0, exc.start) < 0:
            return body
        text = body[: exc.start].decode(encoding, "surrogatepass")
        complete = False
    try:
        value, end = _DECODER.raw_decode(text, _skip_whitespace(text, 0))
    except json.JSONDecodeError:
        return body
    if complete and _skip_whitespace(text, end) == len(text):
        return value
    return value if isinstance(value, dict) and _uses_binary_extension(value) else body


def _skip_whitespace(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    return match.end() if match else pos


def _uses_binary_extension(body: dict[str, Any]) -> bool:
    inputs = body.get("inputs")
    return isinstance(inputs, list) and any(
        isinstance(t, dict)
        and isinstance(t.get("parameters"), dict)
        and "binary_data_size" in t["parameters"]
        for t in inputs
    )


def _is_strict_v2(body: dict[str, Any]) -> bool:
    """One input with name, shape, datatype and data: what "auto" takes as a v2 request. A
    body of several inputs (input_ids and attention_mask) is plain there: this package
    answers only one tensor per request, and the handler reads it as it would alone."""
    inputs = body.get("inputs")
    return (
        isinstance(inputs, list)
        and len(inputs) == 1
        and isinstance(inputs[0], dict)
        and all(k in inputs[0] for k in V2_KEYS)
    )


def _v2_id(body: dict[str, Any]) -> str | None:
    value = body.get("id")
    return value if isinstance(value, str) and value else None


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


def owners(requests: Sequence[Request]) -> list[int]:
    """For each item, the index of the request it belongs to."""
    return [index for index, r in enumerate(requests) for _ in range(r.count)]
