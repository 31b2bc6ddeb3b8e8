"""How long a batch may take: the model's ``responseTimeout``, as far as a worker knows it.

A batch must be answered before TorchServe's ``responseTimeout``, or the frontend kills the
worker and every request of the batch fails. ``timeout_s: null`` therefore runs with 90% of
it (the frontend's clock starts when it sends the batch, a little before ``handle()`` is
called, so the margin keeps the batch's own answers, 504 for what is late, ahead of the
kill).
"""

from __future__ import annotations

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
