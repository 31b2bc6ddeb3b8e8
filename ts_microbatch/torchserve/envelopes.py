"""What wraps or replaces micro-batching in a TorchServe worker: TorchServe's request
envelopes, which ``MicroBatching`` must refuse when they are KServe's, the handler's own
``handle``, which ``enabled: false`` runs instead of the pipeline, upstream's profiler,
describe and explain paths, which run instead of it for those calls, and the
``HandlerTime`` metric around it."""

from __future__ import annotations

import inspect
import os
import time
from typing import Any

from ..core.config import YAML_SECTION
from ..core.errors import ConfigError

# TorchServe's own KServe envelopes read only the first request of a frontend batch and
# answer once, so with batchSize > 1 every request gets 503 (pytorch/serve#2158, #1302);
# ts_microbatch unpacks those protocols itself (ts_microbatch.torchserve.kserve).
_BROKEN_ENVELOPES = ("kserve", "kservev2")


def torchserve_envelope() -> str | None:
    """The request envelope TorchServe's model loader is wrapping this handler in, if any.

    TorchServe 0.12 hands the envelope's name (``service_envelope``, or the
    ``TS_SERVICE_ENVELOPE`` variable with ``enable_envvars_config=true``) to nothing the
    handler can see; it is a local of ``TsModelLoader.load``, which is on the stack while
    the handler is constructed and initialized. None elsewhere (tests, the tuner).
    """
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "load" and frame.f_globals.get("__name__") == "ts.model_loader":
            envelope = frame.f_locals.get("envelope")
            return envelope if isinstance(envelope, str) else None
        frame = frame.f_back
    return None


def check_envelope() -> None:
    """Raises ConfigError if TorchServe's KServe envelope would wrap this handler."""
    envelope = torchserve_envelope()
    if envelope in _BROKEN_ENVELOPES:
        raise ConfigError(
            f"service_envelope={envelope}: TorchServe's KServe envelope reads only the first "
            "request of a batch (pytorch/serve#2158), so every other request would get 503. "
            "ts_microbatch reads KServe v1 and v2 bodies itself: remove service_envelope from "
            "config.properties, and TS_SERVICE_ENVELOPE from the environment (or keep "
            "enable_envvars_config=false)."
        )


def plain_handle(handler: Any) -> Any:
    """``handler``'s ``handle`` as without micro-batching: the first in its class's MRO that
    is not micro-batching's own (``BaseHandler.handle``), bound to it."""
    for cls in type(handler).__mro__:
        handle = cls.__dict__.get("handle")
        if handle is not None and not getattr(handle, "micro_batched", False):
            return handle.__get__(handler, type(handler))
    raise ConfigError(
        f"{YAML_SECTION}.enabled: got false, but {type(handler).__name__} has no handle() "
        "of its own to run without micro-batching"
    )


def upstream_paths(handler: Any, data: Any, context: Any) -> list[Any] | None:
    """Upstream's profiler, describe and explain paths; None for plain inference."""
    handler.context = context
    if os.environ.get("ENABLE_TORCH_PROFILER"):
        output, _ = handler._infer_with_profiler(data=data)
        return output  # type: ignore[no-any-return]
    if handler._is_describe():
        return [handler.describe_handle()]
    if handler._is_explain():
        return handler.explain_handle(handler.preprocess(data), data)  # type: ignore[no-any-return]
    return None


def add_handler_time(context: Any, start: float) -> None:
    """TorchServe's HandlerTime metric: ms since ``start``."""
    metrics = getattr(context, "metrics", None)
    if metrics is not None:
        metrics.add_time("HandlerTime", round((time.time() - start) * 1000, 2), None, "ms")


async def returning(value: Any) -> Any:
    """``value``, from a coroutine: what the asynchronous worker awaits."""
    return value
