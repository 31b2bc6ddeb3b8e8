"""Maps an exception to the HTTP status of the one request it failed.

This is the handler boundary: the pipeline deals in exceptions, TorchServe in status codes.
"""

from __future__ import annotations

import binascii
import http
import json
import re
from typing import Any, NamedTuple

from ..core.errors import (
    PipelineClosedError,
    PipelineStalledError,
    RequestError,
    RequestTimeoutError,
    SharedFailureError,
)

# Errors raised by common decoders that mean "this input is bad", named by qualified class
# name so that the core needs neither PIL nor torch to recognise them.
_INPUT_ERRORS_BY_NAME = {
    "PIL.UnidentifiedImageError": 400,
    "PIL.Image.DecompressionBombError": 413,
}
_INPUT_ERROR_TYPES: tuple[type[BaseException], ...] = (
    binascii.Error,  # bad base64
    UnicodeDecodeError,
    json.JSONDecodeError,
)
_OOM_NAMES = {"torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"}
# "<_io.BytesIO object at 0x7ff3...>": what PIL names the body it could not read; any repr
# with an address (a local class's "<f.<locals>.S object at 0x...>", PIL's "<PIL.Jpeg...
# image mode=CMYK size=4x4 at 0x...>").
_OBJECT_REPR = re.compile(r"<(?:[^<>]|<[^<>]*>)*? at 0x[0-9a-fA-F]+>")


class ErrorStatus(NamedTuple):
    """The status and JSON body of a failed request."""

    code: int
    phrase: str
    body: dict[str, Any]


def _qualified_names(exc: BaseException) -> set[str]:
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__}


def is_input_error(exc: BaseException) -> bool:
    """Whether ``exc`` means its request's input is bad (a 4xx): what the core's isolation
    asks, so a decoder error or a 4xx PredictionException never counts towards a broken
    stage."""
    return status_code_for(exc) < 500


def status_code_for(exc: BaseException) -> int:
    """The HTTP status code for a request that failed with ``exc``."""
    if isinstance(exc, RequestError):
        return exc.status_code
    error_code = getattr(exc, "error_code", None)  # ts.utils.util.PredictionException
    if type(exc).__name__ == "PredictionException" and isinstance(error_code, int):
        return error_code
    if isinstance(exc, SharedFailureError):  # its cause's server status: never a 4xx,
        cause = exc.__cause__  # which would be another request's input
        code = 500 if cause is None else status_code_for(cause)
        return code if code >= 500 else 500
    if isinstance(exc, RequestTimeoutError):
        return 504
    if isinstance(exc, (PipelineClosedError, PipelineStalledError)):
        return 503
    if isinstance(exc, MemoryError):
        return 507
    names = _qualified_names(exc)
    if names & _OOM_NAMES or (
        isinstance(exc, RuntimeError) and "out of memory" in exception_text(exc)
    ):
        return 507
    for name in names:
        if name in _INPUT_ERRORS_BY_NAME:
            return _INPUT_ERRORS_BY_NAME[name]
    if isinstance(exc, _INPUT_ERROR_TYPES):
        return 400
    return 500


def error_status(
    exc: BaseException,
    request_id: str | None = None,
    *,
    bad_input: bool = False,
    about: str | None = None,
    body_size: int | None = None,
) -> ErrorStatus:
    """The status, reason phrase and JSON body for a request that failed with ``exc``.

    Args:
        bad_input: the failure is known to be this request's input (see
            ``ts_microbatch.torchserve.answers``), so an error that would be a 500 is a 400.
        about: what failed, when it is the server's doing whatever the type of ``exc``
            (a UnicodeDecodeError sending the handler's output is no bad input): a 500,
            with the message "<about>: <type>: <message>".
        body_size: the request body's size, when known: a 4xx message says what the
            client sent (``client_message``).
    """
    code = 500 if about is not None else status_code_for(exc)
    if bad_input and code == 500:
        code = 400
    message = exception_text(exc) or type(exc).__name__
    if about is not None:
        message = f"{about}: {type(exc).__name__}: {message}"
    elif 400 <= code < 500:
        message = client_message(exc, message, body_size)
    body: dict[str, Any] = {"code": code, "type": type(exc).__name__, "message": message}
    if request_id is not None:
        body["request_id"] = request_id
    return ErrorStatus(code, reason_phrase(code), body)


def client_message(exc: BaseException, message: str, body_size: int | None) -> str:
    """A 4xx message that says what the client sent: a decoder's errors name the body it
    could not read by an object's repr ("cannot identify image file <_io.BytesIO object at
    0x7ff3...>"), which tells the client nothing and differs on every call."""
    names = _qualified_names(exc)
    size = f" ({body_size} bytes)" if body_size is not None else ""
    if body_size == 0 and (names & set(_INPUT_ERRORS_BY_NAME) or isinstance(exc, OSError)):
        return "the request body is empty: send an image"
    if "PIL.UnidentifiedImageError" in names:
        return f"the request body{size} is not an image in a format the server can read"
    if isinstance(exc, OSError) and "truncated" in message:
        return f"the image{size} is truncated: {_OBJECT_REPR.sub('the request body', message)}"
    return _OBJECT_REPR.sub("the request body", message)


def reason_phrase(code: int) -> str:
    """The standard reason phrase of an HTTP status code; "Error" for a code without one."""
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return "Error"


def exception_text(exc: BaseException) -> str:
    """The exception's message ("" when it has none or cannot say): whatever reads an
    exception's text goes through here, as a handler's exception may raise anything from
    its ``__str__``, and reading it must not fail the batch's other requests."""
    try:
        is_prediction = type(exc).__name__ == "PredictionException"
        message = getattr(exc, "message", None) if is_prediction else None
        return str(message if message is not None else exc)
    except Exception:  # the exception is the handler's: anything may happen in its __str__
        return ""
