"""How each request of a batch is answered, and with which status.

A plain request gets its item's output; a KServe v1 or v2 request one body for all its
instances, in its protocol's shape (``ts_microbatch.torchserve.kserve``). A request that failed
gets a JSON error body and its own status on the batch's context, when the batch has one
row per request (a request envelope such as TorchServe's ``json`` may have flattened
several instances per request: an index would then name another request).

Which status (``ts_microbatch.torchserve.status`` maps the exception): a ``RequestError`` or
``PredictionException`` carries its own; any other error is a 500, except that an error in
the first stage that bisection pinned on one request alone, once that stage has served a
request since load, is that request's input: 400 with a message that says what the client
sent. So a request gets the same status alone and in any batch (the rule is
``ts_microbatch.core.isolation``'s). A body that could not be read (``kserve.unpack``) is a
400 and never enters the pipeline.

What a handler returned is read here too, one guard per request: each answer is turned
into the bytes TorchServe's own serializer would send (``ts_microbatch.torchserve._wire``), and an
output that its protocol cannot encode, or that serializer cannot (a str with a lone
surrogate, an int of 5,000 digits, a tensor ``torch.save`` cannot pickle), fails its own
request with a 500 naming its type; TorchServe would otherwise answer the whole batch 503,
or lose it to an exception ``Service.predict`` does not catch. Those bytes are the answers
when TorchServe sends them as returned, so each answer is encoded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.batch import Batch
from ..core.errors import PipelineClosedError, PipelineStalledError
from ..core.metrics import PipelineObserver
from . import _wire, kserve
from .context import BatchContext
from .status import ErrorStatus, error_status


@dataclass
class SubmittedBatch:
    """A batch as submitted: where statuses go, its requests, and the pipeline's batch."""

    target: BatchContext | None  # the context statuses are set on; None when not aligned
    view: BatchContext | None
    requests: list[kserve.Request]
    batch: Batch | None = None
    refused: PipelineStalledError | None = None
    # The answers go to TorchServe's serializer as returned: answer with their bytes.
    wire: bool = False


def answer_batch(submitted: SubmittedBatch, observer: PipelineObserver) -> list[Any]:
    """One answer per request of ``submitted``, in order; statuses set, errors observed.

    Called by ``handle()`` itself, so that the answers are returned as bytes only when
    TorchServe's serializer is the next to read them (``_wire.sent_as_returned``).
    """
    submitted.wire = _wire.sent_as_returned()
    answers = []
    for idx, request in enumerate(submitted.requests):
        if request.protocol == kserve.PLAIN and request.error is not None:
            answers.append(_unread_answer(submitted, idx, request.error, observer))
        elif request.protocol == kserve.PLAIN:
            answers.append(_plain_answer(submitted, idx, request.start, observer))
        else:
            answers.append(_protocol_answer(submitted, idx, request, observer))
    return answers


def _unread_answer(
    submitted: SubmittedBatch, idx: int, error: BaseException, observer: PipelineObserver
) -> Any:
    """A plain body that could not be read (``kserve.unpack``): it has no item."""
    body_size = submitted.requests[idx].body_size
    status = error_status(error, _request_id(submitted, idx), body_size=body_size)
    _report_status(submitted, idx, status.code, status.phrase, observer)
    return _sendable(submitted, status.body)


def _request_id(submitted: SubmittedBatch, idx: int) -> str | None:
    view = submitted.target
    return view.get_request_id(idx) if view is not None else None


def _outcome(submitted: SubmittedBatch, item: int) -> tuple[Any, BaseException | None]:
    if submitted.refused is not None or submitted.batch is None:
        # Without a batch nothing was submitted (every request was a malformed protocol
        # body, which has no items), so only a refusal leads here.
        return None, submitted.refused or PipelineStalledError("the batch was not submitted")
    outcome = submitted.batch.outcome(item)
    if outcome is None:  # only after Batch.wait or expire: never, unless a bug
        return None, PipelineClosedError("the request was not answered")
    return outcome


def _status(submitted: SubmittedBatch, idx: int, item: int, exc: BaseException) -> Any:
    request_id = _request_id(submitted, idx)
    bad_input = _is_bad_input(submitted.batch, item)
    body_size = submitted.requests[idx].body_size
    return error_status(exc, request_id, bad_input=bad_input, body_size=body_size)


def _plain_answer(
    submitted: SubmittedBatch, idx: int, item: int, observer: PipelineObserver
) -> Any:
    output, exc = _outcome(submitted, item)
    if exc is None:
        try:
            return _sendable(submitted, output)
        except Exception as unsendable:  # the per-request boundary
            status = _unsendable(submitted, idx, unsendable, type(output).__name__)
    else:
        status = _status(submitted, idx, item, exc)
    _report_status(submitted, idx, status.code, status.phrase, observer)
    return _sendable(submitted, status.body)


def _sendable(submitted: SubmittedBatch, answer: Any) -> Any:
    """``answer`` as TorchServe sends it (``ts_microbatch.torchserve._wire``): its bytes when
    they go to TorchServe's serializer as returned, else itself, once they are known to exist."""
    encoded = _wire.encode(answer)
    return encoded if submitted.wire else answer


def _unsendable(
    submitted: SubmittedBatch, idx: int, exc: BaseException, output_type: str | None = None
) -> ErrorStatus:
    """A 500 for an output that cannot be sent: the handler's doing, not the client's."""
    of_type = f" of type {output_type}" if output_type is not None else ""
    about = f"the handler's output{of_type} cannot be sent"
    return error_status(exc, _request_id(submitted, idx), about=about)


def _protocol_answer(
    submitted: SubmittedBatch, idx: int, request: kserve.Request, observer: PipelineObserver
) -> Any:
    outputs: list[Any] = []
    errors: list[tuple[int, str, str] | None] = []
    for item in range(request.start, request.start + request.count):
        output, exc = _outcome(submitted, item)
        outputs.append(output)
        if exc is None:
            errors.append(None)
        else:
            status = _status(submitted, idx, item, exc)
            errors.append((status.code, status.phrase, status.body["message"]))
    if request.protocol == kserve.V2 and request.request_id is None:
        request.request_id = _request_id(submitted, idx)  # None when rows are not requests
    model = (getattr(submitted.view, "manifest", None) or {}).get("model", {})
    try:
        answer = kserve.regroup(
            request, outputs, errors, model.get("modelName"), model.get("modelVersion")
        )
        body = _sendable(submitted, answer.body)
    except Exception as exc:  # the per-request boundary
        status = _unsendable(submitted, idx, exc)
        answer = kserve.Answer({"error": status.body["message"]}, 500, status.phrase)
        body = _sendable(submitted, answer.body)
    if answer.status is not None:
        _report_status(submitted, idx, answer.status, answer.phrase, observer)
    return body


def _report_status(
    submitted: SubmittedBatch, idx: int, code: int, phrase: str, observer: PipelineObserver
) -> None:
    if submitted.target is not None:
        submitted.target.set_response_status(code, phrase, idx)
    observer.on_request_error(code)


def _is_bad_input(batch: Batch | None, idx: int) -> bool:
    """Failed alone in a first stage that has served requests since load: its own input
    (``ts_microbatch.core.isolation``, "The first stage's record"), in any batch as alone."""
    if batch is None:
        return False
    failure = batch.failure(idx)
    return (
        failure is not None
        and failure.isolated
        and failure.stage_index == 0
        and batch.first_stage_served
    )
