"""Exceptions raised by ts_microbatch.

The tree::

    MicroBatchingError                      base of everything raised here
    ├── ConfigError (ValueError)            bad micro_batching config; names the key
    ├── PipelineClosedError (RuntimeError)  work submitted to, or stranded by, a shut-down pipeline
    ├── PipelineStalledError (RuntimeError) a stage's threads are all stuck in calls that timed out
    ├── StageOutputError                    a stage returned the wrong number of outputs
    ├── WarmupError (RuntimeError)          warm-up at load failed; the worker is not ready
    ├── RequestTimeoutError (TimeoutError)  a request was not answered within ``timeout_s``
    ├── SiblingFailedError                  not run: another item of its request failed
    ├── SharedFailureError                  a stage failed for several requests at once
    └── RequestError                        one request is bad on its own; carries an HTTP status
        ├── InvalidInputError               400: the input cannot be decoded
        └── PayloadTooLargeError            413: the input is over a configured size limit

HTTP status codes are attached to exceptions only as data; they are turned into
responses at the handler boundary (``ts_microbatch.torchserve.status``).
"""

from __future__ import annotations


class MicroBatchingError(Exception):
    """Base class of the errors raised by ts_microbatch."""


class ConfigError(MicroBatchingError, ValueError):
    """A micro-batching setting is missing, unknown, of the wrong type or out of range."""


class PipelineClosedError(MicroBatchingError, RuntimeError):
    """The pipeline was shut down before the work could be done."""


class PipelineStalledError(MicroBatchingError, RuntimeError):
    """Every thread of a stage is stuck in a call whose requests timed out; new work is refused."""


class StageOutputError(MicroBatchingError):
    """A stage returned a number of outputs different from its number of inputs."""


class WarmupError(MicroBatchingError, RuntimeError):
    """A warm-up run at load failed, so the model is not ready to serve."""


class RequestTimeoutError(MicroBatchingError, TimeoutError):
    """A request was not answered within the configured timeout."""


class SiblingFailedError(MicroBatchingError):
    """Not run: another item of the same request failed, so the request has failed (its
    ``__cause__`` is that item's error)."""


class SharedFailureError(MicroBatchingError):
    """A stage failed for a micro-batch of several requests, and the failure is none of
    theirs alone (the stage judged broken, isolation disabled, a stop): its message is the
    server's words, its ``__cause__`` the stage's exception, which goes to the log and never
    into an answer, since that exception may be another request's doing and text."""


class RequestError(MicroBatchingError):
    """A single request is invalid; only that request fails."""

    status_code: int = 400

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        if status_code is not None:
            self.status_code = status_code


class InvalidInputError(RequestError):
    """The request body cannot be decoded (HTTP 400)."""

    status_code = 400


class PayloadTooLargeError(RequestError):
    """The request body is over a configured limit, such as an image's pixel count (HTTP 413)."""

    status_code = 413
