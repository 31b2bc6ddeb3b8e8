"""How long a batch may take: the model's ``responseTimeout``, as far as a worker knows it.

A batch must be answered before TorchServe's ``responseTimeout``, or the frontend kills the
worker and every request of the batch fails. ``timeout_s: null`` therefore runs with 90% of
it (the frontend's clock starts when it sends the batch, a little before ``handle()`` is
called, so the margin keeps the batch's own answers, 504 for what is late, ahead of the
kill). The deadline (``Deadline``) runs on ``clock`` from when ``handle`` is entered.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# TorchServe's default_response_timeout (config.properties), in force when model-config.yaml
# sets no responseTimeout.
DEFAULT_RESPONSE_TIMEOUT_S = 120
RESPONSE_TIMEOUT_SHARE = 0.9


def response_timeout_s(model_yaml_config: Mapping[str, Any] | None) -> float:
    """TorchServe's responseTimeout for the model, as far as the worker can know it:
    model-config.yaml's ``responseTimeout`` (which wins over the register API's
    ``response_timeout`` in the frontend too), else TorchServe's default, 120 s. A value
    given only to the register API or as ``default_response_timeout`` never reaches the
    worker: repeat it in model-config.yaml, or set ``timeout_s``."""
    value = (model_yaml_config or {}).get("responseTimeout")
    # As the frontend: a value that is not > 0 is not set.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return DEFAULT_RESPONSE_TIMEOUT_S
    return float(value)


def default_timeout_s(model_yaml_config: Mapping[str, Any] | None) -> float:
    """What ``timeout_s: null`` means: 90% of the model's responseTimeout."""
    return round(RESPONSE_TIMEOUT_SHARE * response_timeout_s(model_yaml_config), 3)


def batch_deadline(
    timeout_s: float | None, model_yaml_config: Mapping[str, Any] | None, start_s: float
) -> Deadline:
    """A batch's deadline from ``start_s``: ``timeout_s``, or when it is null 90% of
    TorchServe's responseTimeout for the model (its default when no context says), so
    ``handle()`` answers before the frontend gives up on the worker, however the handler was
    built."""
    if timeout_s is None:
        timeout_s = default_timeout_s(model_yaml_config)
    return Deadline(timeout_s, start_s)


# The deadline's clock, read where the timeout starts and where it is waited on (a test
# moves it to stand for a slow cut).
clock = time.monotonic


@dataclass(frozen=True)
class Deadline:
    """A batch's ``timeout_s``, counted on ``clock`` from ``start_s``, when ``handle`` was
    entered."""

    timeout_s: float
    start_s: float

    def left_s(self) -> float:
        """What is left of ``timeout_s``: the time spent reading the requests and cutting
        the batch (a header reader, a handler's ``item_shape`` or ``item_length``) is the
        batch's, so a slow cut cannot push its answer past the frontend's
        ``responseTimeout`` (issue 40: a 1 MiB body read for 10 s, then ``timeout_s`` on
        top)."""
        return max(0.0, self.timeout_s - (clock() - self.start_s))

    def timed_out(self) -> float | None:
        """``timeout_s`` once none of it is left, else None: what the pipeline's cut asks
        before any stage starts the batch."""
        return self.timeout_s if self.left_s() <= 0 else None
