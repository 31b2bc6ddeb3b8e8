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
from typing import Any, NamedTuple

from ..core.batch import Batch
from ..core.errors import PipelineClosedError, PipelineStalledError, SiblingFailedError
from ..core.metrics import PipelineObserver
from . import _wire, kserve
from .context import BatchContext
from .status import error_status


@dataclass
class SubmittedBatch:
    """A batch as submitted: where statuses go, its requests, and the pipeline's batch."""

    target: BatchContext | None  # the context statuses are set on; None when not aligned
    view: BatchContext | None
    requests: list[kserve.Request]
    batch: Batch | None = None
    refused: PipelineStalledError | None = None  # answered unrun: 503
    # The answers go to TorchServe's serializer as returned: answer with their bytes.
    wire: bool = False


class Reply(NamedTuple):
    """What one request gets: its body (an object, before the bytes) and its status."""

    body: Any
    status: int = 200
    phrase: str = ""


def answer_batch(submitted: SubmittedBatch, observer: PipelineObserver) -> list[Any]:
    """One answer per request of ``submitted``, in order; statuses set, errors observed.

    One pass per request: its outcome becomes a ``Reply`` (``_reply``: the status table and
    the protocol's regrouping are consulted), the reply becomes the bytes TorchServe sends
    (``_encoded``), and the status goes on the context (``_deliver``). Whatever any step
    raises for a request fails that request alone with a 500 (the handler's output cannot
    be sent). Called by ``handle()`` itself, so that the answers are returned as bytes only
    when TorchServe's serializer is the next to read them (``_wire.sent_as_returned``).
    """
    submitted.wire = _wire.sent_as_returned()
    answers = []
    for idx, request in enumerate(submitted.requests):
        request_id = _request_id(submitted, idx)
        try:  # the per-request boundary
            reply = _reply(submitted, request, request_id)
            answer = _encoded(submitted, reply.body)
        except Exception as exc:
            status = error_status(exc, request_id, about=_unsendable_about(submitted, request))
            body = (
                status.body
                if request.protocol == kserve.PLAIN
                else {"error": status.body["message"]}
            )
            reply = Reply(body, status.code, status.phrase)
            answer = _encoded(submitted, reply.body)
        _deliver(submitted, idx, reply, observer)
        answers.append(answer)
    return answers


def _reply(submitted: SubmittedBatch, request: kserve.Request, request_id: str | None) -> Reply:
    """A request's reply from its outcome: an unread body's error, its item's output or
    error (plain), or its items' outcomes regrouped in its protocol's shape."""
    if request.protocol == kserve.PLAIN:
        if request.error is not None:
            return _error_reply(request.error, request_id, request, bad_input=False)
        value, error = _outcome(submitted, request.start)
        if error is None:
            return Reply(value)
        bad_input = _is_bad_input(submitted.batch, request.start)
        return _error_reply(error, request_id, request, bad_input=bad_input)
    outputs: list[Any] = []
    errors: list[tuple[int, str, str] | None] = []
    # The first error in item order is the request's (regroup): the pipeline runs every
    # item below a failed one and none above it (SiblingFailedError), so that is the lowest
    # failing item whatever the timing (ts_microbatch.core.outcomes, skip_items_above).
    sibling = None
    for item in range(request.start, request.start + request.count):
        value, error = _outcome(submitted, item)
        outputs.append(value)
        if isinstance(error, SiblingFailedError):
            sibling, error = error, None
        if error is None:
            errors.append(None)
            continue
        bad_input = _is_bad_input(submitted.batch, item)
        status = _error_reply(error, request_id, request, bad_input=bad_input)
        errors.append((status.status, status.phrase, status.body["message"]))
    if sibling is not None and not any(errors):  # never without the failed one; if so, 500
        return _error_reply(sibling, request_id, request, bad_input=False)
    if request.protocol == kserve.V2 and request.request_id is None:
        request.request_id = request_id  # None when rows are not requests
    model = (getattr(submitted.view, "manifest", None) or {}).get("model", {})
    answer = kserve.regroup(
        request, outputs, errors, model.get("modelName"), model.get("modelVersion")
    )
    return Reply(answer.body, answer.status or 200, answer.phrase)


def _error_reply(
    error: BaseException, request_id: str | None, request: kserve.Request, *, bad_input: bool
) -> Reply:
    status = error_status(error, request_id, bad_input=bad_input, body_size=request.body_size)
    return Reply(status.body, status.code, status.phrase)


def _unsendable_about(submitted: SubmittedBatch, request: kserve.Request) -> str:
    """What failed when a reply could not be made or encoded: the handler's output (of its
    type, for a plain request), never the client's doing."""
    if request.protocol == kserve.PLAIN and request.error is None:
        value, _ = _outcome(submitted, request.start)
        return f"the handler's output of type {type(value).__name__} cannot be sent"
    return "the handler's output cannot be sent"


def _encoded(submitted: SubmittedBatch, body: Any) -> Any:
    """``body`` as TorchServe sends it (``ts_microbatch.torchserve._wire``): its bytes when
    they go to TorchServe's serializer as returned, else itself, once they are known to
    exist.

    Raises:
        Exception: whatever TorchServe's conversion raises for ``body``.
    """
    encoded = _wire.encode(body)
    return encoded if submitted.wire else body


def _deliver(submitted: SubmittedBatch, idx: int, reply: Reply, observer: PipelineObserver) -> None:
    """A reply's status onto the request's context (when rows are requests), and its error
    to the metrics."""
    if reply.status == 200:
        return
    if submitted.target is not None:
        submitted.target.set_response_status(reply.status, reply.phrase, idx)
    observer.on_request_error(reply.status)


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
