"""The bytes TorchServe sends for an answer, made where a failure is still one request's.

TorchServe's ``create_predict_response`` (``ts/protocol/otf_message_handler.py``) turns
each answer ``handle()`` returned into a response body: bytes and bytearrays as they are, a
str as UTF-8, a tensor through ``torch.save``, anything else ``json.dumps(answer,
indent=2)`` as UTF-8. It does so after ``handle()`` returned, for the whole batch, and
catches only TypeError (then 503 for every request): a str with a lone surrogate (a client
can send one in JSON, a text handler echoes it), an int of more than 4,300 digits, a
circular reference or a tensor ``torch.save`` cannot pickle escapes ``Service.predict``,
and no request of the batch is answered.

``encode`` does the same conversion inside the per-request guard
(``ts_microbatch.torchserve.answers``). When TorchServe's serializer is the next to see
``handle()``'s answers (``sent_as_returned``), they are returned as those bytes, which it
sends unchanged: the body is byte for byte what it would have made, and the content type
is the context's (``get_response_content_type``), which never depended on the answer's
type. Anywhere else (a test, a handler that wraps ``handle()``, TorchServe's ``json``
envelope, which dumps the answers itself) the answers stay objects, encoded once only to
find those that cannot be sent.
"""

from __future__ import annotations

import io
import json
import sys
from types import FrameType
from typing import Any

from ..core._types import is_tensor

# The frames that serialize what the handler's entry point returned (sync and async workers).
_SERIALIZERS = {("ts.service", "predict"), ("ts.async_service", "predict")}
# TorchServe's envelopes run their handle() in this module; only the body envelope returns
# the answers unchanged (format_output is the identity).
_ENVELOPE_MODULE = "ts.torch_handler.request_envelope.base"
_PASS_THROUGH_ENVELOPES = {"ts.torch_handler.request_envelope.body.BodyEnvelope"}


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
    if is_tensor(answer):
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
