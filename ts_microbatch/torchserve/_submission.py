"""A batch on its way into the pipeline (steps 1 and 2 of ``micro_batching``'s list): its
context pinned, its rows read as requests, its items submitted with the deadline that
``handle`` started counting when it was entered.

Reading a row as a request is where each body's protocol is decided, once (``unpack``): a
plain ``/predictions`` body is one item, as before, and never reaches the KServe reader; a
KServe v1 body (``{"instances": [...]}``) or an OIP v2 JSON body (``{"id"?, "inputs":
[{"name", "shape", "datatype", "data"}]}``) gives one item per instance
(``kserve_decoding``), so a request of 64 instances is cut into micro-batches of its own
and 32 single-instance requests share micro-batches. A malformed body fails its own
request (400, ``{"error": ...}`` as KServe servers answer) without entering the pipeline.

Which bodies are KServe requests is the config's ``kserve`` key: ``"auto"`` (the default)
takes only a body of the strict v2 shape (a JSON object whose ``inputs`` is a list of one
object with name, shape, datatype and data), so ``{"inputs": "some text"}``,
``{"instances": ...}`` or a v2 body of several inputs (``input_ids`` and
``attention_mask``) sent to ``/predictions`` reaches the handler unchanged; ``True`` (what
the KServe bundle sets) also takes any ``{"instances": ...}`` object as v1 and any
``{"inputs": ...}`` object as v2, answering the malformed ones 400; ``False`` none. The
binary data extension (``Inference-Header-Content-Length``, ``binary_data_size``) is not
supported: such a request gets 400 naming it rather than reaching the handler as raw bytes
(unless ``kserve`` is ``False``). The decision is cheap for the bodies most requests carry:
bytes that cannot open a JSON object (a photo) are plain at once, their headers unread.

Kept apart from ``micro_batching`` (the drop-in ``MicroBatching``: its settings, the
synchronous and asynchronous waits, the stage helpers) because both of its waits,
``handle`` and ``handle_async``, submit a batch in the same way, here.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.batch import Batch
from ..core.config import MicroBatchingConfig
from ..core.errors import InvalidInputError, PipelineStalledError, RequestError
from ..core.pipeline import Pipeline
from .context import BatchContext
from .kserve_decoding import V2_KEYS, ProtocolError, v1_instances, v2_instances
from .status import exception_text
from .timeouts import Deadline, batch_deadline

logger = logging.getLogger(__name__)

PLAIN, V1, V2 = "plain", "v1", "v2"

BINARY_HEADER = "inference-header-content-length"
_BINARY_MESSAGE = (
    "the binary data extension (Inference-Header-Content-Length, binary_data_size) is not "
    "supported: send each input's data as JSON in the body"
)
# What json.loads skips around a document, and a decoder as json.loads's own.
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass
class Request:
    """Where one request's items sit in the flattened list, and how to answer it."""

    protocol: str
    start: int
    count: int
    error: RequestError | None = None  # unreadable or malformed: no items, answered with it
    request_id: str | None = None  # v2 "id"
    body_size: int | None = None  # bytes or characters of a plain body, for error messages


@dataclass
class SubmittedBatch:
    """A batch as submitted: where statuses go, its requests, and the pipeline's batch."""

    target: BatchContext | None  # the context statuses are set on; None when not aligned
    view: BatchContext | None
    requests: list[Request]
    deadline: Deadline
    batch: Batch | None = None
    refused: PipelineStalledError | None = None  # answered unrun: 503


def submit(
    pipeline: Pipeline,
    config: MicroBatchingConfig,
    handler: Any,
    data: Sequence[Any],
    context: Any,
    start_s: float,
) -> SubmittedBatch:
    """Reads and submits a batch whose ``timeout_s`` started at ``start_s``: a cut that
    spent the whole timeout expires the batch before any stage starts it. ``context``
    None: the handler's. Stage helpers, statuses, metric lines and failure isolation go by
    requests: a KServe request is several items, a malformed one none."""
    live = context if context is not None else getattr(handler, "context", None)
    deadline = batch_deadline(config.timeout_s, getattr(live, "model_yaml_config", None), start_s)
    view = BatchContext(live) if live is not None else None
    # Statuses go on the context only when row i is request i: a request envelope
    # (TorchServe's json) may have flattened several instances per request.
    aligned = view is not None and view.request_count in (None, len(data))
    if view is not None and not aligned:
        logger.debug(
            "%d rows for %d requests: per-request statuses are not set",
            len(data),
            view.request_count,
        )
    # The headers are the live context's, which is the batch's until handle() returns.
    requests, items = unpack(list(data), config.kserve, live if aligned else None)
    submitted = SubmittedBatch(view if aligned else None, view, requests, deadline)
    if not items:
        return submitted
    # When rows are not requests, stage calls reach no request at all.
    stages_view = view if aligned or view is None else view.for_rows(())
    try:
        submitted.batch = pipeline.submit_batch(
            items, stages_view, owners=owners(requests), timed_out=deadline.timed_out
        )
    except PipelineStalledError as stalled:
        # Answered at once: waiting would only turn this into TorchServe's timeout.
        logger.error("batch of %d refused: %s", len(data), stalled)
        submitted.refused = stalled
    return submitted


def owners(requests: Sequence[Request]) -> list[int]:
    """For each item, the index of the request it belongs to."""
    return [index for index, r in enumerate(requests) for _ in range(r.count)]


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


def _read(row: Any, kserve: bool | str, context: Any, index: int, request: Request) -> list[Any]:
    """The items of one request; sets ``request``'s protocol (and v2 id) as it finds them:
    the one decision of its protocol. Only a KServe body goes on to the KServe reader."""
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
