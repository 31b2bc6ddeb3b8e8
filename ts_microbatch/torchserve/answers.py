"""How each request of a batch is answered, and with which status.

A plain request gets its item's output; a KServe v1 or v2 request one body for all its
instances, in its protocol's shape (``ts_microbatch.torchserve.kserve``). A request that failed
gets a JSON error body and its own status on the batch's context, when the batch has one
row per request (a request envelope such as TorchServe's ``json`` may have flattened
several instances per request: an index would then name another request).

Which status (``ts_microbatch.torchserve.status`` maps the exception): a ``RequestError`` or
``PredictionException`` carries its own; any other error is a 500, except that an error in
the first stage that bisection pinned on one request alone, once that stage has served a
request since load and is not judged broken, is that request's input: 400 with a message
that says what the client sent. So a request gets the same status alone and in any batch
(the rule is ``ts_microbatch.core.isolation``'s). A body that could not be read
(``_submission.unpack``) is a 400 and never enters the pipeline.

What a handler returned is read here too, one guard per request: each answer is turned
into the bytes TorchServe's own serializer would send (``encode``), and an output that its
protocol cannot encode, or that serializer cannot (a str with a lone surrogate, an int of
5,000 digits, a tensor ``torch.save`` cannot pickle), fails its own request with a 500
naming its type; TorchServe would otherwise answer the whole batch 503, or lose it to an
exception ``Service.predict`` does not catch.

The bytes TorchServe sends. Its ``create_predict_response``
(``ts/protocol/otf_message_handler.py``) turns each answer ``handle()`` returned into a
response body: bytes and bytearrays as they are, a str as UTF-8, a tensor through
``torch.save``, anything else ``json.dumps(answer, indent=2)`` as UTF-8. It does so after
``handle()`` returned, for the whole batch, and catches only TypeError (then 503 for every
request): a str with a lone surrogate (a client can send one in JSON, a text handler echoes
it), an int of more than 4,300 digits, a circular reference or a tensor ``torch.save``
cannot pickle escapes ``Service.predict``, and no request of the batch is answered.
``encode`` does the same conversion inside the per-request guard. When TorchServe's
serializer is the next to see ``handle()``'s answers (``sent_as_returned``), they are
returned as those bytes, which it sends unchanged: the body is byte for byte what it would
have made, and the content type is the context's (``get_response_content_type``), which
never depended on the answer's type. Anywhere else (a test, a handler that wraps
``handle()``, TorchServe's ``json`` envelope, which dumps the answers itself) the answers
stay objects, encoded once only to find those that cannot be sent.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, NamedTuple

from ..core._results import Outcome
from ..core._types import is_tensor
from ..core.batch import Batch
from ..core.errors import PipelineClosedError, PipelineStalledError, SiblingFailedError
from ..core.metrics import PipelineObserver
from . import kserve
from ._submission import PLAIN, V2, Request, SubmittedBatch
from .status import error_status

# What json.dumps takes and no tensor can be: answered as JSON without looking for torch.
_JSON_TYPES = (dict, list, tuple, int, float, type(None))
# The frames that serialize what the handler's entry point returned (sync and async workers).
_SERIALIZERS = {("ts.service", "predict"), ("ts.async_service", "predict")}
# TorchServe's envelopes run their handle() in this module; only the body envelope returns
# the answers unchanged (format_output is the identity).
_ENVELOPE_MODULE = "ts.torch_handler.request_envelope.base"
_PASS_THROUGH_ENVELOPES = {"ts.torch_handler.request_envelope.body.BodyEnvelope"}


class Reply(NamedTuple):
    """What one request gets: its body (an object, before the bytes) and its status."""

    body: Any
    status: int = 200
    phrase: str = ""


def answer_batch(
    submitted: SubmittedBatch,
    outcomes: Sequence[Outcome | None] | None,
    observer: PipelineObserver,
) -> list[Any]:
    """One answer per request of ``submitted``, in order; statuses set, errors observed.

    One pass per request: its outcome becomes a ``Reply`` (``_reply``: the status table and
    the protocol's regrouping are consulted), the reply becomes the bytes TorchServe sends
    (``encode``), and the status goes on the context. Whatever any step raises for a
    request fails that request alone with a 500 (the handler's output cannot be sent).
    Called by ``handle()`` itself, so that the answers are returned as bytes only when
    TorchServe's serializer is the next to read them (``sent_as_returned``).

    Args:
        outcomes: the batch's items' answers, in item order (``Batch.settle``); None when
            no batch ran (no request had items, or the pipeline refused them).
    """
    wire = sent_as_returned()
    answers = []
    for idx, request in enumerate(submitted.requests):
        try:  # the per-request boundary
            reply = _reply(submitted, outcomes, idx, request)
            answer = encode(reply.body)
        except Exception as exc:
            about = _unsendable_about(submitted, outcomes, request)
            status = error_status(exc, _request_id(submitted, idx), about=about)
            body = status.body if request.protocol == PLAIN else {"error": status.body["message"]}
            reply = Reply(body, status.code, status.phrase)
            answer = encode(reply.body)
        if reply.status != 200:
            # The status onto the request's context (when rows are requests), the error to
            # the metrics.
            if submitted.target is not None:
                submitted.target.set_response_status(reply.status, reply.phrase, idx)
            observer.on_request_error(reply.status)
        answers.append(answer if wire else reply.body)
    return answers


def _reply(
    submitted: SubmittedBatch,
    outcomes: Sequence[Outcome | None] | None,
    idx: int,
    request: Request,
) -> Reply:
    """Request ``idx``'s reply from its outcome: an unread body's error, its item's output
    or error (plain), or its items' outcomes regrouped in its protocol's shape. Its
    TorchServe request id is read only for an error or a v2 answer, which name it."""
    if request.protocol == PLAIN:
        if request.error is not None:
            return _error_reply(request.error, submitted, idx, request, bad_input=False)
        value, error = _outcome(submitted, outcomes, request.start)
        if error is None:
            return Reply(value)
        bad_input = _is_bad_input(submitted.batch, request.start)
        return _error_reply(error, submitted, idx, request, bad_input=bad_input)
    results: list[Any] = []
    errors: list[tuple[int, str, str] | None] = []
    # The first error in item order is the request's (regroup): the pipeline runs every
    # item below a failed one and none above it (SiblingFailedError), so that is the lowest
    # failing item whatever the timing (ts_microbatch.core.outcomes, skip_items_above).
    sibling = None
    for item in range(request.start, request.start + request.count):
        value, error = _outcome(submitted, outcomes, item)
        results.append(value)
        if isinstance(error, SiblingFailedError):
            sibling, error = error, None
        if error is None:
            errors.append(None)
            continue
        bad_input = _is_bad_input(submitted.batch, item)
        status = _error_reply(error, submitted, idx, request, bad_input=bad_input)
        errors.append((status.status, status.phrase, status.body["message"]))
    if sibling is not None and not any(errors):  # never without the failed one; if so, 500
        return _error_reply(sibling, submitted, idx, request, bad_input=False)
    if request.protocol == V2 and request.request_id is None:
        request.request_id = _request_id(submitted, idx)  # None when rows are not requests
    model = (getattr(submitted.view, "manifest", None) or {}).get("model", {})
    answer = kserve.regroup(
        request, results, errors, model.get("modelName"), model.get("modelVersion")
    )
    return Reply(answer.body, answer.status or 200, answer.phrase)


def _error_reply(
    error: BaseException,
    submitted: SubmittedBatch,
    idx: int,
    request: Request,
    *,
    bad_input: bool,
) -> Reply:
    request_id = _request_id(submitted, idx)
    status = error_status(error, request_id, bad_input=bad_input, body_size=request.body_size)
    return Reply(status.body, status.code, status.phrase)


def _unsendable_about(
    submitted: SubmittedBatch, outcomes: Sequence[Outcome | None] | None, request: Request
) -> str:
    """What failed when a reply could not be made or encoded: the handler's output (of its
    type, for a plain request), never the client's doing."""
    if request.protocol == PLAIN and request.error is None:
        value, _ = _outcome(submitted, outcomes, request.start)
        return f"the handler's output of type {type(value).__name__} cannot be sent"
    return "the handler's output cannot be sent"


def _request_id(submitted: SubmittedBatch, idx: int) -> str | None:
    view = submitted.target
    return view.get_request_id(idx) if view is not None else None


def _outcome(
    submitted: SubmittedBatch, outcomes: Sequence[Outcome | None] | None, item: int
) -> tuple[Any, BaseException | None]:
    if submitted.refused is not None or outcomes is None:
        # Without a batch nothing was submitted (every request was a malformed protocol
        # body, which has no items), so only a refusal leads here.
        return None, submitted.refused or PipelineStalledError("the batch was not submitted")
    outcome = outcomes[item]
    if outcome is None:  # only after Batch.settle: never, unless a bug
        return None, PipelineClosedError("the request was not answered")
    return outcome


def _is_bad_input(batch: Batch | None, item: int) -> bool:
    """Failed alone in a first stage that has served requests since load: its own input
    (``ts_microbatch.core.isolation``, "The first stage's record"), in any batch as alone."""
    if batch is None:
        return False
    failure = batch.failure(item)
    return (
        failure is not None
        and failure.isolated
        and failure.stage_index == 0
        and batch.first_stage_served
    )


def encode(answer: Any) -> bytes | bytearray:
    """The response body TorchServe's ``create_predict_response`` makes of ``answer``.

    Raises:
        Exception: whatever that conversion raises (UnicodeEncodeError, ValueError,
            RecursionError, TypeError, a pickling error); the caller fails that request.
    """
    # The order is TorchServe's: bytes before str, a tensor before JSON.
    if isinstance(answer, (bytes, bytearray)):
        return answer
    if isinstance(answer, str):
        return answer.encode("utf-8")
    if not isinstance(answer, _JSON_TYPES) and is_tensor(answer):
        import torch  # loaded: is_tensor said so

        buffer = io.BytesIO()
        torch.save(answer, buffer)
        return buffer.getvalue()
    return json.dumps(answer, indent=2).encode("utf-8")


def sent_as_returned() -> bool:
    """True when what ``handle()`` returns goes straight to TorchServe's serializer: the
    callers between here and ``Service.predict`` are this package's (``MicroBatching``, the
    mixin's ``handle``) and at most the body envelope, and no streaming stopping criteria
    read the answers."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == "ts_microbatch" or module.startswith("ts_microbatch."):
            frame = frame.f_back
            continue
        if module == _ENVELOPE_MODULE and frame.f_code.co_name == "handle":
            envelope = type(frame.f_locals.get("self"))
            if f"{envelope.__module__}.{envelope.__qualname__}" not in _PASS_THROUGH_ENVELOPES:
                return False
            frame = frame.f_back
            continue
        if (module, frame.f_code.co_name) in _SERIALIZERS:
            context = getattr(frame.f_locals.get("self"), "context", None)
            return not getattr(context, "stopping_criteria", None)
        return False
    return False
