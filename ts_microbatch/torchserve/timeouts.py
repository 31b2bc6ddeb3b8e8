"""How long a batch may take: the model's ``responseTimeout``, as far as a worker knows it.

A batch must be answered before TorchServe's ``responseTimeout``, or the frontend kills the
worker and every request of the batch fails. ``timeout_s: null`` therefore runs with 90% of
it (the frontend's clock starts when it sends the batch, a little before ``handle()`` is
called, so the margin keeps the batch's own answers, 504 for what is late, ahead of the
kill). The deadline runs on ``_clock`` from when ``handle`` is entered (``left_s``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
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


# The deadline's clock, read where the timeout starts and where it is waited on (a test
# moves it to stand for a slow cut).
_clock = time.monotonic


def clock_s() -> float:
    """Now, on the deadline's clock: where a batch's ``timeout_s`` starts."""
    return _clock()


def left_s(timeout_s: float, start_s: float) -> float:
    """What is left of ``timeout_s`` since ``start_s``: the time spent reading the requests
    and cutting the batch (a header reader, a handler's ``item_shape`` or ``item_length``)
    is the batch's, so a slow cut cannot push its answer past the frontend's
    ``responseTimeout`` (issue 40: a 1 MiB body read for 10 s, then ``timeout_s`` on top)."""
    return max(0.0, timeout_s - (_clock() - start_s))
